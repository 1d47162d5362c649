// The learning-rate schedule of Megatron's OptimizerParamScheduler, counted in samples (rows).
//
// D = steps × global_batch decay samples, W = warmup_fraction × D warmup samples (a double:
// 0.2 × 24 = 4.8). Iteration k (from 1) runs at the lr of n = global_batch × (k − 1) samples
// consumed, since Megatron advances its scheduler after each optimizer step:
//   W > 0 and n ≤ W:  lr = max_lr · n / W            (step 1 runs at lr 0)
//   decay "constant": lr = max_lr                     (also past D)
//   n > D:            lr = min_lr
//   otherwise r = (n − W) / (D − W) and lr = min_lr + c · (max_lr − min_lr) with
//     "cosine": c = ½ (cos(π r) + 1),  "linear": c = 1 − r.
// Note that the last iteration (k = steps) has n = D − global_batch, so it runs slightly above
// min_lr; only iterations past `steps` reach min_lr.
#pragma once

#include <cstdint>
#include <string>

namespace loom {

struct LrSchedule {
  double max_lr = 0;           // train.optimizer.lr
  double min_lr = 0;           // train.optimizer.min_lr
  std::string decay;           // train.optimizer.decay: "cosine" | "linear" | "constant"
  double warmup_fraction = 0;  // train.optimizer.warmup_fraction, in [0, 1)
  int64_t steps = 0;           // train.steps
  int64_t global_batch = 0;    // workload.global_batch (rows per step)

  // Throws InputError naming the recipe field: 0 ≤ min_lr ≤ max_lr, 0 ≤ warmup_fraction < 1
  // (Megatron asserts warmup < decay samples), steps ≥ 1, global_batch ≥ 1, a known decay.
  void validate() const;

  // The lr of iteration k ≥ 1, in double as Megatron computes it (TE receives it as float).
  // Validates first.
  double lr_at(int64_t iteration) const;
};

}  // namespace loom
