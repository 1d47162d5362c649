#include "train/train_step.h"

#include <algorithm>
#include <cmath>

#include "optim/grad_clip.h"
#include "parallel/micro_batching.h"

namespace loom {

std::vector<MicroBatchData> step_micro_batches(const RowSet& data, const std::vector<int64_t>& rows,
                                               const StepSpec& spec, int64_t step) {
  const MicroBatchPlan plan = micro_batches_plan(std::vector<int64_t>(rows.size(), data.row_tokens),
                                                 spec.max_tokens_per_gpu, spec.cp, spec.dp);
  std::vector<MicroBatchData> batches;
  for (const std::vector<int64_t>& micro : plan.per_rank[static_cast<size_t>(spec.dp_rank)]) {
    std::vector<int64_t> picked;
    for (int64_t i : micro) picked.push_back(rows[static_cast<size_t>(i)]);
    batches.push_back(micro_batch_build(data, picked));
    if (spec.lora_dropout > 0)
      micro_batch_lora_dropout(batches.back(), micro, data.row_tokens, spec.lora_dropout, spec.seed, step);
    micro_batch_context_split(batches.back(), data.row_tokens, spec.cp, spec.cp_rank);
    if (spec.loss_rows_granule > 0) loss_rows_build(batches.back(), spec.loss_rows_granule);
  }
  if (spec.routing_census) {
    // The backward forms the objective unscaled (Σ nll, divided by N = Σ n_r at the end). hf
    // adds coef times the mean over the step's B micro-batches (every DP rank's) of each
    // one's term: a weight of N / B; megatron adds each layer's term to Σ nll: weight 1.
    int64_t denominator = 0, global = 0;
    for (int64_t r : rows) denominator += data.row_denominator(r);
    for (const std::vector<std::vector<int64_t>>& rank : plan.per_rank)
      global += static_cast<int64_t>(rank.size());
    const double weight = spec.aux_loss.kind == MoeAuxLossKind::hf
                              ? static_cast<double>(denominator) / static_cast<double>(global)
                              : 1.0;
    for (MicroBatchData& b : batches) {
      b.routing_census = true;
      b.aux_loss_weight = weight;
    }
  }
  return batches;
}

StepResult train_step(TrainEngine& engine, const RowSet& data, int64_t step, float lr, const StepSpec& spec,
                      NonfiniteGuard* guard, const ParamTable& table,
                      const std::function<void()>& after_norm) {
  engine.zero_grads();
  const std::vector<int64_t> rows = step_rows(data, step, spec.global_batch);
  // Every rank holds the whole step's rows, so Σ n_r over the global batch (all DP ranks'
  // micro-batches) is summed here; the engine returns the step's global Σ nll.
  int64_t denominator = 0, targets = 0;
  for (int64_t r : rows) {
    const int64_t n = data.row_target_count(r);
    targets += n;
    denominator += std::max<int64_t>(n, 1);
  }
  const double nll = engine.micro_batches(step_micro_batches(data, rows, spec, step));
  StepResult result;
  if (spec.routing_census) result.routing = engine.routing_stats();
  // Per-token loss over the whole global batch: scale the summed gradient by 1/Σ n_r.
  engine.scale_grads(static_cast<float>(1.0 / static_cast<double>(denominator)));
  result.grad_norm = std::sqrt(engine.grad_sum_squares());
  // Over no targets Σ nll / Σ n_r would be 0 / B, a loss of 0.0 that looks like a perfect step:
  // NaN instead (null in metrics.jsonl, beside "no_targets": true). The guard checks the grad
  // norm alone then: no loss is no non-finite loss.
  result.no_targets = targets == 0;
  result.loss = result.no_targets ? std::nan("") : nll / static_cast<double>(denominator);
  if (after_norm) after_norm();
  result.skipped =
      guard && guard->skip_step(step, result.no_targets ? 0.0 : result.loss, result.grad_norm, engine, table);
  if (result.skipped) return result;
  const float clip = grad_clip_coefficient(result.grad_norm, spec.clip_grad);
  if (clip < 1.0f) engine.scale_grads(clip);
  // Adam counts its own updates: a skipped step is none (train/nonfinite.h).
  engine.optimizer_step(spec.adam, lr, step - (guard ? guard->skipped() : 0));
  return result;
}

}  // namespace loom
