// A tokenizer.json through Tokenizer::load (data/tokenizer.h); one it accepts must then encode
// and decode text (its tables, merges and added tokens are used, not only read).
#include <cstdint>
#include <string_view>

#include "data/tokenizer.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir scratch;
  const std::string path =
      scratch.write("tokenizer.json", std::string_view(reinterpret_cast<const char*>(data), size));
  loom::fuzz::expect_parsed_or_input_error([&] {
    const loom::Tokenizer tokenizer = loom::Tokenizer::load(path);
    const std::vector<int32_t> ids =
        tokenizer.encode("Hello, wörld! 12345 <|im_start|>user\n\xff\xfe  tabs\t\r\n");
    tokenizer.decode(ids);
    tokenizer.decode(ids, true);
  });
  return 0;
}
