#include "data/chat_formats.h"

#include "core/error.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

constexpr const char* kQwen25DefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// A piece of the rendered conversation that starts and ends at a special token, so that its
// ids are those of the whole text: its first `header` tokens get mask 0, the rest 1 when
// `supervised` (an assistant message with step_loss_mask 1), else 0.
struct Segment {
  std::string text;
  bool supervised = false;
  bool header = false;  // an assistant message: its role header is masked
};

bool has_tools(const Conversation& c) {
  return c.tools.is_array() && !c.tools.empty();
}
bool calls_tools(const ChatMessage& m) {
  return m.tool_calls.is_array() && !m.tool_calls.empty();
}
bool uses_tools(const Conversation& c) {
  if (has_tools(c)) return true;
  for (const ChatMessage& m : c.messages)
    if (m.role == "tool" || calls_tools(m)) return true;
  return false;
}

// A tool call's {"name", "arguments"}, whether or not wrapped in {"function": ...}.
const ojson& call_function(const ojson& call) {
  return call.contains("function") && !call["function"].is_null() ? call["function"] : call;
}

// Arguments as the qwen2.5 and llama3 formats write them: Qwen2.5's and Llama 3.1's templates
// write them with tojson, which would quote OpenAI's arguments string ("{\"city\": ...}"), so
// a string that holds a JSON object is decoded first (docs/data.md).
std::string arguments_json(const ojson& arguments) {
  if (arguments.is_string()) {
    const ojson decoded = ojson::parse(arguments.get_ref<const std::string&>(), nullptr, false);
    if (!decoded.is_discarded() && decoded.is_object()) return json_dumps_python(decoded);
  }
  return json_dumps_python(arguments);
}

Segment assistant_segment(const ChatMessage& m, std::string text) {
  return {std::move(text), m.step_loss_mask, true};
}

// Qwen2.5's chat template (tokenizer_config.json of Qwen2.5-*-Instruct) through
// transformers' apply_chat_template.
std::vector<Segment> render_qwen25(const Conversation& c) {
  const std::vector<ChatMessage>& messages = c.messages;
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  std::vector<Segment> out;
  const std::string system = first_is_system ? messages[0].content : kQwen25DefaultSystem;
  if (has_tools(c)) {
    std::string text = "<|im_start|>system\n" + system +
                       "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                       "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const ojson& tool : c.tools) text += "\n" + json_dumps_python(tool);
    text +=
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n";
    out.push_back({text});
  } else {
    out.push_back({"<|im_start|>system\n" + system + "<|im_end|>\n"});
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "system" && i == 0) continue;
    if (m.role == "tool") {
      std::string text = "<|im_start|>user";
      for (; i < messages.size() && messages[i].role == "tool"; ++i)
        text += "\n<tool_response>\n" + messages[i].content + "\n</tool_response>";
      --i;
      out.push_back({text + "<|im_end|>\n"});
    } else if (m.role == "assistant" && calls_tools(m)) {
      std::string text = "<|im_start|>assistant";
      if (!m.content.empty()) text += "\n" + m.content;
      for (const ojson& call : m.tool_calls) {
        const ojson& f = call_function(call);
        text += "\n<tool_call>\n{\"name\": \"" + f["name"].get<std::string>() +
                "\", \"arguments\": " + arguments_json(f["arguments"]) + "}\n</tool_call>";
      }
      out.push_back(assistant_segment(m, text + "<|im_end|>\n"));
    } else {
      std::string text = "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (m.role == "assistant")
        out.push_back(assistant_segment(m, std::move(text)));
      else
        out.push_back({std::move(text)});
    }
  }
  return out;
}

std::string llama_header(const std::string& role) {
  return "<|start_header_id|>" + role + "<|end_header_id|>\n\n";
}

// Why Llama 3.1's template cannot render a conversation with tools (it raises, or would drop
// text), or empty.
std::string llama31_refuses(const Conversation& c) {
  const std::vector<ChatMessage>& messages = c.messages;
  const size_t first = !messages.empty() && messages[0].role == "system" ? 1 : 0;
  if (has_tools(c) &&
      (first >= messages.size() || messages[first].role != "user" || calls_tools(messages[first])))
    return "the llama3 format (Llama 3.1's template) puts the tools in the first user message, and message " +
           std::to_string(first) + " is not a user message";
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (!calls_tools(m)) continue;
    if (m.tool_calls.size() != 1)
      return "message " + std::to_string(i) + " has " + std::to_string(m.tool_calls.size()) +
             " tool calls: the llama3 format (Llama 3.1's template) renders one per message";
    if (!m.content.empty())
      return "message " + std::to_string(i) +
             " has content beside its tool call: the llama3 format (Llama 3.1's template) would drop it";
  }
  return "";
}

