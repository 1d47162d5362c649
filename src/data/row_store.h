// The row store `loom data build` writes and `loom train` reads (memory-mapped).
// docs/data.md describes the format for other implementations.
//
// A folder of three files, four for isolated packing (train/rows.h):
//   tokens.bin     int32 little-endian, rows × row_tokens, row-major;
//   loss_mask.bin  uint8 (0 or 1), rows × row_tokens, row-major;
//   samples.bin    isolated packing only: per row, int32 little-endian n (its samples), then
//                  its n + 1 sample boundaries b_0 = 0 < b_1 < ... < b_n ≤ row_tokens (the
//                  tokens from b_n on are padding, loss mask 0);
//   manifest.json  format "loom-rows-1" (rows packing) or "loom-rows-2" (isolated), packing
//                  ("rows" or "isolated"; absent in older loom-rows-1 stores), rows, row_tokens,
//                  padding_tokens, supervised_token_ratio (loss-mask ones / (rows · row_tokens)),
//                  rows_sha256, files, then what the builder adds (seed, tokenizer_sha256, input_sha256,
//                  skipped conversations, ...).
// rows_sha256 = sha256 over the rows in order, each row its tokens as little-endian int32
// then its loss mask as one byte per token, then for isolated packing its samples.bin
// record (n and the boundaries, int32 little-endian) (docs/interface.md).
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
#include <span>
#include <string>
#include <vector>

#include "data/mapped_file.h"
#include "data/sha256.h"

namespace loom {

inline constexpr const char* kRowStoreFormat = "loom-rows-1";
inline constexpr const char* kRowStoreFormatPacked = "loom-rows-2";

class FileOutput;

// The longest row: 2^24 tokens (16 Mi, beyond any context trained today). Longer rows only
// end in allocations no machine has (a row's buffers and activations scale with it), so
// --row-tokens and workload.row_tokens are refused past it.
inline constexpr int64_t kMaxRowTokens = int64_t{1} << 24;

enum class RowPacking : uint8_t { rows, isolated };

// Adds a row's samples.bin record (n, then b_0..b_n) to a rows_sha256 in progress.
void row_bounds_hash(Sha256& sha, std::span<const int32_t> bounds);

// InputError when `dir` exists and is neither an empty folder nor a row store (what the
// writer may replace), so a caller can refuse it before long work.
void row_store_check_replaceable(const std::string& dir);

class RowStoreWriter {
 public:
  // Throws InputError when `dir` exists and is neither empty nor a row store, or row_tokens < 1.
  RowStoreWriter(const std::string& dir, int64_t row_tokens, RowPacking packing = RowPacking::rows);
  ~RowStoreWriter();  // without commit(): removes DIR.tmp
  RowStoreWriter(const RowStoreWriter&) = delete;
  RowStoreWriter& operator=(const RowStoreWriter&) = delete;

  // One row: row_tokens tokens and as many mask bytes (0 or 1); for isolated packing its
  // sample boundaries b_0..b_n as well.
  void append(const int32_t* tokens, const uint8_t* loss_mask, std::span<const int32_t> bounds = {});
  int64_t rows() const { return rows_; }

  // Writes manifest.json (the store's own fields, then `fields`, which must not repeat
  // them) and moves the store into place; returns the manifest. InputError for no rows.
  nlohmann::ordered_json commit(const nlohmann::ordered_json& fields);

 private:
  std::string dir_, tmp_dir_;
  int64_t row_tokens_;
  RowPacking packing_;
  int64_t rows_ = 0;
  int64_t mask_ones_ = 0;
  int64_t padding_tokens_ = 0;
  bool committed_ = false;
  Sha256 sha_;
  std::unique_ptr<FileOutput> tokens_out_, mask_out_, samples_out_;
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
  // Isolated packing (train/rows.h RowSet's fields of the same names): row r's boundaries
  // are sample_bounds()[sample_index()[r] .. sample_index()[r + 1]); both empty otherwise.
  bool isolated() const { return !sample_index_.empty(); }
  const std::vector<int64_t>& sample_index() const { return sample_index_; }
  const std::vector<int32_t>& sample_bounds() const { return sample_bounds_; }
  std::span<const int32_t> row_bounds(int64_t r) const {
    const auto begin = static_cast<size_t>(sample_index_[static_cast<size_t>(r)]);
    const auto end = static_cast<size_t>(sample_index_[static_cast<size_t>(r) + 1]);
    return std::span<const int32_t>(sample_bounds_).subspan(begin, end - begin);
  }

 private:
  RowStore() = default;
  // samples.bin into sample_index_ / sample_bounds_, each record checked ("sample check
  // failed": n ≥ 1, b_0 = 0 < b_1 < ... ≤ row_tokens, loss mask 0 on the padding).
  void read_samples(const std::string& path);
  nlohmann::ordered_json manifest_;
  int64_t rows_ = 0, row_tokens_ = 0;
  MappedFile tokens_file_, mask_file_;
  const int32_t* tokens_ = nullptr;
  const uint8_t* loss_mask_ = nullptr;
  std::vector<int64_t> sample_index_;
  std::vector<int32_t> sample_bounds_;
};

// {"tokenizer.json": sha256, "tokenizer_config.json": sha256} of a tokenizer folder (or of
// the folder holding a tokenizer.json path); tokenizer_config.json only when present.
nlohmann::ordered_json tokenizer_files_sha256(const std::string& path);

}  // namespace loom
