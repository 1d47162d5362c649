#include "data/input_formats.h"

#include "core/error.h"
#include "data/unicode.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

ParsedConversation problem(ChatProblem kind, std::string detail) {
  ParsedConversation p;
  p.problem = kind;
  p.detail = std::move(detail);
  return p;
}

bool is_string_or_absent(const ojson& record, const char* key) {
  return !record.contains(key) || record[key].is_null() || record[key].is_string();
}

std::string found(const ojson& record, const char* key) {
  return record.contains(key) ? record[key].dump() : std::string("missing");
}

ojson message(const char* role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// The messages, then chat.h's checks of them; a non-empty "system" string first.
ParsedConversation with_system(const ojson& record, ojson messages, const ojson& tools) {
  if (!is_string_or_absent(record, "system"))
    return problem(ChatProblem::non_string_content,
                   "system is " + found(record, "system") + ", expected a string");
  if (record.contains("system") && record["system"].is_string() &&
      !record["system"].get<std::string>().empty())
    messages.insert(messages.begin(), message("system", record["system"].get<std::string>()));
  ojson conversation = {{"messages", std::move(messages)}};
  if (!tools.is_null()) conversation["tools"] = tools;
  return chat_parse_conversation(conversation);
}

// "tools" as given, or decoded from the JSON string LLaMA-Factory's data hold; null when absent.
std::optional<ojson> tools_of(const ojson& record) {
  if (!record.contains("tools") || record["tools"].is_null()) return ojson();
  const ojson& tools = record["tools"];
  if (!tools.is_string()) return tools;
  if (tools.get<std::string>().empty()) return ojson();
  ojson decoded = ojson::parse(tools.get<std::string>(), nullptr, false);
  if (decoded.is_discarded()) return std::nullopt;
  return decoded;
}

ParsedConversation from_sharegpt(const ojson& record) {
  const ojson& turns = record["conversations"];
  if (turns.empty()) return problem(ChatProblem::empty_conversation, "\"conversations\" is empty");
  const std::optional<ojson> tools = tools_of(record);
  if (!tools) return problem(ChatProblem::bad_tool_call, "\"tools\" is a string that is not JSON");
  ojson messages = ojson::array();
  for (size_t i = 0; i < turns.size(); ++i) {
    const std::string at = "conversations[" + std::to_string(i) + "]";
    const ojson& t = turns[i];
    if (!t.is_object()) return problem(ChatProblem::malformed_json, at + " is not an object");
    if (!t.contains("from") || !t["from"].is_string())
      return problem(ChatProblem::unknown_role, at + ".from is missing or not a string");
    const std::string from = t["from"].get<std::string>();
    if (!t.contains("value") || !t["value"].is_string())
      return problem(ChatProblem::non_string_content,
                     at + ".value is " + found(t, "value") + ", expected a string");
    const std::string& value = t["value"].get_ref<const std::string&>();
    if (from == "human" || from == "user") {
      messages.push_back(message("user", value));
    } else if (from == "gpt" || from == "assistant") {
      messages.push_back(message("assistant", value));
    } else if (from == "system") {
      messages.push_back(message("system", value));
    } else if (from == "observation" || from == "tool") {
      messages.push_back(message("tool", value));
    } else if (from == "function_call") {
      ojson calls = ojson::parse(value, nullptr, false);
      if (calls.is_discarded())
        return problem(ChatProblem::bad_tool_call,
                       at + ".value is not JSON, expected a tool call {\"name\", \"arguments\"}");
      if (!calls.is_array()) calls = ojson::array({calls});
      ojson tool_calls = ojson::array();
      for (ojson& call : calls) tool_calls.push_back({{"type", "function"}, {"function", std::move(call)}});
      ojson m = message("assistant", "");
      m["tool_calls"] = std::move(tool_calls);
      messages.push_back(std::move(m));
    } else {
      return problem(
          ChatProblem::unknown_role,
          at + ".from is \"" + from +
              "\", expected human, user, gpt, assistant, system, function_call, observation or tool");
    }
  }
  return with_system(record, std::move(messages), *tools);
}

ParsedConversation from_alpaca(const ojson& record) {
  for (const char* key : {"instruction", "output"})
    if (!record[key].is_string())
      return problem(ChatProblem::non_string_content,
                     std::string(key) + " is " + record[key].dump() + ", expected a string");
  if (!is_string_or_absent(record, "input"))
    return problem(ChatProblem::non_string_content,
                   "input is " + found(record, "input") + ", expected a string");
  std::string user = record["instruction"].get<std::string>();
  if (record.contains("input") && record["input"].is_string() && !record["input"].get<std::string>().empty())
    user += (user.empty() ? "" : "\n\n") + record["input"].get<std::string>();
  ojson messages = {message("user", user), message("assistant", record["output"].get<std::string>())};
  return with_system(record, std::move(messages), ojson());
}

ParsedConversation from_prompt_completion(const ojson& record) {
  const ojson &prompt = record["prompt"], &completion = record["completion"];
  const std::optional<ojson> tools = tools_of(record);
  if (!tools) return problem(ChatProblem::bad_tool_call, "\"tools\" is a string that is not JSON");
  if (prompt.is_string() && completion.is_string())
    return with_system(
        record,
        {message("user", prompt.get<std::string>()), message("assistant", completion.get<std::string>())},
        *tools);
  if (!prompt.is_array() || !completion.is_array())
    return problem(ChatProblem::malformed_json,
                   "prompt and completion are " + std::string(prompt.type_name()) + " and " +
                       completion.type_name() + ", expected two strings or two message lists");
  ojson messages = ojson::array();
  for (const ojson& m : prompt) {
    ojson copy = m;
    // TRL trains on the completion alone.
    if (copy.is_object() && copy.contains("role") && copy["role"] == "assistant") copy["step_loss_mask"] = 0;
    messages.push_back(std::move(copy));
  }
  for (const ojson& m : completion) messages.push_back(m);
  return with_system(record, std::move(messages), *tools);
}

const char* expected_keys(InputFormat format) {
  switch (format) {
    case InputFormat::messages: return "an object with a \"messages\" array";
    case InputFormat::sharegpt: return "an object with a \"conversations\" array";
    case InputFormat::alpaca: return "an object with \"instruction\" and \"output\"";
    case InputFormat::prompt_completion: return "an object with \"prompt\" and \"completion\"";
  }
  return "";
}

bool has_keys(InputFormat format, const ojson& r) {
  switch (format) {
    case InputFormat::messages: return r.contains("messages") && r["messages"].is_array();
    case InputFormat::sharegpt: return r.contains("conversations") && r["conversations"].is_array();
    case InputFormat::alpaca: return r.contains("instruction") && r.contains("output");
    case InputFormat::prompt_completion: return r.contains("prompt") && r.contains("completion");
  }
  return false;
}

}  // namespace

