// The row store `loom data build` writes and `loom train` reads (memory-mapped).
// docs/data.md describes the format for other implementations.
//
// A folder of three files:
//   tokens.bin     int32 little-endian, rows × row_tokens, row-major;
//   loss_mask.bin  uint8 (0 or 1), rows × row_tokens, row-major;
//   manifest.json  format "loom-rows-1", rows, row_tokens, padding_tokens (0),
//                  supervised_token_ratio (loss-mask ones / (rows · row_tokens)), rows_sha256,
//                  files, then what the builder adds (seed, tokenizer_sha256, input_sha256,
//                  skipped conversations, ...).
// rows_sha256 = sha256 over the rows in order, each row its tokens as little-endian int32
// then its loss mask as one byte per token (docs/interface.md).
//
// The writer builds the store in DIR.tmp and renames it to DIR on commit (replacing an older
// row store there, never another kind of folder). The reader checks, in this order, the
// manifest, the run's expectations (row_tokens, tokenizer files), the file sizes, every
// mask byte and token id, and rows_sha256, and refuses the store with an InputError that
// names the check that failed ("size check failed: ...", "rows_sha256 check failed: ...").
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "data/mapped_file.h"
#include "data/sha256.h"

namespace loom {

inline constexpr const char* kRowStoreFormat = "loom-rows-1";

class FileOutput;

// InputError when `dir` exists and is neither an empty folder nor a row store (what the
// writer may replace), so a caller can refuse it before long work.
void row_store_check_replaceable(const std::string& dir);

class RowStoreWriter {
 public:
  // Throws InputError when `dir` exists and is neither empty nor a row store, or row_tokens < 1.
  RowStoreWriter(const std::string& dir, int64_t row_tokens);
  ~RowStoreWriter();  // without commit(): removes DIR.tmp
  RowStoreWriter(const RowStoreWriter&) = delete;
  RowStoreWriter& operator=(const RowStoreWriter&) = delete;

  // One row: row_tokens tokens and as many mask bytes (0 or 1).
  void append(const int32_t* tokens, const uint8_t* loss_mask);
  int64_t rows() const { return rows_; }

  // Writes manifest.json (the store's own fields, then `fields`, which must not repeat
  // them) and moves the store into place; returns the manifest. InputError for no rows.
  nlohmann::ordered_json commit(const nlohmann::ordered_json& fields);

 private:
  std::string dir_, tmp_dir_;
  int64_t row_tokens_;
  int64_t rows_ = 0;
  int64_t mask_ones_ = 0;
  bool committed_ = false;
  Sha256 sha_;
  std::unique_ptr<FileOutput> tokens_out_, mask_out_;
};

// What the reader checks beyond the store's own consistency.
struct RowStoreExpect {
  std::optional<int64_t> row_tokens;  // the recipe's workload.row_tokens
  std::optional<int64_t> vocab_size;  // token ids must be below it
  // tokenizer_files_sha256() of the run's tokenizer: the store's tokenizer_sha256 must name
  // the same files with the same digests.
  std::optional<nlohmann::ordered_json> tokenizer_sha256;
  bool verify_rows_sha256 = true;  // reads every byte once
};

class RowStore {
 public:
  static RowStore open(const std::string& dir, const RowStoreExpect& expect = {});

  int64_t rows() const { return rows_; }
  int64_t row_tokens() const { return row_tokens_; }
  const int32_t* tokens() const { return tokens_; }        // [rows × row_tokens]
  const uint8_t* loss_mask() const { return loss_mask_; }  // [rows × row_tokens], 0 or 1
  const int32_t* row_tokens_ptr(int64_t r) const { return tokens_ + r * row_tokens_; }
  const uint8_t* row_mask_ptr(int64_t r) const { return loss_mask_ + r * row_tokens_; }
  const nlohmann::ordered_json& manifest() const { return manifest_; }

 private:
  RowStore() = default;
  nlohmann::ordered_json manifest_;
  int64_t rows_ = 0, row_tokens_ = 0;
  MappedFile tokens_file_, mask_file_;
  const int32_t* tokens_ = nullptr;
  const uint8_t* loss_mask_ = nullptr;
};

// {"tokenizer.json": sha256, "tokenizer_config.json": sha256} of a tokenizer folder (or of
// the folder holding a tokenizer.json path); tokenizer_config.json only when present.
nlohmann::ordered_json tokenizer_files_sha256(const std::string& path);

}  // namespace loom
