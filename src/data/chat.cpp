#include "data/chat.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"
#include "core/json_strict.h"
#include "data/unicode.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

// Python's str.lstrip("\n"), rstrip("\n"), strip("\n").
std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}
std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}
std::string_view strip_newlines(std::string_view s) {
  return rstrip_newlines(lstrip_newlines(s));
}

// s.split(sep)[-1] and s.split(sep)[0].
std::string_view after_last(std::string_view s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string_view::npos ? s : s.substr(p + sep.size());
}
std::string_view before_first(std::string_view s, std::string_view sep) {
  const size_t p = s.find(sep);
  return p == std::string_view::npos ? s : s.substr(0, p);
}

void append_python_string(std::string* out, const std::string& s) {
  out->push_back('"');
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      case '\b': *out += "\\b"; break;
      case '\f': *out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

// float.__repr__: the shortest digits that round-trip, positional when the decimal
// exponent is in [-4, 16), else d.ddde±XX.
void append_python_float(std::string* out, double v) {
  if (std::isinf(v)) {
    *out += v > 0 ? "Infinity" : "-Infinity";
    return;
  }
  if (std::isnan(v)) {
    *out += "NaN";
    return;
  }
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  const std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  *out += sign;
  if (exponent >= -4 && exponent < 16) {
    const int point = exponent + 1;  // digits before the decimal point
    if (point <= 0) {
      *out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      *out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      *out += digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
    }
    return;
  }
  *out += digits.substr(0, 1);
  if (digits.size() > 1) *out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  *out += ebuf;
}

// json.dumps(v, ensure_ascii=False, indent=indent): ", " / ": " without an indent; with
// one, each item on its own line indented by `indent` spaces a level, "," and ": " between.
void append_python_json(std::string* out, const ojson& v, int indent, int depth) {
  auto newline = [&](int level) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * level), ' ');
  };
  const char* separator = indent < 0 ? ", " : ",";
  switch (v.type()) {
    case ojson::value_t::null: *out += "null"; break;
    case ojson::value_t::boolean: *out += v.get<bool>() ? "true" : "false"; break;
    case ojson::value_t::number_integer: *out += std::to_string(v.get<int64_t>()); break;
    case ojson::value_t::number_unsigned: *out += std::to_string(v.get<uint64_t>()); break;
    case ojson::value_t::number_float: append_python_float(out, v.get<double>()); break;
    case ojson::value_t::string: append_python_string(out, v.get<std::string>()); break;
    case ojson::value_t::array: {
      if (v.empty()) {
        *out += "[]";
        break;
      }
      *out += "[";
      bool first = true;
      for (const ojson& item : v) {
        if (!first) *out += separator;
        first = false;
        newline(depth + 1);
        append_python_json(out, item, indent, depth + 1);
      }
      newline(depth);
      *out += "]";
      break;
    }
    case ojson::value_t::object: {
      if (v.empty()) {
        *out += "{}";
        break;
      }
      *out += "{";
      bool first = true;
      for (const auto& [key, item] : v.items()) {
        if (!first) *out += separator;
        first = false;
        newline(depth + 1);
        append_python_string(out, key);
        *out += ": ";
        append_python_json(out, item, indent, depth + 1);
      }
      newline(depth);
      *out += "}";
      break;
    }
    default: throw_input_error("chat", "a binary JSON value cannot be rendered");
  }
}

void append_python_json(std::string* out, const ojson& v) {
  append_python_json(out, v, -1, 0);
}

bool is_tool_response(std::string_view content) {
  return content.starts_with("<tool_response>") && content.ends_with("</tool_response>");
}

