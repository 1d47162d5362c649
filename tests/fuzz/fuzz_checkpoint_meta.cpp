// A resume checkpoint's meta.json (io/checkpoint.h) through checkpoint_meta_parse, as a
// resume reads it: format, step, skip counts and the run's identity checked, or an InputError.
#include <cstdint>
#include <string>

#include "fuzz_input.h"
#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  loom::fuzz::expect_parsed_or_input_error([&] { loom::checkpoint_meta_parse(text, "meta.json"); });
  return 0;
}
