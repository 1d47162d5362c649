#include "train/eval.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "parallel/micro_batching.h"

namespace loom {

EvalMetrics eval_run(TrainEngine& engine, const RowSet& rows, int64_t max_rows, const StepSpec& spec,
                     int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t count = max_rows > 0 ? std::min(max_rows, rows.rows) : rows.rows;
  std::vector<int32_t> targets(static_cast<size_t>(rows.row_tokens));
  int64_t denominator = 0;
  for (int64_t r = 0; r < count; ++r) {
    rows.row_targets(r, targets.data());
    for (int32_t t : targets) denominator += t >= 0 ? 1 : 0;
  }
  const int64_t group = std::max<int64_t>(spec.global_batch, 1);
  const int64_t cap = spec.max_tokens_per_gpu * spec.cp;
  double nll = 0;
  for (int64_t begin = 0; begin < count; begin += group) {
    const int64_t end = std::min(begin + group, count);
    // DP rank d's micro-batches of the group: its rows d, d + dp, ..., first fit.
    const auto micro_batches_of = [&](int d) {
      std::vector<int64_t> rows_of;
      for (int64_t r = begin + d; r < end; r += spec.dp) rows_of.push_back(r);
      std::vector<std::vector<int64_t>> micro =
          micro_batches_first_fit(std::vector<int64_t>(rows_of.size(), rows.row_tokens), cap);
      for (std::vector<int64_t>& m : micro)
        for (int64_t& i : m) i = rows_of[static_cast<size_t>(i)];
      return micro;
    };
    std::vector<MicroBatchData> batches;
    for (const std::vector<int64_t>& picked : micro_batches_of(spec.dp_rank)) {
      batches.push_back(micro_batch_build(rows, picked));
      micro_batch_context_split(batches.back(), rows.row_tokens, spec.cp, spec.cp_rank);
    }
    // Under EP each sparse layer exchanges rows with every rank of the EP group, micro-batch
    // by micro-batch: each rank runs as many as the most of them, the rest a row of the group
    // with no target (its exchanges joined, its nll 0), so the loss is one rank's.
    size_t most = batches.size();
    if (spec.ep > 1)
      for (int d = spec.dp_rank / spec.ep * spec.ep; d < (spec.dp_rank / spec.ep + 1) * spec.ep; ++d)
        most = std::max(most, micro_batches_of(d).size());
    while (batches.size() < most) {
      MicroBatchData none = micro_batch_build(rows, {begin});
      std::fill(none.targets.begin(), none.targets.end(), -1);
      loss_rows_build(none);
      batches.push_back(std::move(none));
    }
    nll += engine.eval_micro_batches(std::move(batches));
  }
  EvalMetrics m;
  m.step = step;
  m.eval_tokens = denominator;
  // A loss over no targets is no number: NaN, written as null, which keep_best passes over
  // (0.0 here once won it).
  m.eval_loss =
      denominator > 0 ? nll / static_cast<double>(denominator) : std::numeric_limits<double>::quiet_NaN();
  m.eval_time_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return m;
}

}  // namespace loom