// Llama 3.1-Instruct's chat template (its tokenizer_config.json) through transformers'
// apply_chat_template, with its defaults (the date "26 Jul 2024", tools in the first user
// message): the llama3 format of a conversation that uses tools.
std::vector<Segment> render_llama31(const Conversation& c) {
  const std::vector<ChatMessage>& messages = c.messages;
  size_t i = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") system = python_strip(messages[i++].content);
  std::vector<Segment> out = {{"<|begin_of_text|>"}};
  const bool tools = has_tools(c);
  out.push_back({llama_header("system") + (tools ? "Environment: ipython\n" : "") +
                 "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" + system +
                 "<|eot_id|>"});
  if (tools) {
    std::string text =
        llama_header("user") +
        "Given the following functions, please respond with a JSON for a function call with its "
        "proper arguments that best answers the given prompt.\n\nRespond in the format "
        "{\"name\": function name, \"parameters\": dictionary of argument name and its value}."
        "Do not use variables.\n\n";
    for (const ojson& tool : c.tools) text += json_dumps_python(tool, 4) + "\n\n";
    out.push_back({text + std::string(python_strip(messages[i++].content)) + "<|eot_id|>"});
  }
  for (; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {
      // The template writes a string result with tojson: quoted.
      out.push_back({llama_header("ipython") + json_dumps_python(m.content) + "<|eot_id|>"});
    } else if (calls_tools(m)) {
      const ojson& f = call_function(m.tool_calls[0]);
      out.push_back(
          assistant_segment(m, llama_header("assistant") + "{\"name\": \"" + f["name"].get<std::string>() +
                                   "\", \"parameters\": " + arguments_json(f["arguments"]) + "}<|eot_id|>"));
    } else {
      std::string text = llama_header(m.role) + std::string(python_strip(m.content)) + "<|eot_id|>";
      if (m.role == "assistant")
        out.push_back(assistant_segment(m, std::move(text)));
      else
        out.push_back({std::move(text)});
    }
  }
  return out;
}

// Meta's documented Llama 3 format, for a conversation without tools.
std::vector<Segment> render_llama3(const Conversation& c) {
  std::vector<Segment> out = {{"<|begin_of_text|>"}};
  for (const ChatMessage& m : c.messages) {
    std::string text = llama_header(m.role) + m.content + "<|eot_id|>";
    if (m.role == "assistant")
      out.push_back(assistant_segment(m, std::move(text)));
    else
      out.push_back({std::move(text)});
  }
  return out;
}

std::vector<Segment> render_segments(ChatFormat format, const Conversation& c) {
  if (format == ChatFormat::qwen25) return render_qwen25(c);
  if (!uses_tools(c)) return render_llama3(c);
  // render_llama31 reads the user message that holds the tools: refused before it, whoever calls.
  if (const std::string why = llama31_refuses(c); !why.empty()) throw_input_error("conversation", why);
  return render_llama31(c);
}

class AssistantMask final : public ChatMasker {
 public:
  AssistantMask(const Tokenizer& tokenizer, ChatFormat format) : tokenizer_(tokenizer), format_(format) {
    header_tokens_ = tokenizer_
                         .encode(format_ == ChatFormat::llama3 ? llama_header("assistant")
                                                               : std::string("<|im_start|>assistant\n"))
                         .size();
  }

  std::string unsupported(const Conversation& conversation) const override {
    return format_ == ChatFormat::llama3 && uses_tools(conversation) ? llama31_refuses(conversation) : "";
  }

  TokenizedConversation tokenize(const Conversation& conversation) const override {
    if (conversation.messages.empty()) throw_input_error("chat", "the conversation has no messages");
    const std::string why = unsupported(conversation);
    if (!why.empty()) throw_input_error("chat", why);
    TokenizedConversation out;
    for (const Segment& s : render_segments(format_, conversation)) {
      const std::vector<int32_t> ids = tokenizer_.encode(s.text);
      const size_t header = s.header ? header_tokens_ : 0;
      out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
      for (size_t k = 0; k < ids.size(); ++k) out.loss_mask.push_back(s.supervised && k >= header ? 1 : 0);
    }
    return out;
  }

 private:
  const Tokenizer& tokenizer_;
  ChatFormat format_;
  size_t header_tokens_ = 0;
};

class Qwen3Mask final : public ChatMasker {
 public:
  explicit Qwen3Mask(const Tokenizer& tokenizer) : mask_(tokenizer) {}
  std::string unsupported(const Conversation&) const override { return ""; }
  TokenizedConversation tokenize(const Conversation& conversation) const override {
    return mask_.tokenize(conversation);
  }

 private:
  Qwen3LossMask mask_;
};

}  // namespace

ChatFormat chat_format_parse(const std::string& name, const std::string& field) {
  if (name == "qwen3") return ChatFormat::qwen3;
  if (name == "llama3") return ChatFormat::llama3;
  if (name == "qwen2.5") return ChatFormat::qwen25;
  throw_input_error(field, "\"" + name + "\", expected qwen3, llama3 or qwen2.5");
}

std::string chat_render(ChatFormat format, const Conversation& conversation) {
  if (format == ChatFormat::qwen3) return chat_render_qwen3(conversation.messages, conversation.tools);
  std::string out;
  for (const Segment& s : render_segments(format, conversation)) out += s.text;
  return out;
}

std::unique_ptr<ChatMasker> chat_masker_make(const Tokenizer& tokenizer, ChatFormat format,
                                             const std::string& loss_mask) {
  if (format == ChatFormat::qwen3) {
    if (loss_mask != "qwen3")
      throw_input_error("--loss-mask", "\"" + loss_mask + "\", expected qwen3 for the qwen3 chat format");
    return std::make_unique<Qwen3Mask>(tokenizer);
  }
  if (loss_mask != "assistant")
    throw_input_error("--loss-mask", "\"" + loss_mask + "\", expected assistant for the " +
                                         (format == ChatFormat::llama3 ? "llama3" : "qwen2.5") +
                                         " chat format");
  return std::make_unique<AssistantMask>(tokenizer, format);
}

}  // namespace loom
