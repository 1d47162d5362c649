// A linear layer's bias (Qwen2's q/k/v): its add after the projection's GEMM and its
// gradient, the column sums of the output's gradient. Both are memory-bound passes over
// [T, N] bf16; the gradient is summed over chunks of rows in a fixed order (deterministic,
// like every weight gradient).
#include <cstdint>

#include "core/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "ops/op_workspace.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
// Rows a block of the gradient sums: few enough chunks that their partials stay small, enough
// blocks (chunks × column blocks) to fill the GPU at training sizes.
constexpr int64_t kChunkRows = op_workspace::kBiasChunkRows;

// Element i of out [T, N]: out += bias[i % N], in fp32, rounded once.
__global__ void bias_add_kernel(bf16* out, const bf16* bias, int64_t n, int64_t width) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(__bfloat162float(out[i]) + __bfloat162float(bias[i % width]));
}

// Block (column block x, chunk y): partials[y, column] = Σ of the chunk's rows of one column
// a thread, consecutive threads on consecutive columns (coalesced rows).
__global__ void bias_backward_kernel(float* partials, const bf16* d_out, int64_t tokens, int64_t width) {
  const int64_t column = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (column >= width) return;
  const int64_t begin = blockIdx.y * kChunkRows;
  const int64_t end = begin + kChunkRows < tokens ? begin + kChunkRows : tokens;
  float sum = 0;
  for (int64_t t = begin; t < end; ++t) sum += __bfloat162float(d_out[t * width + column]);
  partials[blockIdx.y * width + column] = sum;
}

}  // namespace

void bias_add_forward(bf16* out, const bf16* bias, int64_t tokens, int64_t width, cudaStream_t stream) {
  const int64_t n = tokens * width;
  if (n == 0) return;
  bias_add_kernel<<<elementwise_grid(n), kThreads, 0, stream>>>(out, bias, n, width);
  LOOM_LAUNCH_CHECK();
}

int64_t bias_backward_scratch_bytes(int64_t tokens, int64_t width) {
  return op_workspace::bias_backward_bytes(tokens, width);
}

void bias_backward(float* d_bias, const bf16* d_out, int64_t tokens, int64_t width, Scratch scratch,
                   cudaStream_t stream) {
  LOOM_ASSERT(scratch.bytes >= bias_backward_scratch_bytes(tokens, width), "bias_backward scratch too small");
  if (tokens == 0 || width == 0) return;
  const int64_t chunks = ceil_div(tokens, kChunkRows);
  LOOM_ASSERT(chunks <= 65535, "bias_backward: too many rows for the grid's y dimension");
  float* partials = static_cast<float*>(scratch.data);
  const dim3 grid(static_cast<unsigned>(ceil_div(width, kThreads)), static_cast<unsigned>(chunks));
  bias_backward_kernel<<<grid, kThreads, 0, stream>>>(partials, d_out, tokens, width);
  LOOM_LAUNCH_CHECK();
  add_partials(d_bias, partials, chunks, width, stream);
}

}  // namespace loom::cuda
