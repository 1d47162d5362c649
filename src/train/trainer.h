// `loom train`: the step loop of one run (SEMANTICS.md), from a validated recipe.
//
// Per step: the global batch's rows → micro-batches of ≤ max_tokens_per_gpu → forward and
// backward of each, main grads accumulating the unscaled Σ nll gradient → scale by
// 1/Σ_r n_r → grad norm (logged before clipping) → clip → AdamW at the schedule's lr.
// Writes metrics.jsonl, result.yaml and final/ (an HF checkpoint) into output_dir.
// With a world of ranks (TrainOptions::world) each step's rows are planned into
// micro-batches per DP rank (parallel/micro_batching.h) and run on the parallel CPU engine.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/comm.h"
#include "recipe/recipe.h"

namespace loom {

struct TrainOptions {
  int64_t stop_at_step = 0;  // 0: run every step
  bool progress = true;      // one progress line per step on stderr
  // The ranks of a parallel layout (train.device cpu): every rank calls train_run with its
  // end of the world, whose size must be tp·pp·cp·dp. Rank 0 alone writes the outputs
  // (metrics, tensorboard, checkpoints, final/, result.yaml) and prints. nullptr: one rank.
  Comm* world = nullptr;
};

struct TrainSummary {
  int64_t steps_run = 0;
  double final_loss = 0;
  std::string output_dir;
  bool correctness_failed = false;  // train.reference was given and a check failed
};

TrainSummary train_run(const Recipe& recipe, const TrainOptions& options);

}  // namespace loom
