// Softmax cross-entropy in place over a chunk of bf16 logits: the lm_head GEMM writes the
// chunk, this kernel turns it into the loss and the logits' gradient without another
// buffer (16,384 × 151,936 fp32 logits would be 10 GB; a bf16 chunk of at most 8,192 tokens,
// cuda_ops.h, is 2.5 GB).
// The logits are upcast to fp32 for the softmax, as Megatron's cross-entropy does. The
// tensor-parallel lm_head (vocab-parallel, Megatron's VocabParallelCrossEntropy) runs the
// same passes on its shard's chunk of logits, and puts the shards' lse together.
#include <type_traits>

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
// The passes are shared by the whole-vocabulary loss and the tensor-parallel shard's
// halves (lm_head_shard_forward, lm_head_shard_backward).

// Pass one: log Σ exp(row), every thread gets it.
template <int kWidth>
__device__ float row_logsumexp(const bf16* row, int64_t vocab, float* shared) {
  const int64_t first = threadIdx.x * static_cast<int64_t>(kWidth),
                stride = blockDim.x * static_cast<int64_t>(kWidth);
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
  return row_max + logf(sum);
}

// Pass two: row = grad_scale·(exp(row − lse) − onehot(target)); a target outside [0, vocab)
// (in another shard) adds no one-hot. Each thread rewrites only what it reads.
template <int kWidth>
__device__ void row_xent_grad(bf16* row, int64_t vocab, float lse, int64_t target, float grad_scale) {
  for (int64_t i = threadIdx.x * static_cast<int64_t>(kWidth); i < vocab;
       i += blockDim.x * static_cast<int64_t>(kWidth)) {
    float x[kWidth];
    load_logits<kWidth>(row + i, x);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) x[e] = grad_scale * (expf(x[e] - lse) - (i + e == target ? 1.0f : 0.0f));
    store_logits<kWidth>(row + i, x);
  }
}

// The gradient row of a token without a target.
template <int kWidth>
__device__ void row_zero(bf16* row, int64_t vocab) {
  const float zeros[kWidth] = {};
  for (int64_t i = threadIdx.x * static_cast<int64_t>(kWidth); i < vocab;
       i += blockDim.x * static_cast<int64_t>(kWidth))
    store_logits<kWidth>(row + i, zeros);
}

template <int kWidth>
__global__ void softmax_xent_kernel(bf16* logits, float* nll, const int32_t* targets, int64_t vocab,
                                    float grad_scale, bool write_grad) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  bf16* row = logits + r * vocab;
  const int32_t target = targets[r];
  if (target < 0) {
    if (threadIdx.x == 0) nll[r] = 0;
    if (write_grad) row_zero<kWidth>(row, vocab);
    return;
  }
  const float lse = row_logsumexp<kWidth>(row, vocab, shared);
  // Every thread reads the target logit before any thread overwrites the row.
  const float target_logit = __bfloat162float(row[target]);
  __syncthreads();
  if (threadIdx.x == 0) nll[r] = lse - target_logit;
  if (write_grad) row_xent_grad<kWidth>(row, vocab, lse, target, grad_scale);
}

// The shard's forward half: its lse and, where the target is its own, the target's logit.
template <int kWidth>
__global__ void shard_logsumexp_kernel(float* lse, float* target_logit, const bf16* logits,
                                       const int32_t* targets, int64_t vocab, int64_t vocab_begin) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const bf16* row = logits + r * vocab;
  const int32_t target = targets[r];
  const float value = target < 0 ? 0.0f : row_logsumexp<kWidth>(row, vocab, shared);
  if (threadIdx.x != 0) return;
  const int64_t local = static_cast<int64_t>(target) - vocab_begin;
  lse[r] = value;
  target_logit[r] = target >= 0 && local >= 0 && local < vocab ? __bfloat162float(row[local]) : 0.0f;
}

// The shard's backward half, given the whole vocabulary's lse.
template <int kWidth>
__global__ void shard_xent_grad_kernel(bf16* logits, const float* lse, const int32_t* targets, int64_t vocab,
                                       int64_t vocab_begin, float grad_scale) {
  const int64_t r = blockIdx.x;
  bf16* row = logits + r * vocab;
  const int32_t target = targets[r];
  if (target < 0)
    row_zero<kWidth>(row, vocab);
  else
    row_xent_grad<kWidth>(row, vocab, lse[r], static_cast<int64_t>(target) - vocab_begin, grad_scale);
}

// lse[t] = log Σ_p exp(parts[p, t]) around the largest part (the shards' lse are large: a
// plain Σ exp would overflow fp32 past 88), nll[t] = lse[t] − target_logit[t].
__global__ void shard_combine_kernel(float* nll, float* lse, const float* lse_parts,
                                     const float* target_logit, const int32_t* targets, int64_t parts,
                                     int64_t tokens) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= tokens) return;
  if (targets[t] < 0) {
    lse[t] = nll[t] = 0.0f;
    return;
  }
  float max_part = -INFINITY;
  for (int64_t p = 0; p < parts; ++p) max_part = fmaxf(max_part, lse_parts[p * tokens + t]);
  float sum = 0.0f;
  for (int64_t p = 0; p < parts; ++p) sum += expf(lse_parts[p * tokens + t] - max_part);
  const float value = max_part + logf(sum);
  lse[t] = value;
  nll[t] = value - target_logit[t];
}

// Launches `launch(std::integral_constant<int, kWidth>)` with the widest access the rows'
// alignment allows (see load_logits), one block of kThreads per row, and checks it.
template <typename Launch>
void launch_by_width(int64_t vocab, Launch launch) {
  if (vocab % 8 == 0)
    launch(std::integral_constant<int, 8>{});
  else
    launch(std::integral_constant<int, 1>{});
  LOOM_LAUNCH_CHECK();
}

}  // namespace

void softmax_xent_inplace(bf16* logits, float* nll, const int32_t* targets, int64_t rows, int64_t vocab,
                          float grad_scale, bool write_grad, cudaStream_t stream) {
  if (rows == 0) return;
  launch_by_width(vocab, [&](auto width) {
    softmax_xent_kernel<decltype(width)::value><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, nll, targets, vocab, grad_scale, write_grad);
  });
}

void shard_logsumexp(float* lse, float* target_logit, const bf16* logits, const int32_t* targets,
                     int64_t rows, int64_t vocab, int64_t vocab_begin, cudaStream_t stream) {
  if (rows == 0) return;
  launch_by_width(vocab, [&](auto width) {
    shard_logsumexp_kernel<decltype(width)::value><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        lse, target_logit, logits, targets, vocab, vocab_begin);
  });
}

void shard_xent_grad_inplace(bf16* logits, const float* lse, const int32_t* targets, int64_t rows,
                             int64_t vocab, int64_t vocab_begin, float grad_scale, cudaStream_t stream) {
  if (rows == 0) return;
  launch_by_width(vocab, [&](auto width) {
    shard_xent_grad_kernel<decltype(width)::value><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
        logits, lse, targets, vocab, vocab_begin, grad_scale);
  });
}

void shard_combine(float* nll, float* lse, const float* lse_parts, const float* target_logit,
                   const int32_t* targets, int64_t parts, int64_t tokens, cudaStream_t stream) {
  if (tokens == 0) return;
  shard_combine_kernel<<<static_cast<unsigned>(ceil_div(tokens, 256)), 256, 0, stream>>>(
      nll, lse, lse_parts, target_logit, targets, parts, tokens);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
