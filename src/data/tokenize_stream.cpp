#include "data/tokenize_stream.h"

#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/chat.h"
#include "data/chat_formats.h"
#include "data/unicode.h"

namespace loom {
namespace {

template <typename T>
void append_array(std::string* out, const std::vector<T>& values) {
  *out += '[';
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) *out += ',';
    *out += std::to_string(static_cast<int64_t>(values[i]));
  }
  *out += ']';
}

}  // namespace

int64_t tokenize_stream(const Tokenizer& tokenizer, std::istream& in, std::ostream& out,
                        const TokenizeStreamOptions& options) {
  std::unique_ptr<ChatMasker> masker;
  if (options.chat)
    masker = chat_masker_make(tokenizer, chat_format_parse(options.chat_format, "--chat-format"),
                              options.loss_mask);
  std::string line, text;
  int64_t line_number = 0, written = 0;
  std::vector<int32_t> ids;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = options.where + ":" + std::to_string(line_number);
    const size_t valid = utf8_valid_prefix(line);
    if (valid != line.size())
      throw_input_error(where, "invalid UTF-8 at byte " + std::to_string(valid) + "; expected UTF-8 JSON");
    text.clear();
    if (options.chat) {
      const ParsedConversation parsed = chat_parse_line(line);
      if (parsed.problem != ChatProblem::none)
        throw_input_error(where, std::string(chat_problem_name(parsed.problem)) + ": " + parsed.detail);
      const std::string unsupported = masker->unsupported(parsed.conversation);
      if (!unsupported.empty())
        throw_input_error(
            where, std::string(chat_problem_name(ChatProblem::tools_not_in_format)) + ": " + unsupported);
      const TokenizedConversation t = masker->tokenize(parsed.conversation);
      text += "{\"tokens\":";
      append_array(&text, t.tokens);
      text += ",\"loss_mask\":";
      append_array(&text, t.loss_mask);
    } else {
      const nlohmann::json value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (value.is_discarded()) throw_input_error(where, "not JSON; expected {\"text\": \"...\"}");
      if (!value.is_object() || !value.contains("text") || !value["text"].is_string())
        throw_input_error(where, "field text is missing or not a string; expected {\"text\": \"...\"}");
      ids.clear();
      tokenizer.encode_append(value["text"].get_ref<const std::string&>(), &ids);
      text += "{\"ids\":";
      append_array(&text, ids);
    }
    text += "}\n";
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    out.flush();
    if (!out) throw_runtime_failure("stdout", "write failed");
    ++written;
  }
  if (in.bad()) throw_runtime_failure(options.where, "read failed");
  return written;
}

}  // namespace loom
