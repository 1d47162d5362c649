// One optimizer step of a run, the one step `loom train` and the tests run (the numerics of
// docs/numerics.md):
//   the step's rows → this DP rank's micro-batches (slime's plan, parallel/micro_batching.h)
//   → forward and backward of each, main grads accumulating the unscaled Σ nll gradient, the
//   grads reduced over the layout → scale by 1/Σ n_r over the global batch → grad norm (logged
//   before clipping) → the non-finite check → clip → AdamW at the schedule's lr.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/param_table.h"
#include "optim/adamw.h"
#include "train/engine.h"
#include "train/nonfinite.h"
#include "train/rows.h"

namespace loom {

struct StepSpec {
  int64_t global_batch = 0;
  int64_t max_tokens_per_gpu = 0;
  int cp = 1;
  int cp_rank = 0;  // this rank's: its two chunks of each row (parallel/context_split.h)
  int dp = 1;
  int dp_rank = 0;  // this rank's
  int ep = 1;       // layout.ep: EP groups of ep consecutive DP ranks
  AdamWConfig adam;
  double clip_grad = 1.0;
  // The granule of the micro-batches' loss rows (loss_rows_build); 0 keeps
  // micro_batch_build's. Tests set a small one to reach the loss rows with few tokens.
  int64_t loss_rows_granule = 0;
  // A mixture of experts: every micro-batch takes the routing census (StepResult::routing),
  // and the load-balancing loss (if any) is weighted into the step's objective.
  bool routing_census = false;
  MoeAuxLoss aux_loss;
  // LoRA dropout (train.lora.dropout; model/lora.h LoraDropoutBatch): p > 0 draws each training
  // micro-batch's masks from train.seed, the step and its tokens' places in the step's batch.
  double lora_dropout = 0;
  uint64_t seed = 0;
};

struct StepResult {
  double loss = 0;  // Σ nll / Σ n over the global batch; NaN when no_targets
  // No position of the global batch has a target (every loss mask 0): there is no loss, and
  // the gradient is zero.
  bool no_targets = false;
  double grad_norm = 0;
  bool skipped = false;  // non-finite, and the guard skipped the update
  RoutingStats routing;  // with StepSpec::routing_census
};

// This DP rank's micro-batches of step `step`'s rows (under CP, this CP rank's part of each), with the
// routing census and the aux loss's weight, and LoRA dropout's tokens, where the spec asks for them.
std::vector<MicroBatchData> step_micro_batches(const RowSet& data, const std::vector<int64_t>& rows,
                                               const StepSpec& spec, int64_t step);

// Step `step` of the run on `engine` at learning rate `lr`. `guard` (may be null: no check)
// sees the loss and grad norm before the update and counts the skipped steps (Adam's step
// is `step` minus those). `after_norm` (may be empty) runs once the grads are scaled and
// their norm taken, before the clip: where tests read them.
StepResult train_step(TrainEngine& engine, const RowSet& data, int64_t step, float lr, const StepSpec& spec,
                      NonfiniteGuard* guard, const ParamTable& table,
                      const std::function<void()>& after_norm = {});

}  // namespace loom
