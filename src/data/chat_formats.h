// The chat formats of the other families and their `assistant` loss mask (docs/data.md),
// beside Qwen3's template and slime's qwen3 mask (chat.h):
//
//   llama3   without tools: Meta's documented Llama 3 format, "<|begin_of_text|>", then each
//            message as "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>"; the
//            system message as the user gives it (no injected date header).
//            With tools, tool calls or tool messages: what Llama 3.1-Instruct's chat template
//            renders through transformers' apply_chat_template (its defaults: the system block
//            "Environment: ipython" and the date lines, the tools as JSON in the first user
//            message, a tool call as {"name": N, "parameters": A}, a tool result in the ipython
//            role, content trimmed). One tool call per message, and no content beside it (the
//            template raises or drops it): unsupported() says why otherwise.
//   qwen2.5  Qwen2.5-Instruct's chat template: ChatML without think blocks, each message
//            "<|im_start|>{role}\n{content}<|im_end|>\n", led by Qwen2.5's default system
//            message ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")
//            when the conversation does not start with one; tools in the "# Tools" system
//            block, tool calls as "<tool_call>" blocks, consecutive tool results in one user
//            turn of "<tool_response>" blocks.
// Both write a tool call's arguments with tojson; an arguments string holding a JSON object
// (OpenAI's form) is decoded first, so it is written as the object, not quoted.
//
// The `assistant` mask: an assistant message's header tokens ("<|start_header_id|>assistant
// <|end_header_id|>\n\n", "<|im_start|>assistant\n") 0, its content, tool calls and end tokens
// ("<|eot_id|>"; "<|im_end|>\n") 1, every other token 0 (and an assistant message whose
// step_loss_mask is not 1 is 0 throughout). Each message is tokenized on its own: every
// message starts and ends at a special token, so the pieces' ids are the whole rendered
// text's.
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

// The format's text for this conversation; InputError for one the format cannot render (tool
// use Llama 3.1's template raises on or would drop, under llama3: ChatMasker::unsupported).
std::string chat_render(ChatFormat format, const Conversation& conversation);

// Tokens and loss mask of a conversation: the format's tokens with its loss mask.
class ChatMasker {
 public:
  virtual ~ChatMasker() = default;
  // Why the format cannot render the conversation (llama3's limits on tools), or empty.
  virtual std::string unsupported(const Conversation& conversation) const = 0;
  // InputError for a conversation unsupported() refuses.
  virtual TokenizedConversation tokenize(const Conversation& conversation) const = 0;
};

// The masker of a format and a loss mask: qwen3 with "qwen3" (slime's, chat.h), llama3 and
// qwen2.5 with "assistant". InputError naming --loss-mask for another pairing.
std::unique_ptr<ChatMasker> chat_masker_make(const Tokenizer& tokenizer, ChatFormat format,
                                             const std::string& loss_mask);

}  // namespace loom
