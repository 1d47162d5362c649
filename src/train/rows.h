// The rows a run trains on, and how a step's global batch becomes micro-batches.
//
// A rows file is JSONL, one row per line: {"tokens": [ids...], "loss_mask": [0/1...]},
// every row exactly row_tokens long, with an optional "position_ids" (HF's padding-free
// convention). Row stores built by `loom data build` are the other source
// (src/data/row_store.h).
//
// Two packings (docs/data.md):
//   rows      (the seed's): a row is one attention span; conversations run into each other.
//   isolated: a row holds several samples, each its own causal span with RoPE positions from
//             0, and a sample's first token is no target; the tokens after the last sample
//             are padding (no target, a span of their own that no sample attends to).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/decoder.h"

namespace loom {

struct RowSet {
  int64_t row_tokens = 0;
  int64_t rows = 0;
  std::vector<int32_t> tokens;     // [rows · row_tokens]
  std::vector<uint8_t> loss_mask;  // [rows · row_tokens], 0 or 1
  // Isolated packing only (empty for rows packing): row r's sample boundaries are
  // sample_bounds[sample_index[r] .. sample_index[r + 1]), b_0 = 0 < b_1 < ... < b_n ≤
  // row_tokens; sample k spans [b_k, b_(k+1)), and [b_n, row_tokens) is padding.
  std::vector<int64_t> sample_index;  // [rows + 1]
  std::vector<int32_t> sample_bounds;
  // rows_sha256 of docs/interface.md over these rows (a row store's manifest value, verified on
  // load; computed for a rows .jsonl), and the store manifest's tokenizer_sha256 as compact
  // JSON ("" for a .jsonl): what a resume checkpoint records (run_identity, train/resume.h).
  std::string rows_sha256;
  std::string tokenizer_sha256;

  const int32_t* row_tokens_ptr(int64_t r) const { return tokens.data() + r * row_tokens; }
  const uint8_t* row_mask_ptr(int64_t r) const { return loss_mask.data() + r * row_tokens; }
  bool isolated() const { return !sample_index.empty(); }
  // Row r's sample boundaries b_0..b_n (isolated packing).
  std::span<const int32_t> row_bounds(int64_t r) const {
    const auto begin = static_cast<size_t>(sample_index[static_cast<size_t>(r)]);
    const auto end = static_cast<size_t>(sample_index[static_cast<size_t>(r) + 1]);
    return std::span<const int32_t>(sample_bounds).subspan(begin, end - begin);
  }
  // Row r's targets [row_tokens]: position t predicts token t + 1 when t + 1 is in the same
  // sample (the same row for rows packing) and loss_mask[t + 1] is 1; else -1.
  void row_targets(int64_t r, int32_t* targets) const;
  // The positions of row r with a target.
  int64_t row_target_count(int64_t r) const;
  // n_r = max(row_target_count(r), 1): the row's count in the loss denominator.
  int64_t row_denominator(int64_t r) const { return std::max<int64_t>(row_target_count(r), 1); }
};

// rows_sha256 of the set's rows (row_store.h: boundaries included for isolated rows).
void rows_hash(RowSet& set);

// Reads a rows .jsonl. Every error is an InputError naming the file, line and field: bad
// JSON, a missing or mistyped field, a token id outside [0, vocab), a mask value not 0/1,
// mask length ≠ token length, a row whose length is not row_tokens, or an empty file; and
// position_ids of another length, not starting at 0, or not counting up by one from each 0.
// When any row has position_ids the rows are isolated; a row without them is one sample.
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
  bool routing_census = false;   // MicroBatch's
  double aux_loss_weight = 0.0;  // MicroBatch's
  // MicroBatch's LoRA dropout (model/lora.h LoraDropoutBatch; micro_batch_lora_dropout):
  // p, seed and step, and each token's (row in the step's global batch, index in the row) in
  // pairs; p = 0 and no pairs without dropout.
  double lora_dropout = 0;
  uint64_t lora_dropout_seed = 0;
  int64_t lora_dropout_step = 0;
  std::vector<int32_t> lora_dropout_tokens;
  // MicroBatch's, under context parallelism (micro_batch_context_split); empty otherwise.
  ContextSpans context;
  std::vector<int32_t> cp_row_order, cp_rank_order;
  MicroBatch view();
};

MicroBatchData micro_batch_build(const RowSet& data, const std::vector<int64_t>& row_indices);
// Sets the micro-batch's loss rows from its targets (decoder.h MicroBatch): the positions with
// a target, padded to a multiple of `granule` rows, or none when that is not fewer than T.
// micro_batch_build calls it with kLossRowsGranule; tests pass a small granule to reach the
// path with few tokens.
void loss_rows_build(MicroBatchData& batch, int64_t granule = kLossRowsGranule);

// LoRA dropout (train.lora.dropout = p > 0) in step `step` of a run seeded `seed`: the masks'
// token pairs of `batch` (micro_batch_build's of whole rows of `row_tokens`), whose rows are
// rows `positions` of the step's global batch (their places in step_rows' list, the same on
// every layout). Before micro_batch_context_split, which takes each CP rank's tokens' pairs.
void micro_batch_lora_dropout(MicroBatchData& batch, const std::vector<int64_t>& positions,
                              int64_t row_tokens, double p, uint64_t seed, int64_t step);

// Context parallelism: the micro-batch `batch` of whole rows of `row_tokens` (micro_batch_build's)
// becomes CP rank `cp_rank`'s part of it (parallel/context_split.h): its two chunks of each
// row with their targets (a chunk's last token predicts the next chunk's first, whichever
// rank holds it), their true positions, each one's keys among the whole micro-batch's, the
// gathered and row orders, and the loss rows of its own tokens (kLossRowsGranule). Nothing
// at cp = 1.
void micro_batch_context_split(MicroBatchData& batch, int64_t row_tokens, int64_t cp, int64_t cp_rank);

// The rows of step `step` (from 1): global_batch consecutive rows of the data, wrapping
// around at the end (the order is the row store's: it is already a seeded permutation).
std::vector<int64_t> step_rows(const RowSet& data, int64_t step, int64_t global_batch);

}  // namespace loom