// Renders one assistant message (the template's assistant branch).
void render_assistant(std::string* out, const ChatMessage& m, bool after_last_query, bool last) {
  std::string_view content = m.content;
  std::string_view reasoning;
  if (m.reasoning.has_value()) {
    reasoning = *m.reasoning;
  } else if (content.find("</think>") != std::string_view::npos) {
    reasoning = lstrip_newlines(after_last(rstrip_newlines(before_first(m.content, "</think>")), "<think>"));
    content = lstrip_newlines(after_last(m.content, "</think>"));
  }
  if (after_last_query && (last || !reasoning.empty())) {
    *out += "<|im_start|>assistant\n<think>\n";
    *out += strip_newlines(reasoning);
    *out += "\n</think>\n\n";
    *out += lstrip_newlines(content);
  } else {
    *out += "<|im_start|>assistant\n";
    *out += content;
  }
  if (m.tool_calls.is_array()) {
    for (size_t j = 0; j < m.tool_calls.size(); ++j) {
      if (j > 0 || !content.empty()) *out += "\n";
      const ojson* call = &m.tool_calls[j];
      if (call->contains("function") && !(*call)["function"].is_null()) call = &(*call)["function"];
      *out += "<tool_call>\n{\"name\": \"";
      *out += (*call)["name"].get<std::string>();
      *out += "\", \"arguments\": ";
      const ojson& args = (*call)["arguments"];
      if (args.is_string()) {
        *out += args.get<std::string>();
      } else {
        append_python_json(out, args);
      }
      *out += "}\n</tool_call>";
    }
  }
  *out += "<|im_end|>\n";
}

ParsedConversation problem(ChatProblem kind, std::string detail) {
  ParsedConversation p;
  p.problem = kind;
  p.detail = std::move(detail);
  return p;
}

bool truthy_tools(const ojson& tools) {
  return tools.is_array() && !tools.empty();
}

}  // namespace

const char* chat_problem_name(ChatProblem problem) {
  switch (problem) {
    case ChatProblem::none: return "none";
    case ChatProblem::invalid_utf8: return "invalid_utf8";
    case ChatProblem::malformed_json: return "malformed_json";
    case ChatProblem::empty_conversation: return "empty_conversation";
    case ChatProblem::unknown_role: return "unknown_role";
    case ChatProblem::non_string_content: return "non_string_content";
    case ChatProblem::bad_tool_call: return "bad_tool_call";
    case ChatProblem::tools_not_in_format: return "tools_not_in_format";
  }
  return "unknown";
}

std::string json_dumps_python(const ojson& value, int indent) {
  std::string out;
  append_python_json(&out, value, indent, 0);
  return out;
}

std::string_view python_strip(std::string_view s) {
  // str.isspace(): the ASCII white space, the separators U+001C to U+001F, and Unicode's
  // White_Space characters (U+0085, U+00A0, U+1680, U+2000 to U+200A, U+2028, U+2029,
  // U+202F, U+205F, U+3000).
  auto space_at = [](std::string_view t, size_t i) -> size_t {  // its length in bytes, or 0
    const auto c = static_cast<unsigned char>(t[i]);
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
    auto at = [&](size_t k) { return i + k < t.size() ? static_cast<unsigned char>(t[i + k]) : 0u; };
    if (c == 0xC2 && (at(1) == 0x85 || at(1) == 0xA0)) return 2;
    if (c == 0xE1 && at(1) == 0x9A && at(2) == 0x80) return 3;
    if (c == 0xE2 && at(1) == 0x80 &&
        ((at(2) >= 0x80 && at(2) <= 0x8A) || at(2) == 0xA8 || at(2) == 0xA9 || at(2) == 0xAF))
      return 3;
    if (c == 0xE2 && at(1) == 0x81 && at(2) == 0x9F) return 3;
    if (c == 0xE3 && at(1) == 0x80 && at(2) == 0x80) return 3;
    return 0;
  };
  size_t begin = 0;
  while (begin < s.size()) {
    const size_t n = space_at(s, begin);
    if (n == 0) break;
    begin += n;
  }
  s.remove_prefix(begin);
  // From the end: find the last character that is not white space, walking forward.
  size_t keep = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t n = space_at(s, i);
    if (n > 0) {
      i += n;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    i += c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    keep = std::min(i, s.size());
  }
  return s.substr(0, keep);
}

std::optional<ParsedConversation> chat_line_json(std::string_view line, ojson* value) {
  const size_t valid = utf8_valid_prefix(line);
  if (valid != line.size())
    return problem(ChatProblem::invalid_utf8, "invalid UTF-8 at byte " + std::to_string(valid));
  // A key written twice in one object would be read as its last value: malformed, as loom's
  // other JSON inputs refuse it (core/json_strict.h).
  StrictParsed<ojson> parsed;
  try {
    parsed = json_parse_strict<ojson>(line, /*throw_invalid=*/true);
  } catch (const ojson::exception& e) {  // a syntax error, or a number too large (out_of_range)
    return problem(ChatProblem::malformed_json, std::string("not JSON: ") + e.what());
  }
  if (parsed.duplicate)
    return problem(ChatProblem::malformed_json, "found the key '" + *parsed.duplicate +
                                                    "' a second time in one object, expected each key once");
  *value = std::move(parsed.value);
  return std::nullopt;
}

