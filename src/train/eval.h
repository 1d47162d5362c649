// Held-out evaluation (train.eval, docs/recipes.md): the loss over held-out rows with the
// current weights, forward only, the training loss's target and mask rules (train/rows.h,
// either packing), token-weighted over all of them: Σ nll / Σ targets.
//
// The rows [0, min(max_rows, rows)) are taken global_batch at a time; in each group DP rank
// d takes the rows d, d + dp, ... of it, cut into micro-batches first fit under
// max_tokens_per_gpu · cp (parallel/micro_batching.h step 1); under EP (spec.ep > 1) the
// ranks of an EP group run as many micro-batches as the one with the most, the others padded
// with micro-batches of no target, since each sparse layer's exchanges need every rank of
// the group. Every rank computes the same denominator from the rows, and the engine sums
// Σ nll over the world.
#pragma once

#include <cstdint>

#include "train/engine.h"
#include "train/metrics.h"
#include "train/rows.h"
#include "train/train_step.h"

namespace loom {

// The evaluation at step `step` (0: before any update); collective over the world. Its
// eval_time_s is the wall time of the call.
EvalMetrics eval_run(TrainEngine& engine, const RowSet& rows, int64_t max_rows, const StepSpec& spec,
                     int64_t step);

}  // namespace loom
