// Conversation lines as `loom data build` reads them: each line through input_line_parse
// (data/input_formats.h) as each input format (messages, ShareGPT, Alpaca, prompt/completion),
// and through format detection, none of which may throw for bad input; a conversation a
// format accepts is then rendered by every chat template (qwen3, llama3, qwen2.5), tool calls
// included, which may refuse it only with an InputError.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "data/chat.h"
#include "data/chat_formats.h"
#include "data/input_formats.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::InputFormat;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty()) {
    const size_t end = rest.find('\n');
    const std::string_view line = rest.substr(0, end);
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 1);
    loom::fuzz::expect_parsed_or_input_error([&] {
      nlohmann::ordered_json record;
      if (!loom::chat_line_json(line, &record)) (void)loom::input_format_detect(record);
    });
    for (const InputFormat format :
         {InputFormat::messages, InputFormat::sharegpt, InputFormat::alpaca, InputFormat::prompt_completion})
      loom::fuzz::expect_parsed_or_input_error([&] {
        const loom::ParsedConversation parsed = loom::input_line_parse(format, line);
        if (parsed.problem != loom::ChatProblem::none) return;
        for (const loom::ChatFormat chat :
             {loom::ChatFormat::qwen3, loom::ChatFormat::llama3, loom::ChatFormat::qwen25})
          loom::fuzz::expect_parsed_or_input_error(
              [&] { (void)loom::chat_render(chat, parsed.conversation); });
      });
  }
  return 0;
}
