// RMSNorm forward (plain and with the residual add fused in front) and backward.
// One block per token: hidden sizes are 1,024 to 5,120, so a 256-thread block reads a row
// in a few coalesced passes and the row's sum of squares is one block reduction.
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
// Blocks of the backward's weight-gradient partials: each adds its tokens' dy·x̂ per
// column, then one pass adds the partials in block order.
constexpr int64_t kWeightGradBlocks = 1056;  // 8 per multiprocessor: enough to fill the GPU

__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, bf16* residual_out, const bf16* x,
                                       const bf16* delta, const bf16* weight, int64_t hidden, float eps) {
  __shared__ float shared[32];
  const int64_t t = blockIdx.x;
  const bf16* row = x + t * hidden;
  float sum_sq = 0;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float value = __bfloat162float(row[i]);
    if (delta) {
      const bf16 sum = __float2bfloat16(value + __bfloat162float(delta[t * hidden + i]));
      residual_out[t * hidden + i] = sum;
      value = __bfloat162float(sum);
    }
    sum_sq += value * value;
  }
  const float r = rsqrtf(block_sum(sum_sq, shared) / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) rstd[t] = r;
  const bf16* normed = delta ? residual_out + t * hidden : row;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    out[t * hidden + i] = __float2bfloat16(__bfloat162float(normed[i]) * r * __bfloat162float(weight[i]));
}

// d_x and this block's partial of d_weight over tokens blockIdx.x, + gridDim.x, ...
__global__ void rmsnorm_backward_kernel(bf16* d_x, float* weight_partials, const bf16* d_out, const bf16* x,
                                        const bf16* weight, const float* rstd, int64_t tokens,
                                        int64_t hidden) {
  __shared__ float shared[32];
  float* partial = weight_partials + blockIdx.x * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) partial[i] = 0;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const float r = rstd[t];
    const bf16* xr = x + t * hidden;
    const bf16* dy = d_out + t * hidden;
    float dot = 0;  // Σ w·dy·x̂
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
      dot += __bfloat162float(weight[i]) * __bfloat162float(dy[i]) * __bfloat162float(xr[i]) * r;
    const float mean = block_sum(dot, shared) / static_cast<float>(hidden);
    for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
      const float x_hat = __bfloat162float(xr[i]) * r;
      const float g = __bfloat162float(dy[i]);
      const float dx = r * (__bfloat162float(weight[i]) * g - x_hat * mean);
      d_x[t * hidden + i] = __float2bfloat16(__bfloat162float(d_x[t * hidden + i]) + dx);
      partial[i] += g * x_hat;
    }
  }
}

__global__ void add_partials_kernel(float* d_weight, const float* partials, int64_t blocks, int64_t width) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= width) return;
  float sum = 0;
  for (int64_t b = 0; b < blocks; ++b) sum += partials[b * width + i];
  d_weight[i] += sum;
}

int64_t weight_grad_blocks(int64_t tokens) {
  return tokens < kWeightGradBlocks ? tokens : kWeightGradBlocks;
}

}  // namespace

void add_partials(float* d_weight, const float* partials, int64_t blocks, int64_t width,
                  cudaStream_t stream) {
  add_partials_kernel<<<static_cast<unsigned>(ceil_div(width, 256)), 256, 0, stream>>>(d_weight, partials,
                                                                                       blocks, width);
  LOOM_LAUNCH_CHECK();
}

void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* weight, int64_t tokens,
                     int64_t hidden, float eps, cudaStream_t stream) {
  if (tokens == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(
      out, rstd, nullptr, x, nullptr, weight, hidden, eps);
  LOOM_LAUNCH_CHECK();
}

void residual_rmsnorm_forward(bf16* residual_out, bf16* out, float* rstd, const bf16* residual,
                              const bf16* delta, const bf16* weight, int64_t tokens, int64_t hidden,
                              float eps, cudaStream_t stream) {
  if (tokens == 0) return;
  rmsnorm_forward_kernel<<<static_cast<unsigned>(tokens), kThreads, 0, stream>>>(
      out, rstd, residual_out, residual, delta, weight, hidden, eps);
  LOOM_LAUNCH_CHECK();
}

int64_t rmsnorm_backward_scratch_bytes(int64_t tokens, int64_t hidden) {
  return weight_grad_blocks(tokens) * hidden * static_cast<int64_t>(sizeof(float));
}

void rmsnorm_backward(bf16* d_x, float* d_weight, const bf16* d_out, const bf16* x, const bf16* weight,
                      const float* rstd, int64_t tokens, int64_t hidden, Scratch scratch,
                      cudaStream_t stream) {
  if (tokens == 0) return;
  const int64_t blocks = weight_grad_blocks(tokens);
  LOOM_ASSERT(scratch.bytes >= rmsnorm_backward_scratch_bytes(tokens, hidden),
              "rmsnorm_backward scratch too small");
  float* partials = static_cast<float*>(scratch.data);
  rmsnorm_backward_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      d_x, partials, d_out, x, weight, rstd, tokens, hidden);
  LOOM_LAUNCH_CHECK();
  add_partials(d_weight, partials, blocks, hidden, stream);
}

}  // namespace loom::cuda
