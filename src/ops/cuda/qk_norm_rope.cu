// q/k RMSNorm over head_dim and rotate-half RoPE on the fused qkv, forward and backward.
// The work is (token, head) items; a block's threads cover 256 / G items at a time,
// G = head_dim / 8 lanes per head, each lane holding 8 neighbouring values (one 16-byte
// access). The partner of element i (i ± hd/2) sits at the same place of lane ± G/2, one
// shuffle away. Long-lived blocks with several items in flight a thread keep enough loads
// outstanding: a warp per head, and later one item a thread, were latency-bound at a
// quarter and a third of the memory bandwidth.
#include "core/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kElems = 8;             // values a lane holds
constexpr int64_t kMaxBlocks = 1056;  // 8 per multiprocessor; also the weight-grad partials

// Sum over the aligned group of `lanes` lanes (a power of two ≤ 32) this lane belongs to.
__device__ inline float group_sum(float value, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// This thread's place: head `slot` of each pass over a token's heads, lane `sub` of it.
struct Lane {
  int lanes, slot, sub;
  int64_t heads_per_pass;
  bool low;  // holds values of the first half of the head
};

__device__ inline Lane lane_of(int64_t head_dim) {
  Lane l;
  l.lanes = static_cast<int>(head_dim / kElems);
  l.slot = static_cast<int>(threadIdx.x) / l.lanes;
  l.sub = static_cast<int>(threadIdx.x) % l.lanes;
  l.heads_per_pass = kThreads / l.lanes;
  l.low = l.sub < l.lanes / 2;
  return l;
}

// The (cos, sin) of this lane's 8 columns at a position.
__device__ inline void load_angles(float2 (&cs)[kElems], const float2* rope, int32_t position, const Lane& l,
                                   int64_t head_dim) {
  const float2* row =
      rope + static_cast<int64_t>(position) * (head_dim / 2) + (l.sub % (l.lanes / 2)) * kElems;
  const auto* quads = reinterpret_cast<const float4*>(row);
#pragma unroll
  for (int j = 0; j < kElems / 2; ++j) {
    const float4 q = quads[j];
    cs[2 * j] = make_float2(q.x, q.y);
    cs[2 * j + 1] = make_float2(q.z, q.w);
  }
}

// The forward's items are (token, head) over all heads, v included; the backward's, over the
// q and k heads. A thread takes kItems of its items at once: their 16-byte loads are all
// issued before the first is used, so enough are in flight to keep HBM busy (one item at a
// time, the kernels were latency-bound at 1.3-2 TB/s). A thread's items are the ones a
// one-at-a-time walk would give it, in the same order, so the weight partials add the same
// terms in the same order.
constexpr int kItems = 4;

__global__ void __launch_bounds__(kThreads, 3)
    qk_norm_rope_forward_kernel(bf16* qkv_out, float* rstd, const bf16* qkv, const bf16* q_weight,
                                const bf16* k_weight, const int32_t* positions, const float2* rope,
                                int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                float eps) {
  const Lane l = lane_of(head_dim);
  const int64_t total_heads = q_heads + 2 * kv_heads, items = tokens * total_heads;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * l.heads_per_pass;
  float qw[kElems], kw[kElems];
  load_bf16x8(q_weight + l.sub * kElems, qw);
  load_bf16x8(k_weight + l.sub * kElems, kw);
  for (int64_t first = blockIdx.x * l.heads_per_pass; first < items; first += kItems * stride) {
    uint4 raw[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t item = first + j * stride + l.slot;
      raw[j] = item < items ? *reinterpret_cast<const uint4*>(qkv + item * head_dim + l.sub * kElems)
                            : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t item = first + j * stride + l.slot;
      const bool valid = item < items;
      const int64_t t = valid ? item / total_heads : 0, h = valid ? item % total_heads : 0;
      const bool is_q = h < q_heads, is_v = h >= q_heads + kv_heads;
      const int64_t at = item * head_dim + l.sub * kElems;
      float x[kElems];
      unpack_bf16x8(raw[j], x);
      float sum_sq = 0;
#pragma unroll
      for (int e = 0; e < kElems; ++e) sum_sq += x[e] * x[e];
      const float r = rsqrtf(group_sum(sum_sq, l.lanes) / static_cast<float>(head_dim) + eps);
      float normed[kElems], partner[kElems], out[kElems];
#pragma unroll
      for (int e = 0; e < kElems; ++e) normed[e] = x[e] * r * (is_q ? qw[e] : kw[e]);
#pragma unroll
      for (int e = 0; e < kElems; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, normed[e], l.lanes / 2);
      if (!valid) continue;
      if (is_v) {  // v heads pass through
        store_bf16x8(qkv_out + at, x);
        continue;
      }
      if (l.sub == 0) rstd[t * (q_heads + kv_heads) + h] = r;
      float2 cs[kElems];
      load_angles(cs, rope, positions[t], l, head_dim);
      // out[i] = n[i]·c − n[i+h]·s (i < h); out[i+h] = n[i+h]·c + n[i]·s.
#pragma unroll
      for (int e = 0; e < kElems; ++e)
        out[e] = normed[e] * cs[e].x + (l.low ? -partner[e] : partner[e]) * cs[e].y;
      store_bf16x8(qkv_out + at, out);
    }
  }
}

// Per (token, head): dn = the rotation's transpose applied to dy; n = x̂·w, x̂ = x·rstd;
// dx = rstd·(dn·w − x̂·mean(dn·w·x̂)); the weight partial += dn·x̂, kept per lane in
// registers over the block's items and added over the block's lanes in a fixed order at
// the end. The v heads' gradient is d_out's: copied across unless d_qkv is d_out (in place).
__global__ void __launch_bounds__(kThreads, 2)
    qk_norm_rope_backward_kernel(bf16* d_qkv, float* q_partials, float* k_partials, const bf16* d_out,
                                 const bf16* qkv, const bf16* q_weight, const bf16* k_weight,
                                 const float* rstd, const int32_t* positions, const float2* rope,
                                 int64_t tokens, int64_t q_heads, int64_t kv_heads, bool copy_v,
                                 int64_t head_dim) {
  __shared__ float q_acc[kThreads][kElems];
  __shared__ float k_acc[kThreads][kElems];
  const Lane l = lane_of(head_dim);
  const int64_t total_heads = q_heads + 2 * kv_heads;
  float qw[kElems], kw[kElems], q_sum[kElems] = {}, k_sum[kElems] = {};
  load_bf16x8(q_weight + l.sub * kElems, qw);
  load_bf16x8(k_weight + l.sub * kElems, kw);
  // The (token, q or k head) items, in order, heads_per_pass at a time: a pass may span two
  // tokens, so no slot idles when a token's q and k heads are not a multiple of a pass (24
  // in passes of 16 left a third of the second pass idle when a block walked a token).
  const int64_t normed_heads = q_heads + kv_heads, items = tokens * normed_heads;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * l.heads_per_pass;
  for (int64_t first = blockIdx.x * l.heads_per_pass; first < items; first += kItems * stride) {
    uint4 raw_dy[kItems], raw_x[kItems];
    int64_t at[kItems];
    int32_t position[kItems];
    float r[kItems];
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t item = first + j * stride + l.slot;
      const bool valid = item < items;
      const int64_t t = valid ? item / normed_heads : 0, h = valid ? item % normed_heads : 0;
      at[j] = (t * total_heads + h) * head_dim + l.sub * kElems;
      raw_dy[j] = raw_x[j] = make_uint4(0, 0, 0, 0);
      r[j] = 0;
      position[j] = 0;
      if (valid) {
        raw_dy[j] = *reinterpret_cast<const uint4*>(d_out + at[j]);
        raw_x[j] = *reinterpret_cast<const uint4*>(qkv + at[j]);
        r[j] = rstd[item];  // rstd is [token][q and k head]: the item's own index
        position[j] = positions[t];
      }
    }
#pragma unroll
    for (int j = 0; j < kItems; ++j) {
      const int64_t item = first + j * stride + l.slot;
      const bool valid = item < items, is_q = item % normed_heads < q_heads;
      float2 cs[kElems];
      load_angles(cs, rope, position[j], l, head_dim);
      float dy[kElems], x[kElems], partner[kElems], dn[kElems];
      unpack_bf16x8(raw_dy[j], dy);
      unpack_bf16x8(raw_x[j], x);
#pragma unroll
      for (int e = 0; e < kElems; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, dy[e], l.lanes / 2);
        // out[i] = n[i]·c − n[i+h]·s (i < h); out[i+h] = n[i+h]·c + n[i]·s, transposed.
#pragma unroll
      for (int e = 0; e < kElems; ++e) dn[e] = dy[e] * cs[e].x + (l.low ? partner[e] : -partner[e]) * cs[e].y;
      float dot = 0;
#pragma unroll
      for (int e = 0; e < kElems; ++e) dot += dn[e] * (is_q ? qw[e] : kw[e]) * x[e] * r[j];
      const float mean = group_sum(dot, l.lanes) / static_cast<float>(head_dim);
      if (!valid) continue;
      float dx[kElems];
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const float x_hat = x[e] * r[j];
        dx[e] = r[j] * (dn[e] * (is_q ? qw[e] : kw[e]) - x_hat * mean);
        if (is_q)
          q_sum[e] += dn[e] * x_hat;
        else
          k_sum[e] += dn[e] * x_hat;
      }
      store_bf16x8(d_qkv + at[j], dx);
    }
  }
  // The v heads' gradient passes through: copied when d_qkv is not d_out. Apart from the
  // loop above, so that the weight partials add the same items either way.
  const int64_t v_items = copy_v ? tokens * kv_heads : 0;
  for (int64_t first = blockIdx.x * l.heads_per_pass; first < v_items;
       first += gridDim.x * l.heads_per_pass) {
    const int64_t item = first + l.slot;
    if (item >= v_items) continue;
    const int64_t at =
        ((item / kv_heads) * total_heads + normed_heads + item % kv_heads) * head_dim + l.sub * kElems;
    float dy[kElems];
    load_bf16x8(d_out + at, dy);
    store_bf16x8(d_qkv + at, dy);
  }
