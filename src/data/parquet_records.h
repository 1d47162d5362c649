// Parquet input for `loom data build`: a Parquet file's rows as the JSON records a JSONL line
// holds (docs/data.md), read with Apache Arrow's C++ library (libarrow, libparquet; the
// pyarrow wheel's, fetched by scripts/setup.sh). Each column is a record's key: strings,
// numbers, booleans and nulls as themselves, list columns as arrays, struct columns as
// objects (so a "messages" column of list<struct<role, content>> is the messages array), maps
// as objects. A build without Arrow (LOOM_PARQUET off) refuses Parquet input, saying so.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace loom {

// Whether this build reads Parquet (it was built with Arrow).
bool parquet_input_supported();

class ParquetRecords {
 public:
  // InputError naming the file when it is not a Parquet file Arrow can read.
  explicit ParquetRecords(const std::string& path);
  ~ParquetRecords();
  ParquetRecords(const ParquetRecords&) = delete;
  ParquetRecords& operator=(const ParquetRecords&) = delete;

  // The next row as a JSON object; false after the last. InputError naming the file for a
  // corrupt page or a column of a type that has no JSON form.
  bool next(nlohmann::ordered_json* record);
  int64_t rows() const;  // in the file

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace loom