const char* input_format_name(InputFormat format) {
  switch (format) {
    case InputFormat::messages: return "messages";
    case InputFormat::sharegpt: return "sharegpt";
    case InputFormat::alpaca: return "alpaca";
    case InputFormat::prompt_completion: return "prompt_completion";
  }
  return "unknown";
}

std::optional<InputFormat> input_format_parse(const std::string& name, const std::string& field) {
  if (name == "auto") return std::nullopt;
  for (InputFormat f :
       {InputFormat::messages, InputFormat::sharegpt, InputFormat::alpaca, InputFormat::prompt_completion})
    if (name == input_format_name(f)) return f;
  throw_input_error(field,
                    "\"" + name + "\", expected auto, messages, sharegpt, alpaca or prompt_completion");
}

std::optional<InputFormat> input_format_detect(const ojson& record) {
  if (!record.is_object()) return std::nullopt;
  if (record.contains("messages")) return InputFormat::messages;
  if (record.contains("conversations")) return InputFormat::sharegpt;
  if (record.contains("instruction") && record.contains("output")) return InputFormat::alpaca;
  if (record.contains("prompt") && record.contains("completion")) return InputFormat::prompt_completion;
  return std::nullopt;
}

ParsedConversation input_record_parse(InputFormat format, const ojson& record) {
  if (!record.is_object() || !has_keys(format, record))
    return problem(ChatProblem::malformed_json, std::string("expected ") + expected_keys(format) +
                                                    " (format " + input_format_name(format) + ")");
  switch (format) {
    case InputFormat::messages: {
      if (!record.contains("tools") || !record["tools"].is_string()) return chat_parse_conversation(record);
      const std::optional<ojson> tools = tools_of(record);
      if (!tools) return problem(ChatProblem::bad_tool_call, "\"tools\" is a string that is not JSON");
      ojson decoded = record;
      decoded["tools"] = *tools;
      return chat_parse_conversation(decoded);
    }
    case InputFormat::sharegpt: return from_sharegpt(record);
    case InputFormat::alpaca: return from_alpaca(record);
    case InputFormat::prompt_completion: return from_prompt_completion(record);
  }
  return problem(ChatProblem::malformed_json, "unknown format");
}

ParsedConversation input_line_parse(InputFormat format, std::string_view line) {
  ojson value;
  if (std::optional<ParsedConversation> bad = chat_line_json(line, &value)) return *bad;
  return input_record_parse(format, value);
}

}  // namespace loom
