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
    std::vector<int64_t> mine;
    for (int64_t r = begin + spec.dp_rank; r < std::min(begin + group, count); r += spec.dp)
      mine.push_back(r);
    std::vector<MicroBatchData> batches;
    const std::vector<int64_t> lengths(mine.size(), rows.row_tokens);
    for (const std::vector<int64_t>& micro : micro_batches_first_fit(lengths, cap)) {
      std::vector<int64_t> picked;
      for (int64_t i : micro) picked.push_back(mine[static_cast<size_t>(i)]);
      batches.push_back(micro_batch_build(rows, picked));
      micro_batch_context_split(batches.back(), rows.row_tokens, spec.cp, spec.cp_rank);
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
