// safetensors_parse_header (io/safetensors.h) on a whole file's bytes: every header defect is
// an InputError; a header it accepts describes tensors that lie inside the data section.
#include <cstdint>

#include "fuzz_input.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::fuzz::expect_parsed_or_input_error([&] {
    const loom::SafetensorsHeader header = loom::safetensors_parse_header(data, size, "fuzz.safetensors");
    for (const loom::SafetensorsEntry& entry : header.entries)
      if (entry.end > header.data_size || header.data_offset + header.data_size > size) std::abort();
  });
  return 0;
}
