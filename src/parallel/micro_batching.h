// Micro-batching of one step's global batch, as slime does it with
// --use-dynamic-batch-size (slime/utils/dp_schedule.py build_dp_schedule, with
// first_fit_pack and expand_bins_by_splitting of slime/utils/seqlen_balancing.py; the
// seed's slime a897e1f, balance_data and balance_by_flops off). "Pack first, distribute
// second":
//
// 1. First fit, in row order: each row goes into the first micro-batch whose tokens plus
//    its own stay ≤ cap = max_tokens_per_gpu · cp, else opens a new one. (A row longer
//    than the cap gets a micro-batch of its own; loom's recipe check refuses such rows.)
// 2. Equal counts: the number of micro-batches K is raised to a multiple of dp (at least
//    dp) by splitting, while K is short, the micro-batch with the most tokens among those
//    of two or more rows (ties: the later one) into two halves: its rows by length,
//    longest first (stable), each to the half with fewer tokens so far (ties: the first);
//    the first half stays in place, the second is appended. Halves never exceed the cap.
//    If every micro-batch is down to one row and K is still short, it is an error.
// 3. Round robin: DP rank d gets micro-batches d, d + dp, d + 2·dp, ... in that order, so
//    every DP rank runs K / dp micro-batches (the pipeline needs the same count on all).
//
// Rows inside a micro-batch keep the order step 1 put them in (step 2's halves are in
// their longest-first order). With fixed-length rows of row_tokens and cap = n·row_tokens
// this is consecutive groups of n rows.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

// Step 1 alone: micro-batches as lists of indices into `row_lengths`.
std::vector<std::vector<int64_t>> micro_batches_first_fit(const std::vector<int64_t>& row_lengths,
                                                          int64_t cap);

struct MicroBatchPlan {
  // per_rank[d][k]: the rows (indices into the step's rows, 0..rows-1) of DP rank d's k-th
  // micro-batch.
  std::vector<std::vector<std::vector<int64_t>>> per_rank;
  // Micro-batches per DP rank, the same on every rank.
  int num_microbatches() const { return per_rank.empty() ? 0 : static_cast<int>(per_rank.front().size()); }
};

// Steps 1-3 over the token counts of one step's rows, in the step's order. Throws
// InputError (naming workload.global_batch and layout.dp) when there are fewer rows than
// DP ranks or the micro-batches cannot be split into a multiple of dp.
MicroBatchPlan micro_batches_plan(const std::vector<int64_t>& row_lengths, int64_t max_tokens_per_gpu, int cp,
                                  int dp);

}  // namespace loom
