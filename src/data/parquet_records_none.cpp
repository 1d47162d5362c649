// ParquetRecords of a build without Apache Arrow (LOOM_PARQUET off): Parquet input refused.
#include "core/error.h"
#include "data/parquet_records.h"

namespace loom {

bool parquet_input_supported() {
  return false;
}

struct ParquetRecords::State {};

ParquetRecords::ParquetRecords(const std::string& path) {
  throw_input_error(path,
                    "this loom was built without Parquet support (scripts/setup.sh fetches Apache Arrow's "
                    "libraries into .deps/arrow; rebuild); expected JSONL");
}
ParquetRecords::~ParquetRecords() = default;
bool ParquetRecords::next(nlohmann::ordered_json*) {
  return false;
}
int64_t ParquetRecords::rows() const {
  return 0;
}

}  // namespace loom
