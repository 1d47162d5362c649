// The chat formats of the other families and their `assistant` loss mask (docs/data.md),
// beside Qwen3's template and slime's qwen3 mask (chat.h):
//
//   llama3   Meta's documented Llama 3 format: "<|begin_of_text|>", then each message as
//            "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"; the system
//            message as the user gives it (no injected date header).
//   qwen2.5  ChatML without think blocks: each message "<|im_start|>{role}\n{content}<|im_end|>\n",
//            led by Qwen2.5's default system message ("You are Qwen, created by Alibaba Cloud.
//            You are a helpful assistant.") when the conversation does not start with one.
//
// The `assistant` mask: an assistant message's header tokens ("<|start_header_id|>assistant
// <|end_header_id|>\n\n", "<|im_start|>assistant\n") 0, its content and end tokens
// ("<|eot_id|>"; "<|im_end|>\n") 1, every other token 0 (and an assistant message whose
// step_loss_mask is not 1 is 0 throughout). Each message is tokenized on its own: every
// message starts and ends at a special token, so the pieces' ids are the whole rendered
// text's. Tool calls and tool messages are rendered only by the qwen3 template: `loom data
// build` skips a conversation with them (tools_not_in_format), `loom tokenize` refuses it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/chat.h"
#include "data/tokenizer.h"

namespace loom {

enum class ChatFormat { qwen3, llama3, qwen25 };

// "qwen3", "llama3" or "qwen2.5"; InputError naming `field` otherwise.
ChatFormat chat_format_parse(const std::string& name, const std::string& field);

// The format's text for these messages (llama3 or qwen2.5).
std::string chat_render(ChatFormat format, const std::vector<ChatMessage>& messages);

// Tokens and loss mask of a conversation: the format's tokens with its loss mask.
class ChatMasker {
 public:
  virtual ~ChatMasker() = default;
  // Why the format cannot render the conversation (tools outside qwen3), or empty.
  virtual std::string unsupported(const Conversation& conversation) const = 0;
  // InputError for a conversation unsupported() refuses.
  virtual TokenizedConversation tokenize(const Conversation& conversation) const = 0;
};

// The masker of a format and a loss mask: qwen3 with "qwen3" (slime's, chat.h), llama3 and
// qwen2.5 with "assistant". InputError naming --loss-mask for another pairing.
std::unique_ptr<ChatMasker> chat_masker_make(const Tokenizer& tokenizer, ChatFormat format,
                                             const std::string& loss_mask);

}  // namespace loom
