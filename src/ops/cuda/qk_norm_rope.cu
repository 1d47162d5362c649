// q/k RMSNorm over head_dim and rotate-half RoPE on the fused qkv, forward and backward.
// One warp per (token, head): head_dim 128 is 4 values a lane. The rotation pairs element i
// with i + hd/2, which for hd < 64 is another lane, so the warp exchanges through shared
// memory.
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

constexpr int kWarps = 8;  // (token, head) pairs per block
constexpr int kMaxHeadDim = 256;
constexpr int64_t kWeightGradBlocks = 1056;  // 8 per multiprocessor: enough to fill the GPU

__global__ void qk_norm_rope_forward_kernel(bf16* qkv_out, float* rstd, const bf16* qkv, const bf16* q_weight,
                                            const bf16* k_weight, const int32_t* positions,
                                            const float2* rope, int64_t tokens, int64_t q_heads,
                                            int64_t kv_heads, int64_t head_dim, float eps) {
  __shared__ float normed[kWarps][kMaxHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t total_heads = q_heads + 2 * kv_heads;
  const int64_t pair = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  if (pair >= tokens * total_heads) return;
  const int64_t t = pair / total_heads, h = pair % total_heads;
  const bf16* in = qkv + pair * head_dim;
  bf16* out = qkv_out + pair * head_dim;
  if (h >= q_heads + kv_heads) {  // v heads pass through
    for (int64_t i = lane; i < head_dim; i += 32) out[i] = in[i];
    return;
  }
  const bf16* weight = h < q_heads ? q_weight : k_weight;
  float sum_sq = 0;
  for (int64_t i = lane; i < head_dim; i += 32) {
    const float x = __bfloat162float(in[i]);
    sum_sq += x * x;
  }
  const float r = rsqrtf(warp_sum(sum_sq) / static_cast<float>(head_dim) + eps);
  if (lane == 0) rstd[t * (q_heads + kv_heads) + h] = r;
  for (int64_t i = lane; i < head_dim; i += 32)
    normed[warp][i] = __bfloat162float(in[i]) * r * __bfloat162float(weight[i]);
  __syncwarp();
  const int64_t half = head_dim / 2;
  const float2* rope_row = rope + static_cast<int64_t>(positions[t]) * half;
  for (int64_t i = lane; i < head_dim; i += 32) {
    const float2 cs = rope_row[i < half ? i : i - half];
    const float c = cs.x, s = cs.y;
    const float rotated = i < half ? -normed[warp][i + half] : normed[warp][i - half];
    out[i] = __float2bfloat16(normed[warp][i] * c + rotated * s);
  }
}

// Per (token, head): dn = the rotation's transpose applied to dy; n = x̂·w, x̂ = x·rstd;
// dx = rstd·(dn·w − x̂·mean(dn·w·x̂)); the weight partial += dn·x̂. Block b handles pairs
// b·kWarps + warp, + gridDim.x·kWarps, ..., and keeps per-warp partials of d_q_weight and
// d_k_weight in shared memory, written out per block at the end.
__global__ void qk_norm_rope_backward_kernel(bf16* d_qkv, float* q_partials, float* k_partials,
                                             const bf16* d_out, const bf16* qkv, const bf16* q_weight,
                                             const bf16* k_weight, const float* rstd,
                                             const int32_t* positions, const float2* rope, int64_t tokens,
                                             int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  __shared__ float dn[kWarps][kMaxHeadDim];
  __shared__ float q_acc[kWarps][kMaxHeadDim];
  __shared__ float k_acc[kWarps][kMaxHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t i = lane; i < head_dim; i += 32) q_acc[warp][i] = k_acc[warp][i] = 0;
  const int64_t total_heads = q_heads + 2 * kv_heads, half = head_dim / 2;
  for (int64_t pair = blockIdx.x * static_cast<int64_t>(kWarps) + warp; pair < tokens * total_heads;
       pair += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t t = pair / total_heads, h = pair % total_heads;
    const bf16* dy = d_out + pair * head_dim;
    bf16* dx = d_qkv + pair * head_dim;
    if (h >= q_heads + kv_heads) {
      for (int64_t i = lane; i < head_dim; i += 32) dx[i] = dy[i];
      continue;
    }
    const bool is_q = h < q_heads;
    const bf16* weight = is_q ? q_weight : k_weight;
    const bf16* x = qkv + pair * head_dim;
    const float r = rstd[t * (q_heads + kv_heads) + h];
    const float2* rope_row = rope + static_cast<int64_t>(positions[t]) * half;
    __syncwarp();
    for (int64_t i = lane; i < head_dim; i += 32) {
      const float2 cs = rope_row[i < half ? i : i - half];
      const float c = cs.x, s = cs.y;
      // out[i] = n[i]·c − n[i+h]·s (i < h); out[i+h] = n[i+h]·c + n[i]·s.
      const float partner = i < half ? __bfloat162float(dy[i + half]) : -__bfloat162float(dy[i - half]);
      dn[warp][i] = __bfloat162float(dy[i]) * c + partner * s;
    }
    __syncwarp();
    float dot = 0;
    for (int64_t i = lane; i < head_dim; i += 32)
      dot += dn[warp][i] * __bfloat162float(weight[i]) * __bfloat162float(x[i]) * r;
    const float mean = warp_sum(dot) / static_cast<float>(head_dim);
    float* acc = is_q ? q_acc[warp] : k_acc[warp];
    for (int64_t i = lane; i < head_dim; i += 32) {
      const float x_hat = __bfloat162float(x[i]) * r;
      dx[i] = __float2bfloat16(r * (dn[warp][i] * __bfloat162float(weight[i]) - x_hat * mean));
      acc[i] += dn[warp][i] * x_hat;
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
    float q = 0, k = 0;
    for (int w = 0; w < kWarps; ++w) {
      q += q_acc[w][i];
      k += k_acc[w][i];
    }
    q_partials[blockIdx.x * head_dim + i] = q;
    k_partials[blockIdx.x * head_dim + i] = k;
  }
}

int64_t weight_grad_blocks(int64_t pairs) {
  const int64_t needed = ceil_div(pairs, kWarps);
  return needed < kWeightGradBlocks ? needed : kWeightGradBlocks;
}

}  // namespace

void qk_norm_rope_forward(bf16* qkv_out, float* rstd, const bf16* qkv, const bf16* q_weight,
                          const bf16* k_weight, const int32_t* positions, const float2* rope, int64_t tokens,
                          int64_t q_heads, int64_t kv_heads, int64_t head_dim, float eps,
                          cudaStream_t stream) {
  LOOM_ASSERT(head_dim <= kMaxHeadDim && head_dim % 2 == 0, "qk_norm_rope: head_dim must be even and <= 256");
  const int64_t pairs = tokens * (q_heads + 2 * kv_heads);
  if (pairs == 0) return;
  qk_norm_rope_forward_kernel<<<static_cast<unsigned>(ceil_div(pairs, kWarps)), kWarps * 32, 0, stream>>>(
      qkv_out, rstd, qkv, q_weight, k_weight, positions, rope, tokens, q_heads, kv_heads, head_dim, eps);
  LOOM_LAUNCH_CHECK();
}

int64_t qk_norm_rope_backward_scratch_bytes(int64_t tokens, int64_t head_dim) {
  // Enough for any head count: the block count is capped at kWeightGradBlocks.
  (void)tokens;
  return 2 * kWeightGradBlocks * head_dim * static_cast<int64_t>(sizeof(float));
}

void qk_norm_rope_backward(bf16* d_qkv, float* d_q_weight, float* d_k_weight, const bf16* d_qkv_out,
                           const bf16* qkv, const bf16* q_weight, const bf16* k_weight, const float* rstd,
                           const int32_t* positions, const float2* rope, int64_t tokens, int64_t q_heads,
                           int64_t kv_heads, int64_t head_dim, Scratch scratch, cudaStream_t stream) {
  LOOM_ASSERT(head_dim <= kMaxHeadDim && head_dim % 2 == 0, "qk_norm_rope: head_dim must be even and <= 256");
  LOOM_ASSERT(scratch.bytes >= qk_norm_rope_backward_scratch_bytes(tokens, head_dim),
              "qk_norm_rope_backward scratch too small");
  const int64_t pairs = tokens * (q_heads + 2 * kv_heads);
  if (pairs == 0) return;
  const int64_t blocks = weight_grad_blocks(pairs);
  float* q_partials = static_cast<float*>(scratch.data);
  float* k_partials = q_partials + blocks * head_dim;
  qk_norm_rope_backward_kernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
      d_qkv, q_partials, k_partials, d_qkv_out, qkv, q_weight, k_weight, rstd, positions, rope, tokens,
      q_heads, kv_heads, head_dim);
  LOOM_LAUNCH_CHECK();
  add_partials(d_q_weight, q_partials, blocks, head_dim, stream);
  add_partials(d_k_weight, k_partials, blocks, head_dim, stream);
}

}  // namespace loom::cuda