#pragma unroll
  for (int e = 0; e < kElems; ++e) {
    q_acc[threadIdx.x][e] = q_sum[e];
    k_acc[threadIdx.x][e] = k_sum[e];
  }
  __syncthreads();
  // Column i is held by lane i / 8 of every head slot: add the slots in order.
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
    const int sub = static_cast<int>(i / kElems), e = static_cast<int>(i % kElems);
    float q = 0, k = 0;
    for (int thread = sub; thread < kThreads; thread += l.lanes) {
      q += q_acc[thread][e];
      k += k_acc[thread][e];
    }
    q_partials[blockIdx.x * head_dim + i] = q;
    k_partials[blockIdx.x * head_dim + i] = k;
  }
}

int64_t blocks_for(int64_t tokens) {
  return tokens < kMaxBlocks ? tokens : kMaxBlocks;
}

void check_head_dim(int64_t head_dim) {
  const int64_t lanes = head_dim / kElems;
  LOOM_ASSERT(head_dim % (2 * kElems) == 0 && lanes <= 32 && (lanes & (lanes - 1)) == 0,
              "qk_norm_rope: the CUDA kernels need head_dim = 16, 32, 64, 128 or 256");
}

}  // namespace

void qk_norm_rope_forward(bf16* qkv_out, float* rstd, const bf16* qkv, const bf16* q_weight,
                          const bf16* k_weight, const int32_t* positions, const float2* rope, int64_t tokens,
                          int64_t q_heads, int64_t kv_heads, int64_t head_dim, float eps,
                          cudaStream_t stream) {
  check_head_dim(head_dim);
  if (tokens == 0) return;
  qk_norm_rope_forward_kernel<<<static_cast<unsigned>(blocks_for(tokens)), kThreads, 0, stream>>>(
      qkv_out, rstd, qkv, q_weight, k_weight, positions, rope, tokens, q_heads, kv_heads, head_dim, eps);
  LOOM_LAUNCH_CHECK();
}

