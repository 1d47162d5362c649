// An HF config.json through model_config_load (model/config.h), as `loom train` and `loom plan`
// read a checkpoint's: valid JSON, each key once, every field in its range, or an InputError.
#include <cstdint>
#include <string_view>

#include "fuzz_input.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir scratch;
  const std::string path =
      scratch.write("config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  loom::fuzz::expect_parsed_or_input_error([&] { loom::model_config_load(path); });
  return 0;
}
