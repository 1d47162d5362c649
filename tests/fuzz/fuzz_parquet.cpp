// A Parquet input file as `loom data build` reads it: ParquetRecords (data/parquet_records.h)
// row by row, each row through every input format's parse. A file Arrow cannot read, a corrupt
// page or a column with no JSON form may only be an InputError naming the file. Arrow's own
// code is not instrumented: the coverage that guides this target is loom's reading of what
// Arrow returns.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "data/input_formats.h"
#include "data/parquet_records.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using loom::InputFormat;
  static const loom::fuzz::ScratchDir scratch;
  const std::string path =
      scratch.write("input.parquet", std::string_view(reinterpret_cast<const char*>(data), size));
  loom::fuzz::expect_parsed_or_input_error([&] {
    loom::ParquetRecords records(path);
    nlohmann::ordered_json record;
    while (records.next(&record))
      for (const InputFormat format : {InputFormat::messages, InputFormat::sharegpt, InputFormat::alpaca,
                                       InputFormat::prompt_completion})
        (void)loom::input_record_parse(format, record);
  });
  return 0;
}
