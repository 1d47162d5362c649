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

__device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// One element of the bf16 + remainder master, in place.
__device__ inline void adamw_element(const AdamScalars& s, float decay, float grad_scale, float g,
                                     uint16_t& bits, int16_t& rem, float& m, float& v) {
  float p = master_rebuild(bits, rem);
  // Rounded before use (never contracted), as a scale pass would have stored it.
  adamw_update(s, decay, __fmul_rn(g, grad_scale), p, m, v);
  master_split(p, &bits, &rem);
}

// Eight elements a thread with 16-byte accesses where the chunk's addresses allow them (every
// Qwen3 tensor starts at a multiple of 8 elements; a DP rank's slice may cut one anywhere):
// the weights' bits and the remainders are 2-byte values, which one at a time move 64 bytes a
// warp an instruction. The rest of the chunk, or all of an unaligned one, one at a time.
// Elements are independent, so the bits do not depend on which path took them.
__global__ void adamw_kernel(uint16_t* param_bits, int16_t* remainder, const float* grad, float* m, float* v,
                             const AdamChunk* chunks, AdamScalars s, float grad_scale) {
  const AdamChunk chunk = chunks[blockIdx.x];
  const float decay = chunk.decay ? s.weight_decay : 0.0f;
  const int64_t base = chunk.offset;
  const bool vector = aligned16(param_bits + base) && aligned16(remainder + base) && aligned16(grad + base) &&
                      aligned16(m + base) && aligned16(v + base);
  const int64_t vector_end = vector ? chunk.numel / 8 * 8 : 0;
  for (int64_t j = 8 * static_cast<int64_t>(threadIdx.x); j < vector_end;
       j += 8 * static_cast<int64_t>(blockDim.x)) {
    const int64_t i = base + j;
    alignas(16) uint16_t bits[8];
    alignas(16) int16_t rem[8];
    alignas(16) float g[8], mi[8], vi[8];
    *reinterpret_cast<uint4*>(bits) = *reinterpret_cast<const uint4*>(param_bits + i);
    *reinterpret_cast<uint4*>(rem) = *reinterpret_cast<const uint4*>(remainder + i);
    for (int h = 0; h < 2; ++h) {
      *reinterpret_cast<float4*>(g + 4 * h) = *reinterpret_cast<const float4*>(grad + i + 4 * h);
      *reinterpret_cast<float4*>(mi + 4 * h) = *reinterpret_cast<const float4*>(m + i + 4 * h);
      *reinterpret_cast<float4*>(vi + 4 * h) = *reinterpret_cast<const float4*>(v + i + 4 * h);
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) adamw_element(s, decay, grad_scale, g[k], bits[k], rem[k], mi[k], vi[k]);
    *reinterpret_cast<uint4*>(param_bits + i) = *reinterpret_cast<const uint4*>(bits);
    *reinterpret_cast<uint4*>(remainder + i) = *reinterpret_cast<const uint4*>(rem);
    for (int h = 0; h < 2; ++h) {
      *reinterpret_cast<float4*>(m + i + 4 * h) = *reinterpret_cast<const float4*>(mi + 4 * h);
      *reinterpret_cast<float4*>(v + i + 4 * h) = *reinterpret_cast<const float4*>(vi + 4 * h);
    }
  }
  for (int64_t j = vector_end + threadIdx.x; j < chunk.numel; j += blockDim.x) {
    const int64_t i = base + j;
    adamw_element(s, decay, grad_scale, grad[i], param_bits[i], remainder[i], m[i], v[i]);
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