int64_t qk_norm_rope_backward_scratch_bytes(int64_t tokens, int64_t head_dim) {
  return 2 * blocks_for(tokens) * head_dim * static_cast<int64_t>(sizeof(float));
}

void qk_norm_rope_backward(bf16* d_qkv, float* d_q_weight, float* d_k_weight, const bf16* d_qkv_out,
                           const bf16* qkv, const bf16* q_weight, const bf16* k_weight, const float* rstd,
                           const int32_t* positions, const float2* rope, int64_t tokens, int64_t q_heads,
                           int64_t kv_heads, int64_t head_dim, Scratch scratch, cudaStream_t stream) {
  check_head_dim(head_dim);
  LOOM_ASSERT(scratch.bytes >= qk_norm_rope_backward_scratch_bytes(tokens, head_dim),
              "qk_norm_rope_backward scratch too small");
  if (tokens == 0) return;
  const int64_t blocks = blocks_for(tokens);
  float* q_partials = static_cast<float*>(scratch.data);
  float* k_partials = q_partials + blocks * head_dim;
  qk_norm_rope_backward_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      d_qkv, q_partials, k_partials, d_qkv_out, qkv, q_weight, k_weight, rstd, positions, rope, tokens,
      q_heads, kv_heads, d_qkv != d_qkv_out, head_dim);
  LOOM_LAUNCH_CHECK();
  add_partials(d_q_weight, q_partials, blocks, head_dim, stream);
  add_partials(d_k_weight, k_partials, blocks, head_dim, stream);
}

}  // namespace loom::cuda
