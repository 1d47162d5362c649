// The Qwen3 chat template and the qwen3 loss mask (docs/numerics.md, "Data").
//
// chat_render_qwen3 renders what tokenizer_config.json's Jinja chat_template renders through
// transformers' apply_chat_template (checked by tests/data/chat_reference.py):
//   system  first: "<|im_start|>system\n{content}<|im_end|>\n" (or the tools block below);
//           later: rendered like a user message;
//   user    "<|im_start|>user\n{content}<|im_end|>\n";
//   assistant  reasoning from reasoning_content (transformers 5 also takes "thinking" or
//           "reasoning"), else split from content on "</think>"; after the last real user
//           query, the final message and any with reasoning get
//           "<|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}", the others
//           "<|im_start|>assistant\n{content}"; then each tool call as
//           "<tool_call>\n{"name": "N", "arguments": A}\n</tool_call>" (newline-separated),
//           then "<|im_end|>\n";
//   tool    consecutive tool messages share one "<|im_start|>user" turn, each as
//           "\n<tool_response>\n{content}\n</tool_response>";
//   tools   a non-empty tools list opens with the "# Tools" system block listing each tool
//           as Python's json.dumps(tool, ensure_ascii=False) writes it.
//
// chat_tokenize_qwen3 is slime's gen_multi_turn_loss_mask_qwen3: with the dummy user message
// P = "FOR CALCULATING LOSS MASK ONLY", message 0 is rendered as [msg, P] (with the tools)
// and P's tokens cut from the end, message i > 0 as [P, msg] with P's tokens cut from the
// front; a run of consecutive tool messages is rendered as one group. An assistant
// message's tokens get loss mask 0 for the "<|im_start|>assistant\n" header (3 tokens) and
// 1 for the rest (think block, content, tool calls, "<|im_end|>", "\n"); every other
// message gets 0, and so does an assistant message whose step_loss_mask is not 1.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace loom {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  std::optional<std::string> reasoning;  // reasoning_content (or thinking / reasoning)
  nlohmann::ordered_json tool_calls;     // null or an array of {"function": {name, arguments}}
  bool step_loss_mask = true;            // false: the message gets loss mask 0 throughout
};

struct Conversation {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;  // null or an array of tool schemas
};

// Why a line is not a usable conversation (`loom data build` counts each kind).
enum class ChatProblem {
  none,
  invalid_utf8,         // the line is not valid UTF-8
  malformed_json,       // not JSON, or not an object with a "messages" array
  empty_conversation,   // "messages" is empty
  unknown_role,         // a role other than system, user, assistant, tool
  non_string_content,   // content (or reasoning) that is not a string
  bad_tool_call,        // a tool call without a string name and arguments, or bad "tools"
  tools_not_in_format,  // tool use the chat format cannot render (llama3's limits, chat_formats.h)
};
const char* chat_problem_name(ChatProblem problem);

struct ParsedConversation {
  Conversation conversation;
  ChatProblem problem = ChatProblem::none;
  std::string detail;  // what was found, naming the message index and field
};

// Parses one JSONL line {"messages": [...], "tools": [...]?}; never throws for bad input.
ParsedConversation chat_parse_line(std::string_view line);
// A line's JSON value, parsed as chat_parse_line parses it (UTF-8, JSON, each key once in an
// object): the problem found, or nothing with the value in *value (any input format's line).
std::optional<ParsedConversation> chat_line_json(std::string_view line, nlohmann::ordered_json* value);
ParsedConversation chat_parse_conversation(const nlohmann::ordered_json& value);

// The template's text for these messages; add_generation_prompt appends
// "<|im_start|>assistant\n".
std::string chat_render_qwen3(const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools,
                              bool add_generation_prompt = false);

struct TokenizedConversation {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;  // 1: a supervised target; one per token
};

// slime's qwen3 loss mask, precomputing what it measures once per tokenizer.
class Qwen3LossMask {
 public:
  explicit Qwen3LossMask(const Tokenizer& tokenizer);
  TokenizedConversation tokenize(const Conversation& conversation) const;

  // What slime's get_system_message_length measures (0 and 3 for Qwen3).
  size_t system_message_length() const { return system_message_length_; }
  size_t generation_header_length() const { return gen_token_length_; }

 private:
  const Tokenizer& tokenizer_;
  ChatMessage prefix_;  // P
  size_t prefix_tokens_ = 0;
  size_t system_message_length_ = 0;
  size_t gen_token_length_ = 0;
};

// json.dumps(value, ensure_ascii=False) as Python writes it: ", " and ": " separators,
// keys in their order, floats as Python's repr (1.0, 1e-05, 1e+16); with indent >= 0,
// json.dumps(value, ensure_ascii=False, indent=indent) (what Jinja's tojson(indent=N) gives).
std::string json_dumps_python(const nlohmann::ordered_json& value, int indent = -1);

// Python's str.strip() (Jinja's trim): leading and trailing Unicode white space removed.
std::string_view python_strip(std::string_view s);

}  // namespace loom
