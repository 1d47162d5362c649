// `loom train`: the step loop of one run (docs/numerics.md), from a validated recipe: the engine
// of this rank (train/engine.h) on the recipe's device and layout, train_step
// (train/train_step.h) for each step, the resume (train/resume.h), the checkpoints
// (train/checkpoint_policy.h), and the outputs: metrics.jsonl, fp8_stats.jsonl, TensorBoard
// and the progress line (train/run_outputs.h), result.yaml and final/ (an HF checkpoint) in
// output_dir.
#pragma once

#include <cstdint>
#include <string>

#include "parallel/groups.h"
#include "recipe/recipe.h"

namespace loom {

// Fault injection for the tests of `loom train` (tests/train/test_faults.cpp,
// tests/parallel/test_nproc.cpp): `loom train` fills it once from its process's environment
// (each rank of --nproc N is a process started with the parent's environment); unset, nothing
// is injected.
struct TrainFaults {
  // LOOM_TEST_KILL_RANK=R: world rank R SIGKILLs itself after its groups are made, just before
  // the startup check (train/rank_setup.h).
  int kill_rank = -1;
  // LOOM_TEST_HANG_RANK=R: world rank R of a parallel run stops taking part after its first
  // step (alive, its connections open), so that the others time out in a collective of the next.
  int hang_rank = -1;
  // LOOM_TEST_CHECKPOINT_DELAY_MS=N: each checkpoint write pauses N ms between its state file and
  // its commit, so that a test can kill the process mid-save.
  int64_t checkpoint_delay_ms = 0;
};

struct TrainOptions {
  int64_t stop_at_step = 0;  // 0: run every step
  bool progress = true;      // one progress line per step on stderr
  // This rank's groups of a parallel layout (host memory; train/rank_setup.h makes
  // them): every rank calls train_run with its own, and tp·pp·cp·dp must be the world's
  // size. Rank 0 alone writes the outputs (metrics, tensorboard, checkpoints, final/,
  // result.yaml) and prints. nullptr, or a world of one: one rank.
  Groups* groups = nullptr;
  // GPU ranks of a parallel layout (train.device cuda): the same layout's groups over the
  // device world, which carry the engine's GPU tensors (rank_setup).
  Groups* device_groups = nullptr;
  // The CUDA engine runs cuDNN's SDPA backward one row a call (less workspace, a little
  // slower): `loom train` takes it from the plan (plan.h), which sets it when the rows of a
  // micro-batch in one call would not fit.
  bool attention_backward_by_row = false;
  TrainFaults faults;
};

struct TrainSummary {
  int64_t steps_run = 0;
  double final_loss = 0;
  std::string output_dir;
  bool correctness_failed = false;  // train.reference was given and a check failed
};

// The recipe's rules (recipe/rules.h recipe_rules) with what this machine can do (whether a
// CUDA engine runs here), as one InputError listing every violation (the ranks matching the
// layout is world_check's, train/rank_setup.h). `loom train --nproc N` checks it before
// starting any rank, so a refusal is one message, not N.
void train_check_supported(const Recipe& recipe);

TrainSummary train_run(const Recipe& recipe, const TrainOptions& options);

}  // namespace loom
