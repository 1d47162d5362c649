// Softmax cross-entropy in place over a chunk of bf16 logits: the lm_head GEMM writes the
// chunk, this kernel turns it into the loss and the logits' gradient without another
// buffer (16,384 × 151,936 fp32 logits would be 10 GB; a 4,096-token bf16 chunk is 1.2 GB).
// The logits are upcast to fp32 for the softmax, as Megatron's cross-entropy does.
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 512;

// kWidth logits per access: 8 (16 bytes) when the vocabulary is a multiple of 8, as every
// Qwen3 one is (151,936), so that rows stay 16-byte aligned; else 1.
template <int kWidth>
__device__ inline void load_logits(const bf16* p, float (&out)[kWidth]) {
  if constexpr (kWidth == 8)
    load_bf16x8(p, out);
  else
    out[0] = __bfloat162float(*p);
}

template <int kWidth>
__device__ inline void store_logits(bf16* p, const float (&in)[kWidth]) {
  if constexpr (kWidth == 8)
    store_bf16x8(p, in);
  else
    *p = __float2bfloat16(in[0]);
}

// One block per token. Two passes over the row instead of three: the max and the sum of
// exponentials come from one read (each thread rescales its running sum when its max
// grows, then the block combines the threads' pairs), and the gradient from a second.
template <int kWidth>
__global__ void softmax_xent_kernel(bf16* logits, float* nll, const int32_t* targets, int64_t vocab,
                                    float grad_scale, bool write_grad) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  bf16* row = logits + r * vocab;
  const int32_t target = targets[r];
  const int64_t first = threadIdx.x * static_cast<int64_t>(kWidth),
                stride = blockDim.x * static_cast<int64_t>(kWidth);
  if (target < 0) {
    if (threadIdx.x == 0) nll[r] = 0;
    if (write_grad) {
      const float zeros[kWidth] = {};
      for (int64_t i = first; i < vocab; i += stride) store_logits<kWidth>(row + i, zeros);
    }
    return;
  }
  float local_max = -INFINITY, local_sum = 0;
  for (int64_t i = first; i < vocab; i += stride) {
    float x[kWidth];
    load_logits<kWidth>(row + i, x);
    float chunk_max = x[0];
#pragma unroll
    for (int e = 1; e < kWidth; ++e) chunk_max = fmaxf(chunk_max, x[e]);
    if (chunk_max > local_max) {
      local_sum *= expf(local_max - chunk_max);  // 0 on the first chunk (exp(−∞))
      local_max = chunk_max;
    }
#pragma unroll
    for (int e = 0; e < kWidth; ++e) local_sum += expf(x[e] - local_max);
  }
  const float row_max = block_max(local_max, shared);
  const float sum = block_sum(local_max == -INFINITY ? 0.0f : local_sum * expf(local_max - row_max), shared);
  const float lse = row_max + logf(sum);
  // Every thread reads the target logit before any thread overwrites the row.
  const float target_logit = __bfloat162float(row[target]);
  __syncthreads();
  if (threadIdx.x == 0) nll[r] = lse - target_logit;
  if (!write_grad) return;
  for (int64_t i = first; i < vocab; i += stride) {
    float x[kWidth];
    load_logits<kWidth>(row + i, x);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) x[e] = grad_scale * (expf(x[e] - lse) - (i + e == target ? 1.0f : 0.0f));
    store_logits<kWidth>(row + i, x);
  }
}

}  // namespace

void softmax_xent_inplace(bf16* logits, float* nll, const int32_t* targets, int64_t rows, int64_t vocab,
                          float grad_scale, bool write_grad, cudaStream_t stream) {
  if (rows == 0) return;
  const auto blocks = static_cast<unsigned>(rows);
  if (vocab % 8 == 0)
    softmax_xent_kernel<8>
        <<<blocks, kThreads, 0, stream>>>(logits, nll, targets, vocab, grad_scale, write_grad);
  else
    softmax_xent_kernel<1>
        <<<blocks, kThreads, 0, stream>>>(logits, nll, targets, vocab, grad_scale, write_grad);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