ParsedConversation chat_parse_line(std::string_view line) {
  ojson value;
  if (std::optional<ParsedConversation> bad = chat_line_json(line, &value)) return *bad;
  return chat_parse_conversation(value);
}

ParsedConversation chat_parse_conversation(const ojson& value) {
  if (!value.is_object() || !value.contains("messages") || !value["messages"].is_array())
    return problem(ChatProblem::malformed_json, "expected an object with a \"messages\" array");
  const ojson& messages = value["messages"];
  if (messages.empty()) return problem(ChatProblem::empty_conversation, "\"messages\" is empty");
  ParsedConversation parsed;
  if (value.contains("tools") && !value["tools"].is_null()) {
    if (!value["tools"].is_array()) return problem(ChatProblem::bad_tool_call, "\"tools\" is not an array");
    parsed.conversation.tools = value["tools"];
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    const ojson& m = messages[i];
    if (!m.is_object()) return problem(ChatProblem::malformed_json, at + " is not an object");
    ChatMessage msg;
    if (!m.contains("role") || !m["role"].is_string())
      return problem(ChatProblem::unknown_role, at + ".role is missing or not a string");
    msg.role = m["role"].get<std::string>();
    if (msg.role != "system" && msg.role != "user" && msg.role != "assistant" && msg.role != "tool")
      return problem(ChatProblem::unknown_role,
                     at + ".role is \"" + msg.role + "\", expected system, user, assistant or tool");
    // OpenAI's assistant message that calls tools has "content": null (the templates take
    // it as empty); a Parquet row leaves the null out.
    const bool calls_tools = msg.role == "assistant" && m.contains("tool_calls") &&
                             m["tool_calls"].is_array() && !m["tool_calls"].empty();
    if (!(calls_tools && (!m.contains("content") || m["content"].is_null()))) {
      if (!m.contains("content") || !m["content"].is_string())
        return problem(ChatProblem::non_string_content,
                       at + ".content is " +
                           (m.contains("content") ? m["content"].dump() : std::string("missing")) +
                           ", expected a string");
      msg.content = m["content"].get<std::string>();
    }
    // transformers 5 takes the first non-null of these as reasoning_content.
    for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
      if (!m.contains(key) || m[key].is_null()) continue;
      if (!m[key].is_string())
        return problem(ChatProblem::non_string_content, at + "." + key + " is not a string");
      msg.reasoning = m[key].get<std::string>();
      break;
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      const ojson& calls = m["tool_calls"];
      if (!calls.is_array()) return problem(ChatProblem::bad_tool_call, at + ".tool_calls is not an array");
      for (size_t j = 0; j < calls.size(); ++j) {
        const std::string cat = at + ".tool_calls[" + std::to_string(j) + "]";
        const ojson* call = &calls[j];
        if (!call->is_object()) return problem(ChatProblem::bad_tool_call, cat + " is not an object");
        if (call->contains("function") && !(*call)["function"].is_null()) {
          call = &(*call)["function"];
          if (!call->is_object())
            return problem(ChatProblem::bad_tool_call, cat + ".function is not an object");
        }
        if (!call->contains("name") || !(*call)["name"].is_string())
          return problem(ChatProblem::bad_tool_call, cat + " has no string \"name\"");
        if (!call->contains("arguments") || (*call)["arguments"].is_null())
          return problem(ChatProblem::bad_tool_call, cat + " has no \"arguments\"");
      }
      if (msg.role != "assistant" && !calls.empty())
        return problem(ChatProblem::bad_tool_call, at + " has tool_calls but is not an assistant message");
      msg.tool_calls = calls;
    }
    // slime: message.get("step_loss_mask", 1) != 1 zeroes the message (true == 1 in Python).
    if (m.contains("step_loss_mask")) {
      const ojson& s = m["step_loss_mask"];
      msg.step_loss_mask = (s.is_boolean() && s.get<bool>()) || (s.is_number() && s.get<double>() == 1.0);
    }
    parsed.conversation.messages.push_back(std::move(msg));
  }
  return parsed;
}

