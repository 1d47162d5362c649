// A rows .jsonl (train/rows.h, with position_ids) through rows_load_jsonl at row_tokens 20 and a
// vocabulary of 96 ids (the seeds': tests/golden's tiny models); the rows it accepts are then made into a
// micro-batch, as a step does.
#include <cstdint>
#include <numeric>
#include <string_view>

#include "fuzz_input.h"
#include "train/rows.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loom::fuzz::ScratchDir scratch;
  const std::string path =
      scratch.write("rows.jsonl", std::string_view(reinterpret_cast<const char*>(data), size));
  loom::fuzz::expect_parsed_or_input_error([&] {
    const loom::RowSet rows = loom::rows_load_jsonl(path, 20, 96);
    std::vector<int64_t> all(static_cast<size_t>(rows.rows));
    std::iota(all.begin(), all.end(), int64_t{0});
    loom::micro_batch_build(rows, all);
  });
  return 0;
}
