#include "data/chat_formats.h"

#include "core/error.h"

namespace loom {
namespace {

constexpr const char* kQwen25DefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// A message's header (masked 0 in an assistant message) and the rest of its text.
struct Rendered {
  std::string header;
  std::string body;
};

Rendered render_message(ChatFormat format, const std::string& role, const std::string& content) {
  if (format == ChatFormat::llama3)
    return {"<|start_header_id|>" + role + "<|end_header_id|>\n\n", content + "<|eot_id|>"};
  return {"<|im_start|>" + role + "\n", content + "<|im_end|>\n"};
}

// The messages a format renders: Qwen2.5's default system message put first where needed.
std::vector<ChatMessage> with_default_system(ChatFormat format, const std::vector<ChatMessage>& messages) {
  std::vector<ChatMessage> out;
  if (format == ChatFormat::qwen25 && (messages.empty() || messages[0].role != "system")) {
    ChatMessage system;
    system.role = "system";
    system.content = kQwen25DefaultSystem;
    out.push_back(system);
  }
  out.insert(out.end(), messages.begin(), messages.end());
  return out;
}

std::string tools_used(const Conversation& conversation) {
  if (!conversation.tools.is_null() && !conversation.tools.empty())
    return "a conversation with tools: tools are rendered only by the qwen3 chat format";
  for (size_t i = 0; i < conversation.messages.size(); ++i) {
    const ChatMessage& m = conversation.messages[i];
    if (m.role == "tool" || (!m.tool_calls.is_null() && !m.tool_calls.empty()))
      return "message " + std::to_string(i) +
             " is a tool call or result: tools are rendered only by the qwen3 chat format";
  }
  return "";
}

class AssistantMask final : public ChatMasker {
 public:
  AssistantMask(const Tokenizer& tokenizer, ChatFormat format) : tokenizer_(tokenizer), format_(format) {
    header_tokens_ = tokenizer_.encode(render_message(format_, "assistant", "").header).size();
  }

  std::string unsupported(const Conversation& conversation) const override {
    return tools_used(conversation);
  }

  TokenizedConversation tokenize(const Conversation& conversation) const override {
    if (conversation.messages.empty()) throw_input_error("chat", "the conversation has no messages");
    const std::string why = unsupported(conversation);
    if (!why.empty()) throw_input_error("chat", why);
    TokenizedConversation out;
    auto append = [&out](const std::vector<int32_t>& ids, bool supervised, size_t header) {
      out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
      for (size_t k = 0; k < ids.size(); ++k) out.loss_mask.push_back(supervised && k >= header ? 1 : 0);
    };
    if (format_ == ChatFormat::llama3) append(tokenizer_.encode("<|begin_of_text|>"), false, 0);
    for (const ChatMessage& m : with_default_system(format_, conversation.messages)) {
      const Rendered r = render_message(format_, m.role, m.content);
      append(tokenizer_.encode(r.header + r.body), m.role == "assistant" && m.step_loss_mask, header_tokens_);
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

std::string chat_render(ChatFormat format, const std::vector<ChatMessage>& messages) {
  LOOM_ASSERT(format != ChatFormat::qwen3, "chat_render_qwen3 renders the qwen3 format");
  std::string out = format == ChatFormat::llama3 ? "<|begin_of_text|>" : "";
  for (const ChatMessage& m : with_default_system(format, messages)) {
    const Rendered r = render_message(format, m.role, m.content);
    out += r.header + r.body;
  }
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