std::string chat_render_qwen3(const std::vector<ChatMessage>& messages, const ojson& tools,
                              bool add_generation_prompt) {
  std::string out;
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  if (truthy_tools(tools)) {
    out += "<|im_start|>system\n";
    if (first_is_system) out += messages[0].content + "\n\n";
    out +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
        "with "
        "function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ojson& tool : tools) {
      out += "\n";
      append_python_json(&out, tool);
    }
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (first_is_system) {
    out += "<|im_start|>system\n" + messages[0].content + "<|im_end|>\n";
  }
  // The last user message that is not a wrapped tool response: assistants after it are the
  // current turn's (a multi-step tool loop) and keep their think blocks.
  const size_t n = messages.size();
  size_t last_query = n - 1;
  for (size_t k = n; k-- > 0;) {
    if (messages[k].role == "user" && !is_tool_response(messages[k].content)) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user" || (m.role == "system" && i > 0)) {
      out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    } else if (m.role == "assistant") {
      render_assistant(&out, m, n > 0 && i > last_query, i + 1 == n);
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n" + m.content + "\n</tool_response>";
      if (i + 1 == n || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

Qwen3LossMask::Qwen3LossMask(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
  prefix_.role = "user";
  prefix_.content = "FOR CALCULATING LOSS MASK ONLY";
  prefix_tokens_ = tokenizer_.encode(chat_render_qwen3({prefix_}, nullptr)).size();
  // slime's get_system_message_length: where a test string's tokens sit in two user turns.
  ChatMessage probe;
  probe.role = "user";
  probe.content = "FOR TESTING ONLY";
  const std::vector<ChatMessage> two = {probe, probe};
  const std::vector<int32_t> raw = tokenizer_.encode(probe.content);
  const std::vector<int32_t> ids = tokenizer_.encode(chat_render_qwen3(two, nullptr));
  std::vector<size_t> at;
  for (size_t i = 0; i + raw.size() <= ids.size(); ++i)
    if (std::equal(raw.begin(), raw.end(), ids.begin() + static_cast<std::ptrdiff_t>(i))) at.push_back(i);
  if (at.size() != 2)
    throw_input_error("chat template", "the loss mask's probe string appears " + std::to_string(at.size()) +
                                           " times in two rendered user turns, expected 2");
  const size_t end_interval = ids.size() - raw.size() - at[1];
  const size_t with_prompt = tokenizer_.encode(chat_render_qwen3(two, nullptr, true)).size();
  gen_token_length_ = with_prompt - ids.size();
  system_message_length_ = at[0] - ((at[1] - at[0]) - end_interval - raw.size());
}

TokenizedConversation Qwen3LossMask::tokenize(const Conversation& conversation) const {
  const std::vector<ChatMessage>& messages = conversation.messages;
  if (messages.empty()) throw_input_error("chat", "the conversation has no messages");
  TokenizedConversation out;
  std::vector<ChatMessage> group;
  for (size_t i = 0; i < messages.size();) {
    const ChatMessage& message = messages[i];
    size_t end = i + 1;
    if (message.role == "tool")
      while (end < messages.size() && messages[end].role == "tool") ++end;
    group.clear();
    std::vector<int32_t> ids;
    if (i == 0) {
      group.assign(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(end));
      group.push_back(prefix_);
      ids = tokenizer_.encode(chat_render_qwen3(group, conversation.tools));
      ids.resize(ids.size() - std::min(ids.size(), prefix_tokens_));
    } else {
      group.push_back(prefix_);
      group.insert(group.end(), messages.begin() + static_cast<std::ptrdiff_t>(i),
                   messages.begin() + static_cast<std::ptrdiff_t>(end));
      ids = tokenizer_.encode(chat_render_qwen3(group, nullptr));
      ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), prefix_tokens_)));
    }
    if (message.role != "system" && i > 0)
      ids.erase(ids.begin(),
                ids.begin() + static_cast<std::ptrdiff_t>(std::min(ids.size(), system_message_length_)));
    const bool supervised = message.role == "assistant" && message.step_loss_mask;
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
    for (size_t k = 0; k < ids.size(); ++k)
      out.loss_mask.push_back(supervised && k >= gen_token_length_ ? 1 : 0);
    i = end;
  }
  return out;
}

}  // namespace loom
