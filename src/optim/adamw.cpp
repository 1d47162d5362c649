#include "optim/adamw.h"

#include <cmath>

#include "core/error.h"
#include "core/parallel.h"
#include "optim/precision_master.h"

namespace loom {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per thread at least: ~20 flops each

// One element, operation for operation as TE's adam_update (ADAM_MODE_1). std::sqrt and '/'
// are correctly rounded, as CUDA's sqrtf and '/' are by default (-prec-sqrt, -prec-div).
inline void adamw_update(const AdamWStepScalars& s, float decay, float g, float& p, float& m, float& v) {
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  const float m_unbiased = m / s.bias_correction1;
  const float v_unbiased = v / s.bias_correction2;
  const float denom = std::sqrt(v_unbiased) + s.eps;
  const float update = m_unbiased / denom + decay * p;
  p = p - s.lr * update;
}

// Runs body(decay, begin, end) over each range's elements in threaded chunks.
template <typename Body>
void for_each_range(const AdamWConfig& cfg, const std::vector<ParamRange>& ranges, const Body& body) {
  for (const ParamRange& range : ranges) {
    LOOM_ASSERT(range.offset >= 0 && range.numel >= 0, "ParamRange needs offset >= 0 and numel >= 0");
    const float decay = range.decay ? cfg.weight_decay : 0.0f;
    parallel_for(range.numel, kGrain,
                 [&](int64_t begin, int64_t end) { body(decay, range.offset + begin, range.offset + end); });
  }
}

}  // namespace

float adamw_bias_correction(float beta, int64_t step) {
  return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
}

AdamWStepScalars adamw_step_scalars(const AdamWConfig& cfg, float lr, int64_t step) {
  LOOM_ASSERT(step >= 1, "Adam steps count from 1");
  return {cfg.beta1,
          1.0f - cfg.beta1,
          cfg.beta2,
          1.0f - cfg.beta2,
          adamw_bias_correction(cfg.beta1, step),
          adamw_bias_correction(cfg.beta2, step),
          cfg.eps,
          lr};
}

void adamw_step(const AdamWConfig& cfg, float lr, int64_t step, const std::vector<ParamRange>& ranges,
                float* master, const float* grad, float* m, float* v) {
  const AdamWStepScalars s = adamw_step_scalars(cfg, lr, step);
  for_each_range(cfg, ranges, [&](float decay, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) adamw_update(s, decay, grad[i], master[i], m[i], v[i]);
  });
}

void adamw_step_bf16_remainder(const AdamWConfig& cfg, float lr, int64_t step,
                               const std::vector<ParamRange>& ranges, uint16_t* param_bf16_bits,
                               int16_t* remainder, const float* grad, float* m, float* v, float grad_scale) {
  const AdamWStepScalars s = adamw_step_scalars(cfg, lr, step);
  for_each_range(cfg, ranges, [&](float decay, int64_t begin, int64_t end) {
    // A local copy: read through the lambda's reference, the factor might alias m or v, and
    // GCC would leave the loop scalar (2.8× slower, docs/offload.md).
    const float scale = grad_scale;
    for (int64_t i = begin; i < end; ++i) {
      float p = master_rebuild(param_bf16_bits[i], remainder[i]);
      // A float product under -ffp-contract=off: rounded, as a scale pass would have stored it.
      adamw_update(s, decay, grad[i] * scale, p, m[i], v[i]);
      master_split(p, &param_bf16_bits[i], &remainder[i]);
    }
  });
}

}  // namespace loom
