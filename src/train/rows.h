// The rows a run trains on, and how a step's global batch becomes micro-batches.
//
// A rows file is JSONL, one row per line: {"tokens": [ids...], "loss_mask": [0/1...]},
// every row exactly row_tokens long (fixed-row packing: no padding). Row stores built by
// `loom data build` are the other source (src/data/row_store.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/qwen3.h"

namespace loom {

struct RowSet {
  int64_t row_tokens = 0;
  int64_t rows = 0;
  std::vector<int32_t> tokens;     // [rows · row_tokens]
  std::vector<uint8_t> loss_mask;  // [rows · row_tokens], 0 or 1
  // rows_sha256 of docs/interface.md over these rows (a row store's manifest value, verified on
  // load; computed for a rows .jsonl), and the store manifest's tokenizer_sha256 as compact
  // JSON ("" for a .jsonl): what a resume checkpoint records (run_identity, train/resume.h).
  std::string rows_sha256;
  std::string tokenizer_sha256;

  const int32_t* row_tokens_ptr(int64_t r) const { return tokens.data() + r * row_tokens; }
  const uint8_t* row_mask_ptr(int64_t r) const { return loss_mask.data() + r * row_tokens; }
  // n_r = max(Σ_t mask[t + 1], 1): the row's token count in the loss denominator.
  int64_t row_denominator(int64_t r) const;
};

// Reads a rows .jsonl. Every error is an InputError naming the file and line: bad JSON,
// a missing or mistyped field, a token id outside [0, vocab), a mask value not 0/1, mask
// length ≠ token length, a row whose length is not row_tokens, or an empty file.
RowSet rows_load_jsonl(const std::string& path, int64_t row_tokens, int64_t vocab_size);

// Reads a row store folder (src/data/row_store.h) with every check of RowStore::open: the
// manifest, row_tokens, token ids below vocab_size, the file sizes and rows_sha256; when
// `run_tokenizer_dir` holds a tokenizer.json (the run's HF checkpoint folder), the store's
// tokenizer_sha256 must name the same tokenizer files. Refusals are InputErrors saying
// which check failed.
RowSet rows_load_store(const std::string& dir, int64_t row_tokens, int64_t vocab_size,
                       const std::string& run_tokenizer_dir);

// train.data.path: a folder is a row store, anything else a rows .jsonl.
RowSet rows_load(const std::string& path, int64_t row_tokens, int64_t vocab_size,
                 const std::string& run_tokenizer_dir);

// Host-side inputs of one micro-batch: ids, shifted targets (-1 where there is none) and
// row spans. Views into this struct become a MicroBatch.
struct MicroBatchData {
  std::vector<int32_t> ids;
  std::vector<int32_t> targets;
  RowSpans rows;
  std::vector<int32_t> loss_positions, loss_targets;  // MicroBatch's, empty when not used
  int64_t loss_rows = 0;
  MicroBatch view();
};

MicroBatchData micro_batch_build(const RowSet& data, const std::vector<int64_t>& row_indices);
// Sets the micro-batch's loss rows from its targets (qwen3.h MicroBatch): the positions with
// a target, padded to a multiple of `granule` rows, or none when that is not fewer than T.
// micro_batch_build calls it with kLossRowsGranule; tests pass a small granule to reach the
// path with few tokens.
void loss_rows_build(MicroBatchData& batch, int64_t granule = kLossRowsGranule);

// The rows of step `step` (from 1): global_batch consecutive rows of the data, wrapping
// around at the end (the order is the row store's: it is already a seeded permutation).
std::vector<int64_t> step_rows(const RowSet& data, int64_t step, int64_t global_batch);

}  // namespace loom
