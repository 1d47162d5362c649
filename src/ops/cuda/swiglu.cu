// SwiGLU: out = silu(gate)·up on gate_up = [gate | up] per token; elementwise, fp32 math.
#include <algorithm>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

// Two neighbouring features per thread through bf16x2 loads and stores (ffn is even for
// every Qwen3 size): the kernel is memory-bound, and paired accesses halve the
// instructions per byte. Grid-stride loops over a grid that fills the GPU once.
__device__ inline float silu(float g) {
  return g / (1.0f + expf(-g));
}

__global__ void swiglu_forward_kernel(__nv_bfloat162* out, const __nv_bfloat162* gate_up, int64_t tokens,
                                      int64_t half_ffn) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * half_ffn;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / half_ffn, f = i % half_ffn;
    const float2 g = __bfloat1622float2(gate_up[t * 2 * half_ffn + f]);
    const float2 u = __bfloat1622float2(gate_up[t * 2 * half_ffn + half_ffn + f]);
    out[i] = __floats2bfloat162_rn(silu(g.x) * u.x, silu(g.y) * u.y);
  }
}

__device__ inline void swiglu_grad(float g, float u, float dy, float* dg, float* du) {
  const float sig = 1.0f / (1.0f + expf(-g));
  *dg = dy * u * sig * (1.0f + g * (1.0f - sig));
  *du = dy * g * sig;
}

__global__ void swiglu_backward_kernel(__nv_bfloat162* d_gate_up, const __nv_bfloat162* d_out,
                                       const __nv_bfloat162* gate_up, int64_t tokens, int64_t half_ffn) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < tokens * half_ffn;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / half_ffn, f = i % half_ffn;
    const float2 g = __bfloat1622float2(gate_up[t * 2 * half_ffn + f]);
    const float2 u = __bfloat1622float2(gate_up[t * 2 * half_ffn + half_ffn + f]);
    const float2 dy = __bfloat1622float2(d_out[i]);
    float dg0, du0, dg1, du1;
    swiglu_grad(g.x, u.x, dy.x, &dg0, &du0);
    swiglu_grad(g.y, u.y, dy.y, &dg1, &du1);
    d_gate_up[t * 2 * half_ffn + f] = __floats2bfloat162_rn(dg0, dg1);
    d_gate_up[t * 2 * half_ffn + half_ffn + f] = __floats2bfloat162_rn(du0, du1);
  }
}

unsigned grid_for(int64_t n) {
  constexpr int64_t kMaxBlocks = 132 * 16;  // 16 blocks of 256 threads per H100/H200 multiprocessor
  return static_cast<unsigned>(std::min(ceil_div(n, 256), kMaxBlocks));
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate_up, int64_t tokens, int64_t ffn, cudaStream_t stream) {
  LOOM_ASSERT(ffn % 2 == 0, "swiglu: the CUDA kernel needs an even ffn");
  const int64_t n = tokens * ffn / 2;
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), 256, 0, stream>>>(reinterpret_cast<__nv_bfloat162*>(out),
                                                         reinterpret_cast<const __nv_bfloat162*>(gate_up), tokens,
                                                         ffn / 2);
  LOOM_LAUNCH_CHECK();
}

void swiglu_backward(bf16* d_gate_up, const bf16* d_out, const bf16* gate_up, int64_t tokens, int64_t ffn,
                     cudaStream_t stream) {
  LOOM_ASSERT(ffn % 2 == 0, "swiglu: the CUDA kernel needs an even ffn");
  const int64_t n = tokens * ffn / 2;
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), 256, 0, stream>>>(
      reinterpret_cast<__nv_bfloat162*>(d_gate_up), reinterpret_cast<const __nv_bfloat162*>(d_out),
      reinterpret_cast<const __nv_bfloat162*>(gate_up), tokens, ffn / 2);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
