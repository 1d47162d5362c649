#include "data/parquet_records.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>

#include <exception>

#include "core/error.h"

namespace loom {
namespace {

using ojson = nlohmann::ordered_json;

// The JSON value of element i of an array; a null struct field or column is left out of its
// object (what an absent JSONL key is; datasets' Parquet files hold a null for every key a
// row lacks).
ojson value_at(const arrow::Array& array, int64_t i, const std::string& where);

void fill_object(ojson* out, const arrow::StructArray& s, int64_t i, const std::string& where) {
  const auto& type = static_cast<const arrow::StructType&>(*s.type());
  for (int f = 0; f < type.num_fields(); ++f) {
    const std::shared_ptr<arrow::Array> child = s.field(f);
    if (child->IsNull(i)) continue;
    (*out)[type.field(f)->name()] = value_at(*child, i, where + "." + type.field(f)->name());
  }
}

template <typename ListArray>
ojson list_at(const ListArray& list, int64_t i, const std::string& where) {
  ojson out = ojson::array();
  const std::shared_ptr<arrow::Array> values = list.values();
  for (int64_t k = list.value_offset(i); k < list.value_offset(i) + list.value_length(i); ++k)
    out.push_back(value_at(*values, k, where + "[]"));
  return out;
}

ojson value_at(const arrow::Array& array, int64_t i, const std::string& where) {
  if (array.IsNull(i)) return nullptr;
  switch (array.type_id()) {
    case arrow::Type::NA: return nullptr;
    case arrow::Type::BOOL: return static_cast<const arrow::BooleanArray&>(array).Value(i);
    case arrow::Type::INT8: return static_cast<const arrow::Int8Array&>(array).Value(i);
    case arrow::Type::INT16: return static_cast<const arrow::Int16Array&>(array).Value(i);
    case arrow::Type::INT32: return static_cast<const arrow::Int32Array&>(array).Value(i);
    case arrow::Type::INT64: return static_cast<const arrow::Int64Array&>(array).Value(i);
    case arrow::Type::UINT8: return static_cast<const arrow::UInt8Array&>(array).Value(i);
    case arrow::Type::UINT16: return static_cast<const arrow::UInt16Array&>(array).Value(i);
    case arrow::Type::UINT32: return static_cast<const arrow::UInt32Array&>(array).Value(i);
    case arrow::Type::UINT64: return static_cast<const arrow::UInt64Array&>(array).Value(i);
    case arrow::Type::FLOAT:
      return static_cast<double>(static_cast<const arrow::FloatArray&>(array).Value(i));
    case arrow::Type::DOUBLE: return static_cast<const arrow::DoubleArray&>(array).Value(i);
    case arrow::Type::STRING: return std::string(static_cast<const arrow::StringArray&>(array).GetView(i));
    case arrow::Type::LARGE_STRING:
      return std::string(static_cast<const arrow::LargeStringArray&>(array).GetView(i));
    case arrow::Type::STRING_VIEW:
      return std::string(static_cast<const arrow::StringViewArray&>(array).GetView(i));
    case arrow::Type::LIST: return list_at(static_cast<const arrow::ListArray&>(array), i, where);
    case arrow::Type::LARGE_LIST: return list_at(static_cast<const arrow::LargeListArray&>(array), i, where);
    case arrow::Type::FIXED_SIZE_LIST:
      return list_at(static_cast<const arrow::FixedSizeListArray&>(array), i, where);
    case arrow::Type::STRUCT: {
      ojson out = ojson::object();
      fill_object(&out, static_cast<const arrow::StructArray&>(array), i, where);
      return out;
    }
    case arrow::Type::MAP: {
      const auto& map = static_cast<const arrow::MapArray&>(array);
      ojson out = ojson::object();
      for (int64_t k = map.value_offset(i); k < map.value_offset(i) + map.value_length(i); ++k) {
        const ojson key = value_at(*map.keys(), k, where + " key");
        if (!key.is_string())
          throw_input_error(where, "a map key that is not a string; expected JSON objects' keys");
        out[key.get<std::string>()] = value_at(*map.items(), k, where + "[" + key.get<std::string>() + "]");
      }
      return out;
    }
    case arrow::Type::DICTIONARY: {
      const auto& dict = static_cast<const arrow::DictionaryArray&>(array);
      return value_at(*dict.dictionary(), dict.GetValueIndex(i), where);
    }
    default:
      throw_input_error(
          where, "a column of type " + array.type()->ToString() +
                     ", which has no JSON form; expected strings, numbers, booleans, lists and structs");
  }
}

}  // namespace

bool parquet_input_supported() {
  return true;
}

struct ParquetRecords::State {
  std::string path;
  std::unique_ptr<parquet::arrow::FileReader> reader;
  std::unique_ptr<arrow::RecordBatchReader> batches;
  std::shared_ptr<arrow::RecordBatch> batch;
  int64_t row = 0;  // within batch
  int64_t rows = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw_input_error(path, "cannot read it as Parquet: " + what);
  }
  void check(const arrow::Status& status) const {
    if (!status.ok()) fail(status.ToString());
  }
};

ParquetRecords::ParquetRecords(const std::string& path) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.path = path;
  try {
    arrow::Result<std::shared_ptr<arrow::io::ReadableFile>> file = arrow::io::ReadableFile::Open(path);
    s.check(file.status());
    s.check(parquet::arrow::OpenFile(*file, arrow::default_memory_pool(), &s.reader));
    s.rows = s.reader->parquet_reader()->metadata()->num_rows();
    s.check(s.reader->GetRecordBatchReader(&s.batches));
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {  // parquet throws ParquetException for a corrupt footer
    s.fail(e.what());
  }
}

ParquetRecords::~ParquetRecords() = default;

int64_t ParquetRecords::rows() const {
  return state_->rows;
}

bool ParquetRecords::next(ojson* record) {
  State& s = *state_;
  try {
    while (!s.batch || s.row >= s.batch->num_rows()) {
      s.check(s.batches->ReadNext(&s.batch));
      s.row = 0;
      if (!s.batch) return false;
    }
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    s.fail(e.what());
  }
  *record = ojson::object();
  const arrow::Schema& schema = *s.batch->schema();
  for (int c = 0; c < s.batch->num_columns(); ++c) {
    const std::shared_ptr<arrow::Array> column = s.batch->column(c);
    if (column->IsNull(s.row)) continue;
    (*record)[schema.field(c)->name()] =
        value_at(*column, s.row, s.path + ": column " + schema.field(c)->name());
  }
  ++s.row;
  return true;
}

}  // namespace loom
