// SwiGLU: out = silu(gate)·up on gate_up = [gate | up] per token; elementwise, fp32 math.
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

__global__ void swiglu_forward_kernel(bf16* out, const bf16* gate_up, int64_t tokens, int64_t ffn) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * ffn) return;
  const int64_t t = i / ffn, f = i % ffn;
  const float g = __bfloat162float(gate_up[t * 2 * ffn + f]);
  const float u = __bfloat162float(gate_up[t * 2 * ffn + ffn + f]);
  out[i] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
}

__global__ void swiglu_backward_kernel(bf16* d_gate_up, const bf16* d_out, const bf16* gate_up,
                                       int64_t tokens, int64_t ffn) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= tokens * ffn) return;
  const int64_t t = i / ffn, f = i % ffn;
  const float g = __bfloat162float(gate_up[t * 2 * ffn + f]);
  const float u = __bfloat162float(gate_up[t * 2 * ffn + ffn + f]);
  const float dy = __bfloat162float(d_out[i]);
  const float sig = 1.0f / (1.0f + expf(-g));
  d_gate_up[t * 2 * ffn + f] = __float2bfloat16(dy * u * sig * (1.0f + g * (1.0f - sig)));
  d_gate_up[t * 2 * ffn + ffn + f] = __float2bfloat16(dy * g * sig);
}

}  // namespace

void swiglu_forward(bf16* out, const bf16* gate_up, int64_t tokens, int64_t ffn, cudaStream_t stream) {
  const int64_t n = tokens * ffn;
  if (n == 0) return;
  swiglu_forward_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, stream>>>(out, gate_up, tokens,
                                                                                     ffn);
  LOOM_LAUNCH_CHECK();
}

void swiglu_backward(bf16* d_gate_up, const bf16* d_out, const bf16* gate_up, int64_t tokens, int64_t ffn,
                     cudaStream_t stream) {
  const int64_t n = tokens * ffn;
  if (n == 0) return;
  swiglu_backward_kernel<<<static_cast<unsigned>(ceil_div(n, 256)), 256, 0, stream>>>(d_gate_up, d_out,
                                                                                      gate_up, tokens, ffn);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
