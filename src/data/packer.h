// The two packings of `loom data build` (docs/data.md; train/rows.h says what each means
// to training).
//
// Fixed-row packing (docs/numerics.md, "Data"): conversations, in a seeded global permutation,
// concatenated with the EOS token between them (loss mask 0), cut into consecutive rows of
// row_tokens tokens; a row with no supervised target is skipped; nothing is padded (the
// tail that does not fill a row is dropped).
//
// A row's supervised targets are the positions t >= 1 with loss_mask[t] = 1 (position t - 1
// predicts token t of the same row; token 0 is no row's target), so a row is kept when
// sum(loss_mask[1:]) > 0.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace loom {

// The seeded permutation of [0, n), reproducible from this description alone:
//   state = seed; next() = SplitMix64: state += 0x9E3779B97F4A7C15; z = state;
//     z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
//     return z ^ (z >> 31)   (all arithmetic mod 2^64);
//   p = [0, 1, ..., n-1]; for i = n-1 down to 1: j = (next() * (i + 1)) >> 64 (the high
//     half of the 128-bit product), swap p[i], p[j].
// Conversation k of the packed stream is input conversation p[k].
std::vector<uint64_t> data_permutation(uint64_t n, uint64_t seed);

struct PackStats {
  int64_t conversations = 0;
  int64_t rows = 0;                 // rows kept
  int64_t rows_without_target = 0;  // full rows skipped: no supervised target
  int64_t tail_tokens_dropped = 0;  // the last partial row
  int64_t supervised_tokens = 0;    // loss_mask ones in the kept rows
};

class RowPacker {
 public:
  // sink(tokens, loss_mask) receives each kept row, row_tokens of each.
  using RowSink = std::function<void(const int32_t* tokens, const uint8_t* loss_mask)>;
  RowPacker(int64_t row_tokens, int32_t eos_id, RowSink sink);

  // Appends one conversation (an EOS with mask 0 first, unless it is the first one).
  void add(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask);
  // Drops the partial tail row; the counts of the whole stream.
  PackStats finish();

 private:
  void push(int32_t token, uint8_t mask);

  int64_t row_tokens_;
  int32_t eos_id_;
  RowSink sink_;
  std::vector<int32_t> tokens_;
  std::vector<uint8_t> mask_;
  PackStats stats_;
};

// Isolated packing: whole conversations binned into rows of at most row_tokens tokens,
// never split, seeded best-fit decreasing:
//   1. conversations longer than row_tokens are dropped, or with truncate cut to their first
//      row_tokens tokens;
//   2. the rest are taken in the order data_permutation(C, seed) gives, stably sorted by
//      length, longest first;
//   3. each goes into the open row with the least free space that holds it (of equals, the
//      row opened first), or opens a new row;
//   4. the rows, each with its conversations in the order they were placed, are put in the
//      order data_permutation(rows, seed + 1) gives (training reads them in store order).
// The builder pads each row's tail (EOS, loss mask 0) and drops rows without a target.
enum class TooLong : uint8_t { drop, truncate };

struct IsolatedPlan {
  std::vector<std::vector<uint64_t>> rows;  // conversation indices of each row, in order
  int64_t too_long_dropped = 0;
  int64_t too_long_truncated = 0;
};

IsolatedPlan isolated_pack_plan(std::span<const uint64_t> lengths, int64_t row_tokens, TooLong too_long,
                                uint64_t seed);

}  // namespace loom
