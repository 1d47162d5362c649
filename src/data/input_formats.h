// The data formats conversations come in, each record turned into the messages the chat
// formats render (chat.h; docs/data.md has the tables):
//
//   messages           {"messages": [...], "tools": [...]?}: chat.h's, with OpenAI's tool calls
//                      ({"id", "type": "function", "function": {"name", "arguments"}}, "content":
//                      null beside them) and "tool" messages.
//   sharegpt           {"conversations": [{"from", "value"}, ...], "system"?, "tools"?}: from
//                      human / user → user, gpt / assistant → assistant, system → system,
//                      observation / tool → tool, function_call → an assistant message calling
//                      the tools its value holds (a JSON object {"name", "arguments"} or a list
//                      of them), as LLaMA-Factory reads the Hub's ShareGPT data; "system" (a
//                      string) is put first as a system message.
//   alpaca             {"instruction", "input"?, "output", "system"?}: a user message of the
//                      instruction and the input joined by a blank line ("\n\n", the separation
//                      Stanford Alpaca's prompt gives them; an empty input adds nothing), an
//                      assistant message of the output, the system message first.
//   prompt_completion  {"prompt", "completion"}: strings → a user and an assistant message;
//                      TRL's conversational form, two message lists → the prompt's messages
//                      then the completion's, the prompt's assistant messages unsupervised
//                      (step_loss_mask 0), as TRL trains on the completion alone.
// In every format "tools" may also be a JSON string of the list (LLaMA-Factory's data; in
// Parquet it keeps the tools' key order, which struct columns do not).
//
// A record that is not of its format is a ChatProblem (chat.h) naming the field, as a
// malformed messages line is: `loom data build` skips and counts it or, with --strict, stops.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "data/chat.h"

namespace loom {

enum class InputFormat { messages, sharegpt, alpaca, prompt_completion };

const char* input_format_name(InputFormat format);

// "auto" → nullopt, a format's name → it; InputError naming `field` otherwise.
std::optional<InputFormat> input_format_parse(const std::string& name, const std::string& field);

// The format a record's keys say: "messages", "conversations", "instruction" with "output",
// or "prompt" with "completion" (first match); nullopt for none.
std::optional<InputFormat> input_format_detect(const nlohmann::ordered_json& record);

// The conversation of one record or JSONL line of `format`; never throws for bad input.
ParsedConversation input_record_parse(InputFormat format, const nlohmann::ordered_json& record);
ParsedConversation input_line_parse(InputFormat format, std::string_view line);

}  // namespace loom
