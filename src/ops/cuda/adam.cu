// The precision-aware AdamW over many tensors in one launch: one block per chunk of a
// tensor. The arithmetic is the CPU reference's (src/optim/adamw.cpp) operation for
// operation, with the intrinsics that forbid FMA contraction (__fmul_rn, __fadd_rn, ...), so
// both give the same bits; '/' and sqrtf are IEEE-rounded under nvcc's defaults.
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

__device__ inline float master_rebuild(uint16_t bits, int16_t rem) {
  uint32_t high = bits;
  if (rem < 0) high = (high - 1u) & 0xffffu;
  return __uint_as_float((high << 16) | static_cast<uint16_t>(rem));
}

__device__ inline void master_split(float master, uint16_t* bits, int16_t* rem) {
  const uint32_t raw = __float_as_uint(master);
  uint16_t high = static_cast<uint16_t>(raw >> 16);
  const int16_t low = static_cast<int16_t>(static_cast<uint16_t>(raw & 0xffffu));
  if (low < 0) high = static_cast<uint16_t>(high + 1u);
  *bits = high;
  *rem = low;
}

// One element, operation for operation as the CPU reference's adamw_update. Each operation
// is an explicit round-to-nearest intrinsic, so nvcc cannot contract a multiply and an add
// into an FMA (which rounds once) whatever -fmad says: the CPU side is built with
// -ffp-contract=off for the same reason.
__device__ inline void adamw_update(const AdamScalars& s, float decay, float g, float& p, float& m,
                                    float& v) {
  m = __fadd_rn(__fmul_rn(s.beta1, m), __fmul_rn(s.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(s.beta2, v), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
  const float m_unbiased = __fdiv_rn(m, s.bias_correction1);
  const float v_unbiased = __fdiv_rn(v, s.bias_correction2);
  const float denom = __fadd_rn(__fsqrt_rn(v_unbiased), s.eps);
  const float update = __fadd_rn(__fdiv_rn(m_unbiased, denom), __fmul_rn(decay, p));
  p = __fsub_rn(p, __fmul_rn(s.lr, update));
}

__global__ void adamw_kernel(uint16_t* param_bits, int16_t* remainder, const float* grad, float* m, float* v,
                             const AdamChunk* chunks, AdamScalars s, float grad_scale) {
  const AdamChunk chunk = chunks[blockIdx.x];
  const float decay = chunk.decay ? s.weight_decay : 0.0f;
  for (int64_t j = threadIdx.x; j < chunk.numel; j += blockDim.x) {
    const int64_t i = chunk.offset + j;
    float p = master_rebuild(param_bits[i], remainder[i]);
    float mi = m[i], vi = v[i];
    // Rounded before use (never contracted), as a scale pass would have stored it.
    adamw_update(s, decay, __fmul_rn(grad[i], grad_scale), p, mi, vi);
    m[i] = mi;
    v[i] = vi;
    master_split(p, &param_bits[i], &remainder[i]);
  }
}

__global__ void adamw_fp32_kernel(float* master, const float* grad, float* m, float* v,
                                  const AdamChunk* chunks, AdamScalars s) {
  const AdamChunk chunk = chunks[blockIdx.x];
  const float decay = chunk.decay ? s.weight_decay : 0.0f;
  for (int64_t j = threadIdx.x; j < chunk.numel; j += blockDim.x) {
    const int64_t i = chunk.offset + j;
    float p = master[i], mi = m[i], vi = v[i];
    adamw_update(s, decay, grad[i], p, mi, vi);
    master[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw_bf16_remainder(uint16_t* param_bits, int16_t* remainder, const float* grad, float* m, float* v,
                          const AdamChunk* chunks, int64_t chunk_count, AdamScalars scalars, float grad_scale,
                          cudaStream_t stream) {
  if (chunk_count == 0) return;
  adamw_kernel<<<static_cast<unsigned>(chunk_count), 512, 0, stream>>>(param_bits, remainder, grad, m, v,
                                                                       chunks, scalars, grad_scale);
  LOOM_LAUNCH_CHECK();
}

void adamw_fp32(float* master, const float* grad, float* m, float* v, const AdamChunk* chunks,
                int64_t chunk_count, AdamScalars scalars, cudaStream_t stream) {
  if (chunk_count == 0) return;
  adamw_fp32_kernel<<<static_cast<unsigned>(chunk_count), 512, 0, stream>>>(master, grad, m, v, chunks,
                                                                            scalars);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
