#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "data/chat.h"
#include "fixtures.h"

namespace loom {
namespace {

using nlohmann::ordered_json;

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load("data/qwen3-tokenizer");
  return t;
}

// Every conversation of chat_reference.py: transformers' rendering (with and without the
// generation prompt) and slime's tokens and loss mask, exactly.
TEST(Chat, MatchesTransformersAndSlime) {
  const Qwen3LossMask masker(qwen3());
  EXPECT_EQ(masker.system_message_length(), 0u);
  EXPECT_EQ(masker.generation_header_length(), 3u);
  const std::vector<std::string> lines = test::read_lines_gz("data/chat_cases.jsonl");
  ASSERT_GE(lines.size(), 150u);
  size_t render_mismatches = 0, token_mismatches = 0, supervised = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const ordered_json c = ordered_json::parse(lines[i]);
    const ParsedConversation parsed = chat_parse_conversation(c["conversation"]);
    ASSERT_EQ(parsed.problem, ChatProblem::none) << "line " << i + 1 << ": " << parsed.detail;
    const Conversation& conv = parsed.conversation;
    const std::string rendered = chat_render_qwen3(conv.messages, conv.tools);
    const std::string rendered_gen = chat_render_qwen3(conv.messages, conv.tools, true);
    if ((rendered != c["rendered"] || rendered_gen != c["rendered_gen"]) && ++render_mismatches <= 5)
      ADD_FAILURE() << "line " << i + 1 << " renders\n"
                    << rendered << "\nexpected\n"
                    << c["rendered"].get<std::string>();
    const TokenizedConversation t = masker.tokenize(conv);
    ASSERT_EQ(t.tokens.size(), t.loss_mask.size());
    if ((t.tokens != c["tokens"].get<std::vector<int32_t>>() ||
         t.loss_mask != c["loss_mask"].get<std::vector<uint8_t>>()) &&
        ++token_mismatches <= 5)
      ADD_FAILURE() << "line " << i + 1 << " tokens or loss mask differ";
    for (uint8_t m : t.loss_mask) supervised += m;
  }
  EXPECT_EQ(render_mismatches, 0u);
  EXPECT_EQ(token_mismatches, 0u);
  EXPECT_GT(supervised, 1000u);
}

TEST(Chat, AssistantTokensAfterTheHeaderAreSupervised) {
  const Qwen3LossMask masker(qwen3());
  const ParsedConversation p = chat_parse_line(
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})");
  ASSERT_EQ(p.problem, ChatProblem::none);
  const TokenizedConversation t = masker.tokenize(p.conversation);
  // <|im_start|>user\nHi<|im_end|>\n  then  <|im_start|>assistant\n | <think>\n\n</think>\n\nYo<|im_end|>\n
  const std::string text = qwen3().decode(t.tokens);
  EXPECT_EQ(text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYo<|im_end|>\n");
  std::string supervised;
  for (size_t i = 0; i < t.tokens.size(); ++i)
    if (t.loss_mask[i]) supervised += qwen3().decode(std::vector<int32_t>{t.tokens[i]});
  EXPECT_EQ(supervised, "<think>\n\n</think>\n\nYo<|im_end|>\n");
}

TEST(Chat, BadLinesAreClassified) {
  EXPECT_EQ(chat_parse_line("{\"messages\": [\xFF]}").problem, ChatProblem::invalid_utf8);
  EXPECT_EQ(chat_parse_line("{\"messages\": [").problem, ChatProblem::malformed_json);
  EXPECT_EQ(chat_parse_line("[1, 2]").problem, ChatProblem::malformed_json);
  // A number too large for a double once escaped as nlohmann's out_of_range exception.
  const ParsedConversation overflow =
      chat_parse_line(R"({"messages": [{"role": "user", "content": "x"}], "n": 1e999})");
  EXPECT_EQ(overflow.problem, ChatProblem::malformed_json);
  EXPECT_NE(overflow.detail.find("number overflow"), std::string::npos) << overflow.detail;
  // A key written twice was once read as its last value.
  const ParsedConversation twice =
      chat_parse_line(R"({"messages": [{"role": "user", "content": "x", "content": "y"}]})");
  EXPECT_EQ(twice.problem, ChatProblem::malformed_json);
  EXPECT_NE(twice.detail.find("the key 'content' a second time"), std::string::npos) << twice.detail;
  EXPECT_EQ(chat_parse_line(R"({"messages": []})").problem, ChatProblem::empty_conversation);
  const ParsedConversation role = chat_parse_line(R"({"messages": [{"role": "robot", "content": "x"}]})");
  EXPECT_EQ(role.problem, ChatProblem::unknown_role);
  EXPECT_NE(role.detail.find("messages[0].role is \"robot\""), std::string::npos) << role.detail;
  EXPECT_EQ(chat_parse_line(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})").problem,
            ChatProblem::non_string_content);
  EXPECT_EQ(chat_parse_line(R"({"messages": [{"role": "assistant", "content": null}]})").problem,
            ChatProblem::non_string_content);
  EXPECT_EQ(
      chat_parse_line(
          R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": {}}}]}]})")
          .problem,
      ChatProblem::bad_tool_call);
  EXPECT_STREQ(chat_problem_name(ChatProblem::empty_conversation), "empty_conversation");
}

TEST(Chat, JsonDumpsLikePython) {
  const ordered_json v = ordered_json::parse(
      R"({"b": [1, 1.0, 1e16, 1e15, 0.0001, 1e-05, -2.5e-300, 123.456, true, null], "a": "é\"\\\n\u0001\u007f", "e": {}, "f": []})");
  EXPECT_EQ(json_dumps_python(v),
            "{\"b\": [1, 1.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, -2.5e-300, 123.456, true, null], "
            "\"a\": \"é\\\"\\\\\\n\\u0001\x7f\", \"e\": {}, \"f\": []}");
}

}  // namespace
}  // namespace loom
