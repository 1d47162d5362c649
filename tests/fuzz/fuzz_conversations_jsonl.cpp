// Conversations JSONL as `loom data build` reads it: each line through chat_parse_line
// (data/chat.h), which names a problem instead of throwing; a conversation it accepts is then
// rendered by the Qwen3 chat template. New input formats join here as they join data build.
#include <cstdint>
#include <string_view>

#include "data/chat.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty()) {
    const size_t end = rest.find('\n');
    const std::string_view line = rest.substr(0, end);
    rest.remove_prefix(end == std::string_view::npos ? rest.size() : end + 1);
    loom::fuzz::expect_parsed_or_input_error([&] {
      const loom::ParsedConversation parsed = loom::chat_parse_line(line);
      if (parsed.problem == loom::ChatProblem::none)
        loom::chat_render_qwen3(parsed.conversation.messages, parsed.conversation.tools);
    });
  }
  return 0;
}
