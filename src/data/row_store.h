// The row store `loom data build` writes and `loom train` reads (memory-mapped).
//
// A folder of three files:
//   tokens.bin     int32 little-endian, rows × row_tokens, row-major;
//   loss_mask.bin  uint8 (0 or 1), rows × row_tokens, row-major;
//   manifest.json  format "loom-rows-1", rows, row_tokens, padding_tokens (0),
//                  supervised_token_ratio (loss-mask ones / tokens), rows_sha256 and what
//                  the builder adds (seed, tokenizer and input sha256, skipped conversations).
// rows_sha256 = sha256 over the rows in order, each row its tokens as little-endian int32
// then its loss mask as one byte per token (CONTRACT.md).
//
// The writer builds the store in DIR.tmp and renames it to DIR on commit (replacing an older
// row store there, never another kind of folder). The reader checks the manifest, the file
// sizes, every mask byte and token id, rows_sha256 and the tokenizer's files' sha256, and
// refuses the store with an InputError saying which check failed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "data/sha256.h"

namespace loom {

inline constexpr const char* kRowStoreFormat = "loom-rows-1";

class FileOutput;

class RowStoreWriter {
 public:
  // Throws InputError when `dir` exists and is not a row store, or row_tokens < 1.
  RowStoreWriter(const std::string& dir, int64_t row_tokens);
  ~RowStoreWriter();
  RowStoreWriter(const RowStoreWriter&) = delete;
  RowStoreWriter& operator=(const RowStoreWriter&) = delete;

  void append(const int32_t* tokens, const uint8_t* loss_mask);
  int64_t rows() const { return rows_; }

  // Writes manifest.json (`fields` first, then the store's own fields) and moves the store
  // into place; returns the manifest. Throws InputError for a store of no rows.
  nlohmann::ordered_json commit(const nlohmann::ordered_json& fields);

 private:
  std::string dir_, tmp_dir_;
  int64_t row_tokens_;
  int64_t rows_ = 0;
  int64_t mask_ones_ = 0;
  Sha256 sha_;
  std::unique_ptr<FileOutput> tokens_out_, mask_out_;
};

// What the reader checks beyond the store's own consistency.
struct RowStoreExpect {
  std::optional<int64_t> row_tokens;            // the recipe's workload.row_tokens
  std::optional<int64_t> vocab_size;            // token ids must be below it
  std::optional<nlohmann::ordered_json> tokenizer_sha256;  // tokenizer_files_sha256 of the run's tokenizer
  bool verify_rows_sha256 = true;               // reads every byte once
};

class RowStore {
 public:
  static RowStore open(const std::string& dir, const RowStoreExpect& expect = {});
  ~RowStore();
  RowStore(RowStore&&) noexcept;
  RowStore& operator=(RowStore&&) noexcept;

  int64_t rows() const { return rows_; }
  int64_t row_tokens() const { return row_tokens_; }
  const int32_t* tokens() const { return tokens_; }       // [rows × row_tokens]
  const uint8_t* loss_mask() const { return loss_mask_; }  // [rows × row_tokens]
  const int32_t* row_tokens_ptr(int64_t r) const { return tokens_ + r * row_tokens_; }
  const uint8_t* row_mask_ptr(int64_t r) const { return loss_mask_ + r * row_tokens_; }
  const nlohmann::ordered_json& manifest() const { return manifest_; }

 private:
  RowStore() = default;
  nlohmann::ordered_json manifest_;
  int64_t rows_ = 0, row_tokens_ = 0;
  const int32_t* tokens_ = nullptr;
  const uint8_t* loss_mask_ = nullptr;
  void* tokens_map_ = nullptr;
  void* mask_map_ = nullptr;
  size_t tokens_bytes_ = 0, mask_bytes_ = 0;
};

// {"tokenizer.json": sha256, "tokenizer_config.json": sha256} of a tokenizer folder (or of
// the folder holding a tokenizer.json path); tokenizer_config.json only when present.
nlohmann::ordered_json tokenizer_files_sha256(const std::string& path);

}  // namespace loom
