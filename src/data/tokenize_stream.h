// `loom tokenize`: JSONL in, JSONL out, one output line per non-blank input line.
//   text mode:  {"text": "..."}           → {"ids": [...]}
//   chat mode:  {"messages": [...], ...}  → {"tokens": [...], "loss_mask": [...]}
//               (the chat format's loss mask: chat.h, chat_formats.h)
// A line that is not valid UTF-8, not JSON, or not of the mode's shape is an InputError
// naming `where`:LINE and the field; the lines before it have been written. Blank lines
// are ignored. Each output line is flushed, so the command works as a coprocess.
#pragma once

#include <istream>
#include <ostream>
#include <string>

#include "data/tokenizer.h"

namespace loom {

struct TokenizeStreamOptions {
  bool chat = false;
  std::string chat_format = "qwen3";  // chat mode: qwen3, llama3 or qwen2.5
  std::string loss_mask = "qwen3";    // chat mode: qwen3, or assistant with llama3 and qwen2.5
  std::string where = "stdin";        // names the input in messages
};

// Returns the number of lines written.
int64_t tokenize_stream(const Tokenizer& tokenizer, std::istream& in, std::ostream& out,
                        const TokenizeStreamOptions& options);

}  // namespace loom
