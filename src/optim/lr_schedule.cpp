#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <sstream>

#include "core/error.h"

namespace loom {
namespace {

std::string format_number(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

}  // namespace

void LrSchedule::validate() const {
  // Negated comparisons so that NaN fails them too.
  if (!(min_lr >= 0.0) || !std::isfinite(min_lr)) {
    throw_input_error("train.optimizer.min_lr",
                      "found " + format_number(min_lr) + ", expected a finite learning rate >= 0");
  }
  if (!(max_lr >= min_lr) || !std::isfinite(max_lr)) {
    throw_input_error("train.optimizer.lr",
                      "found " + format_number(max_lr) +
                          ", expected a finite learning rate >= train.optimizer.min_lr (" +
                          format_number(min_lr) + ")");
  }
  if (!(warmup_fraction >= 0.0 && warmup_fraction < 1.0)) {
    throw_input_error("train.optimizer.warmup_fraction",
                      "found " + format_number(warmup_fraction) +
                          ", expected 0 <= warmup_fraction < 1 (warmup must end before the decay does)");
  }
  if (decay != "cosine" && decay != "linear" && decay != "constant") {
    throw_input_error("train.optimizer.decay", "found '" + decay + "', expected cosine, linear or constant");
  }
  if (steps < 1) throw_input_error("train.steps", "found " + std::to_string(steps) + ", expected >= 1");
  if (global_batch < 1) {
    throw_input_error("workload.global_batch", "found " + std::to_string(global_batch) + ", expected >= 1");
  }
}

// Megatron core 0.16 (training.py get_optimizer_param_scheduler with --train-iters and
// --lr-warmup-fraction): lr_decay_steps = train_iters × global_batch (int) and
// lr_warmup_steps = lr_warmup_fraction × lr_decay_steps, a Python float that is never rounded;
// OptimizerParamScheduler.get_lr compares the int sample count against it. The warmup there is
// init_lr + (max_lr − init_lr) · n / W with --lr-warmup-init 0, which is max_lr · n / W exactly.
// 'constant' is tested before the n > D clamp, so it stays at max_lr after D.
double LrSchedule::lr_at(int64_t iteration) const {
  validate();
  LOOM_ASSERT(iteration >= 1, "lr iterations count from 1");
  const int64_t decay_samples = steps * global_batch;
  const double warmup_samples = warmup_fraction * static_cast<double>(decay_samples);
  const int64_t n = global_batch * (iteration - 1);
  const double consumed = static_cast<double>(n);

  if (warmup_samples > 0.0 && consumed <= warmup_samples) return max_lr * consumed / warmup_samples;
  if (decay == "constant") return max_lr;
  if (n > decay_samples) return min_lr;
  const double ratio = (consumed - warmup_samples) / (static_cast<double>(decay_samples) - warmup_samples);
  const double coeff = decay == "linear" ? 1.0 - ratio : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return min_lr + coeff * (max_lr - min_lr);
}

}  // namespace loom
