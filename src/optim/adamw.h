// AdamW with Megatron + TransformerEngine FusedAdam semantics (adam_w_mode, bias correction),
// on flat fp32 arrays that the caller owns (this rank's shard: master, grad, m, v all indexed
// alike). Per element, in fp32 and in this order (TE adam.cu, ADAM_MODE_1):
//   m = β1·m + (1 − β1)·g
//   v = β2·v + (1 − β2)·g·g                      ((1 − β2)·g first, then ·g)
//   upd = (m / bc1) / (sqrt(v / bc2) + eps) + wd·master
//   master = master − lr·upd
// with bc1 = 1 − β1^t, bc2 = 1 − β2^t (adamw_bias_correction) and t the step, from 1.
// wd is cfg.weight_decay on ranges marked decay and 0 elsewhere: Megatron gives the no-decay
// group (1-D params: norms) weight_decay 0.0, which TE still multiplies in (0·master).
// Elementwise, so the result does not depend on the thread count.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.98f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// Elements [offset, offset + numel) of the flat arrays; decay: apply cfg.weight_decay.
struct ParamRange {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = true;
};

// 1 − β^t as TE computes it on the host: std::pow(float, int) promotes to double, and the
// result is stored as float (multi_tensor_adam_*_cuda, bias_correction1/2).
float adamw_bias_correction(float beta, int64_t step);

// A step's scalars, formed once on the host for every implementation of the update (the
// CPU loops here, the CUDA kernel's cuda::AdamScalars): TE forms the bias corrections on
// the host and 1 − β in the kernel, the same float values.
struct AdamWStepScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction1, bias_correction2, eps, lr;
};
AdamWStepScalars adamw_step_scalars(const AdamWConfig& cfg, float lr, int64_t step);

// One step over `ranges` of master[], updating m[] and v[]. lr: the schedule's lr as float
// (TE's binding takes a float). step: t ≥ 1.
void adamw_step(const AdamWConfig& cfg, float lr, int64_t step, const std::vector<ParamRange>& ranges,
                float* master, const float* grad, float* m, float* v);

// The same step on the precision-aware master (optim/precision_master.h): rebuilds each fp32
// master from its bf16 weight bits and int16 remainder, updates it exactly as adamw_step, and
// splits it back. The rebuilt masters equal adamw_step's on an fp32 copy, bit for bit.
// grad_scale: the update uses g = grad[i] · grad_scale, rounded to fp32 before use, so it is
// bit for bit a pass of grad[i] *= grad_scale followed by the step (a GPU engine's pending
// grad clip, applied here instead of in a pass of its own over the grads); 1 changes no bit.
void adamw_step_bf16_remainder(const AdamWConfig& cfg, float lr, int64_t step,
                               const std::vector<ParamRange>& ranges, uint16_t* param_bf16_bits,
                               int16_t* remainder, const float* grad, float* m, float* v,
                               float grad_scale = 1.0f);

}  // namespace loom
