// `loom train`: the step loop of one run (SEMANTICS.md), from a validated recipe.
//
// Per step: the global batch's rows → micro-batches of ≤ max_tokens_per_gpu → forward and
// backward of each, main grads accumulating the unscaled Σ nll gradient → scale by
// 1/Σ_r n_r → grad norm (logged before clipping) → clip → AdamW at the schedule's lr.
// Writes metrics.jsonl, result.yaml and final/ (an HF checkpoint) into output_dir.
#pragma once

#include <cstdint>
#include <string>

#include "recipe/recipe.h"

namespace loom {

struct TrainOptions {
  int64_t stop_at_step = 0;  // 0: run every step
  bool progress = true;      // one progress line per step on stderr
};

struct TrainSummary {
  int64_t steps_run = 0;
  double final_loss = 0;
  std::string output_dir;
  bool correctness_failed = false;  // train.reference was given and a check failed
};

TrainSummary train_run(const Recipe& recipe, const TrainOptions& options);

}  // namespace loom
