// SwiGLU: out = silu(gate)·up on gate_up = [gate | up] per token; elementwise, fp32 math.
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

// kWidth neighbouring features per thread: 8 through 16-byte accesses when ffn is a
// multiple of 8 (every Qwen3 size), else 2 through bf16x2 ones. The kernel is memory-bound,
// and wide accesses cut the instructions per byte. Grid-stride loops over a grid that fills
// the GPU once.
__device__ inline float silu(float g) {
  return g / (1.0f + expf(-g));
}

template <int kWidth>
__device__ inline void load_features(const bf16* p, float (&out)[kWidth]) {
  if constexpr (kWidth == 8) {
    load_bf16x8(p, out);
  } else {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    out[0] = f.x;
    out[1] = f.y;
  }
}

template <int kWidth>
__device__ inline void store_features(bf16* p, const float (&in)[kWidth]) {
  if constexpr (kWidth == 8)
    store_bf16x8(p, in);
  else
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(in[0], in[1]);
}

// `amax` (may be null): max |out| joined into it (ops.h out_amax).
template <int kWidth>
__global__ void swiglu_forward_kernel(bf16* out, float* amax, const bf16* gate_up, int64_t tokens,
                                      int64_t ffn) {
  const int64_t groups = ffn / kWidth;
  float most = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * groups;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / groups, f = (i % groups) * kWidth;
    float g[kWidth], u[kWidth], o[kWidth];
    load_features<kWidth>(gate_up + t * 2 * ffn + f, g);
    load_features<kWidth>(gate_up + t * 2 * ffn + ffn + f, u);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      o[e] = silu(g[e]) * u[e];
      most = fmaxf(most, stored_magnitude(o[e]));
    }
    store_features<kWidth>(out + t * ffn + f, o);
  }
  if (amax) block_amax_into(amax, most);
}

__device__ inline void swiglu_grad(float g, float u, float dy, float* dg, float* du) {
  const float sig = 1.0f / (1.0f + expf(-g));
  *dg = dy * u * sig * (1.0f + g * (1.0f - sig));
  *du = dy * g * sig;
}

template <int kWidth>
__global__ void swiglu_backward_kernel(bf16* d_gate_up, float* amax, const bf16* d_out, const bf16* gate_up,
                                       int64_t tokens, int64_t ffn) {
  const int64_t groups = ffn / kWidth;
  float most = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * groups;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / groups, f = (i % groups) * kWidth;
    float g[kWidth], u[kWidth], dy[kWidth], dg[kWidth], du[kWidth];
    load_features<kWidth>(gate_up + t * 2 * ffn + f, g);
    load_features<kWidth>(gate_up + t * 2 * ffn + ffn + f, u);
    load_features<kWidth>(d_out + t * ffn + f, dy);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      swiglu_grad(g[e], u[e], dy[e], &dg[e], &du[e]);
      most = fmaxf(most, fmaxf(stored_magnitude(dg[e]), stored_magnitude(du[e])));
    }
    store_features<kWidth>(d_gate_up + t * 2 * ffn + f, dg);
    store_features<kWidth>(d_gate_up + t * 2 * ffn + ffn + f, du);
  }
  if (amax) block_amax_into(amax, most);
}

}  // namespace

void swiglu_forward(bf16* out, float* amax, const bf16* gate_up, int64_t tokens, int64_t ffn,
                    cudaStream_t stream) {
  LOOM_ASSERT(ffn % 2 == 0, "swiglu: the CUDA kernel needs an even ffn");
  if (amax) LOOM_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (tokens * ffn == 0) return;
  if (ffn % 8 == 0)
    swiglu_forward_kernel<8>
        <<<elementwise_grid(tokens * ffn / 8), 256, 0, stream>>>(out, amax, gate_up, tokens, ffn);
  else
    swiglu_forward_kernel<2>
        <<<elementwise_grid(tokens * ffn / 2), 256, 0, stream>>>(out, amax, gate_up, tokens, ffn);
  LOOM_LAUNCH_CHECK();
}

void swiglu_backward(bf16* d_gate_up, float* amax, const bf16* d_out, const bf16* gate_up, int64_t tokens,
                     int64_t ffn, cudaStream_t stream) {
  LOOM_ASSERT(ffn % 2 == 0, "swiglu: the CUDA kernel needs an even ffn");
  if (amax) LOOM_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (tokens * ffn == 0) return;
  if (ffn % 8 == 0)
    swiglu_backward_kernel<8><<<elementwise_grid(tokens * ffn / 8), 256, 0, stream>>>(d_gate_up, amax, d_out,
                                                                                      gate_up, tokens, ffn);
  else
    swiglu_backward_kernel<2><<<elementwise_grid(tokens * ffn / 2), 256, 0, stream>>>(d_gate_up, amax, d_out,
                                                                                      gate_up, tokens, ffn);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
