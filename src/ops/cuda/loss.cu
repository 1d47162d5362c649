// Softmax cross-entropy in place over a chunk of bf16 logits: the lm_head GEMM writes the
// chunk, this kernel turns it into the loss and the logits' gradient without another
// buffer (16,384 × 151,936 fp32 logits would be 10 GB; a 4,096-token bf16 chunk is 1.2 GB).
// The logits are upcast to fp32 for the softmax, as Megatron's cross-entropy does.
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 512;

__global__ void softmax_xent_kernel(bf16* logits, float* nll, const int32_t* targets, int64_t vocab,
                                    float grad_scale, bool write_grad) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  bf16* row = logits + r * vocab;
  const int32_t target = targets[r];
  if (target < 0) {
    if (threadIdx.x == 0) nll[r] = 0;
    if (write_grad)
      for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) row[i] = __float2bfloat16(0.0f);
    return;
  }
  float local_max = -INFINITY;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    local_max = fmaxf(local_max, __bfloat162float(row[i]));
  const float row_max = block_max(local_max, shared);
  float local_sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    local_sum += expf(__bfloat162float(row[i]) - row_max);
  const float sum = block_sum(local_sum, shared);
  const float lse = row_max + logf(sum);
  // Every thread reads the target logit before any thread overwrites the row.
  const float target_logit = __bfloat162float(row[target]);
  __syncthreads();
  if (threadIdx.x == 0) nll[r] = lse - target_logit;
  if (!write_grad) return;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float p = expf(__bfloat162float(row[i]) - lse);
    row[i] = __float2bfloat16(grad_scale * (p - (i == target ? 1.0f : 0.0f)));
  }
}

}  // namespace

void softmax_xent_inplace(bf16* logits, float* nll, const int32_t* targets, int64_t rows, int64_t vocab,
                          float grad_scale, bool write_grad, cudaStream_t stream) {
  if (rows == 0) return;
  softmax_xent_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, nll, targets, vocab,
                                                                            grad_scale, write_grad);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
