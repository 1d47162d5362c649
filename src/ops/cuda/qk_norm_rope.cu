// q/k RMSNorm over head_dim and rotate-half RoPE on the fused qkv, forward and backward;
// without q/k norm (kNorm false: Llama, Qwen2, Mistral) the same kernels rotate alone. The
// RoPE variant (default or llama3) is in the host-built angle table, not in the kernels.
// A block walks tokens (grid-stride) and covers one token's heads with 128 / G head slots
// of G = head_dim / 8 lanes, each lane holding 8 neighbouring values (one 16-byte access);
// slot s takes heads s, s + slots, ... of the token. The partner of element i (i ± hd/2)
// sits at the same place of lane ± G/2, one shuffle away.
//
// What sets the speed (both kernels are memory-bound, a few flops a byte): enough loads in
// flight and no more bytes than the data. A lane's rope angles (64 bytes) are the same for
// every head of a token, so they are read once a token (read per head, they would be four
// times the data's bytes); a thread issues the loads of up to kItems of its token's heads
// before using the first (one head at a time is latency-bound). docs/performance.md has
// the measurements.
#include "core/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "ops/op_workspace.h"

namespace loom::cuda {
namespace {

// 8 head slots of 16 lanes at head_dim 128: every Qwen3 head count (the forward's 32, 48, 80;
// the backward's 24, 40, 72) is a multiple of 8, and four blocks a multiprocessor fit the
// registers of several heads in flight a thread.
constexpr int kThreads = 128;
constexpr int kBlocksPerSm = 4;
constexpr int kElems = 8;  // values a lane holds
// Heads a thread has in flight: the forward's, the backward's (two loads each, and the
// registers allow four blocks of 128 threads a multiprocessor without spilling).
constexpr int kItems = 4, kBackwardItems = 3;

// Sum over the aligned group of `lanes` lanes (a power of two ≤ 32) this lane belongs to.
__device__ inline float group_sum(float value, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// This thread's place: head slot `slot` of the block's `slots`, lane `sub` of the head.
struct Lane {
  int lanes, slot, sub, slots;
  bool low;  // holds values of the first half of the head
};

__device__ inline Lane lane_of(int64_t head_dim) {
  Lane l;
  l.lanes = static_cast<int>(head_dim / kElems);
  l.slot = static_cast<int>(threadIdx.x) / l.lanes;
  l.sub = static_cast<int>(threadIdx.x) % l.lanes;
  l.slots = static_cast<int>(blockDim.x) / l.lanes;
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

// The forward's heads are all of a token's, v included (passed through); the backward's, its
// q and k heads. Every thread runs the same number of rounds (a slot past the last head
// runs them with zeros), so the shuffles see whole warps.
template <bool kNorm>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    qk_norm_rope_forward_kernel(bf16* qkv_out, float* rstd, const bf16* qkv, const bf16* q_weight,
                                const bf16* k_weight, const int32_t* positions, const float2* rope,
                                int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                float eps) {
  const Lane l = lane_of(head_dim);
  const int64_t total_heads = q_heads + 2 * kv_heads;
  const int64_t rounds = (total_heads + l.slots - 1) / l.slots;  // heads a slot takes a token
  // The weights stay bf16 until used: registers are what bound the loads in flight.
  uint4 qw_raw = make_uint4(0, 0, 0, 0), kw_raw = qw_raw;
  if constexpr (kNorm) {
    qw_raw = *reinterpret_cast<const uint4*>(q_weight + l.sub * kElems);
    kw_raw = *reinterpret_cast<const uint4*>(k_weight + l.sub * kElems);
  }
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    float2 cs[kElems];
    load_angles(cs, rope, positions[t], l, head_dim);
    for (int64_t r0 = 0; r0 < rounds; r0 += kItems) {
      uint4 raw[kItems];
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        const int64_t h = l.slot + (r0 + j) * l.slots;
        raw[j] =
            r0 + j < rounds && h < total_heads
                ? *reinterpret_cast<const uint4*>(qkv + (t * total_heads + h) * head_dim + l.sub * kElems)
                : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < kItems; ++j) {
        if (r0 + j == rounds) break;  // the same for the whole block: no shuffle loses a lane
        const int64_t h = l.slot + (r0 + j) * l.slots;
        const bool valid = h < total_heads;
        const bool is_q = h < q_heads, is_v = h >= q_heads + kv_heads;
        const int64_t at = (t * total_heads + h) * head_dim + l.sub * kElems;
        float x[kElems];
        unpack_bf16x8(raw[j], x);
        float r = 1.0f, normed[kElems], partner[kElems], out[kElems];
        if constexpr (kNorm) {
          float w[kElems];
          unpack_bf16x8(is_q ? qw_raw : kw_raw, w);
          float sum_sq = 0;
#pragma unroll
          for (int e = 0; e < kElems; ++e) sum_sq += x[e] * x[e];
          r = rsqrtf(group_sum(sum_sq, l.lanes) / static_cast<float>(head_dim) + eps);
#pragma unroll
          for (int e = 0; e < kElems; ++e) normed[e] = x[e] * r * w[e];
        } else {
#pragma unroll
          for (int e = 0; e < kElems; ++e) normed[e] = x[e];
        }
#pragma unroll
        for (int e = 0; e < kElems; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, normed[e], l.lanes / 2);
        if (!valid) continue;
        if (is_v) {  // v heads pass through
          store_bf16x8(qkv_out + at, x);
          continue;
        }
        if (kNorm && l.sub == 0) rstd[t * (q_heads + kv_heads) + h] = r;
          // out[i] = n[i]·c − n[i+h]·s (i < h); out[i+h] = n[i+h]·c + n[i]·s.
#pragma unroll
        for (int e = 0; e < kElems; ++e)
          out[e] = normed[e] * cs[e].x + (l.low ? -partner[e] : partner[e]) * cs[e].y;
        store_bf16x8(qkv_out + at, out);
      }
    }
  }
}

// Per (token, head): dn = the rotation's transpose applied to dy; n = x̂·w, x̂ = x·rstd;
// dx = rstd·(dn·w − x̂·mean(dn·w·x̂)); the weight partial += dn·x̂, kept per lane in
// registers over the block's tokens and added over the block's lanes in a fixed order at
// the end. The v heads' gradient is d_out's: copied across unless d_qkv is d_out (in place).
// Without norm (kNorm false) dx = dn and there are no partials.
template <bool kNorm>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    qk_norm_rope_backward_kernel(bf16* d_qkv, float* q_partials, float* k_partials, float* amax,
                                 const bf16* d_out, const bf16* qkv, const bf16* q_weight,
                                 const bf16* k_weight, const float* rstd, const int32_t* positions,
                                 const float2* rope, int64_t tokens, int64_t q_heads, int64_t kv_heads,
                                 bool copy_v, int64_t head_dim) {
  __shared__ float q_acc[kThreads][kElems];
  __shared__ float k_acc[kThreads][kElems];
  const Lane l = lane_of(head_dim);
  const int64_t total_heads = q_heads + 2 * kv_heads, normed_heads = q_heads + kv_heads;
  const int64_t rounds = (normed_heads + l.slots - 1) / l.slots;
  // The weights stay bf16 until used: registers are what bound the loads in flight.
  uint4 qw_raw = make_uint4(0, 0, 0, 0), kw_raw = qw_raw;
  if constexpr (kNorm) {
    qw_raw = *reinterpret_cast<const uint4*>(q_weight + l.sub * kElems);
    kw_raw = *reinterpret_cast<const uint4*>(k_weight + l.sub * kElems);
  }
  float q_sum[kElems] = {}, k_sum[kElems] = {};
  float most = 0;  // of d_qkv as stored, for amax
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    float2 cs[kElems];
    load_angles(cs, rope, positions[t], l, head_dim);
    for (int64_t r0 = 0; r0 < rounds; r0 += kBackwardItems) {
      uint4 raw_dy[kBackwardItems], raw_x[kBackwardItems];
      float r[kBackwardItems];
#pragma unroll
      for (int j = 0; j < kBackwardItems; ++j) {
        const int64_t h = l.slot + (r0 + j) * l.slots;
        const int64_t at = (t * total_heads + h) * head_dim + l.sub * kElems;
        raw_dy[j] = raw_x[j] = make_uint4(0, 0, 0, 0);
        r[j] = 0;
        if (r0 + j < rounds && h < normed_heads) {
          raw_dy[j] = *reinterpret_cast<const uint4*>(d_out + at);
          if constexpr (kNorm) {
            raw_x[j] = *reinterpret_cast<const uint4*>(qkv + at);
            r[j] = rstd[t * normed_heads + h];
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kBackwardItems; ++j) {
        if (r0 + j == rounds) break;  // the same for the whole block: no shuffle loses a lane
        const int64_t h = l.slot + (r0 + j) * l.slots;
        const bool valid = h < normed_heads, is_q = h < q_heads;
        float dy[kElems], partner[kElems], dn[kElems];
        unpack_bf16x8(raw_dy[j], dy);
#pragma unroll
        for (int e = 0; e < kElems; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, dy[e], l.lanes / 2);
          // out[i] = n[i]·c − n[i+h]·s (i < h); out[i+h] = n[i+h]·c + n[i]·s, transposed.
#pragma unroll
        for (int e = 0; e < kElems; ++e)
          dn[e] = dy[e] * cs[e].x + (l.low ? partner[e] : -partner[e]) * cs[e].y;
        float dx[kElems];
        if constexpr (kNorm) {
          float x[kElems], w[kElems];
          unpack_bf16x8(is_q ? qw_raw : kw_raw, w);
          unpack_bf16x8(raw_x[j], x);
          float dot = 0;
#pragma unroll
          for (int e = 0; e < kElems; ++e) dot += dn[e] * w[e] * x[e] * r[j];
          const float mean = group_sum(dot, l.lanes) / static_cast<float>(head_dim);
          if (!valid) continue;
#pragma unroll
          for (int e = 0; e < kElems; ++e) {
            const float x_hat = x[e] * r[j];
            dx[e] = r[j] * (dn[e] * w[e] - x_hat * mean);
            if (is_q)
              q_sum[e] += dn[e] * x_hat;
            else
              k_sum[e] += dn[e] * x_hat;
          }
        } else {
          if (!valid) continue;
#pragma unroll
          for (int e = 0; e < kElems; ++e) dx[e] = dn[e];
        }
        store_bf16x8(d_qkv + (t * total_heads + h) * head_dim + l.sub * kElems, dx);
        if (amax) {
#pragma unroll
          for (int e = 0; e < kElems; ++e) most = fmaxf(most, stored_magnitude(dx[e]));
        }
      }
    }
  }
  // The v heads' gradient passes through: copied when d_qkv is not d_out, read in place only
  // for the amax. Apart from the loop above, so that the weight partials add the same items
  // either way.
  const int64_t v_items = copy_v || amax ? tokens * kv_heads : 0;
  for (int64_t item = blockIdx.x * static_cast<int64_t>(l.slots) + l.slot; item < v_items;
       item += static_cast<int64_t>(gridDim.x) * l.slots) {
    const int64_t at =
        ((item / kv_heads) * total_heads + normed_heads + item % kv_heads) * head_dim + l.sub * kElems;
    float dy[kElems];
    load_bf16x8(d_out + at, dy);
    if (copy_v) store_bf16x8(d_qkv + at, dy);
    if (amax) {
#pragma unroll
      for (int e = 0; e < kElems; ++e) most = fmaxf(most, fabsf(dy[e]));
    }
  }
  if constexpr (kNorm) {
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
      for (int thread = sub; thread < static_cast<int>(blockDim.x); thread += l.lanes) {
        q += q_acc[thread][e];
        k += k_acc[thread][e];
      }
      q_partials[blockIdx.x * head_dim + i] = q;
      k_partials[blockIdx.x * head_dim + i] = k;
    }
  }
  if (amax) block_amax_into(amax, most);
}

// The grid is at most 8 blocks a multiprocessor (two rounds of the four that fit): it bounds
// the weight-grad partials too (ops/op_workspace.h).
int64_t blocks_for(int64_t tokens) {
  return op_workspace::qk_norm_rope_blocks(tokens, multiprocessor_count());
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
  const auto kernel = q_weight ? qk_norm_rope_forward_kernel<true> : qk_norm_rope_forward_kernel<false>;
  kernel<<<static_cast<unsigned>(blocks_for(tokens)), kThreads, 0, stream>>>(
      qkv_out, rstd, qkv, q_weight, k_weight, positions, rope, tokens, q_heads, kv_heads, head_dim, eps);
  LOOM_LAUNCH_CHECK();
}

int64_t qk_norm_rope_backward_scratch_bytes(int64_t tokens, int64_t head_dim) {
  return op_workspace::qk_norm_rope_backward_bytes(tokens, head_dim, multiprocessor_count());
}

void qk_norm_rope_backward(bf16* d_qkv, float* d_q_weight, float* d_k_weight, float* amax,
                           const bf16* d_qkv_out, const bf16* qkv, const bf16* q_weight, const bf16* k_weight,
                           const float* rstd, const int32_t* positions, const float2* rope, int64_t tokens,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, Scratch scratch,
                           cudaStream_t stream) {
  check_head_dim(head_dim);
  LOOM_ASSERT(scratch.bytes >= qk_norm_rope_backward_scratch_bytes(tokens, head_dim),
              "qk_norm_rope_backward scratch too small");
  if (amax) LOOM_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (tokens == 0) return;
  const int64_t blocks = blocks_for(tokens);
  float* q_partials = static_cast<float*>(scratch.data);
  float* k_partials = q_partials + blocks * head_dim;
  const bool norm = q_weight != nullptr;
  const auto kernel = norm ? qk_norm_rope_backward_kernel<true> : qk_norm_rope_backward_kernel<false>;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      d_qkv, q_partials, k_partials, amax, d_qkv_out, qkv, q_weight, k_weight, rstd, positions, rope, tokens,
      q_heads, kv_heads, d_qkv != d_qkv_out, head_dim);
  LOOM_LAUNCH_CHECK();
  if (!norm || !d_q_weight) return;  // no q/k norm, or frozen ones
  add_partials(d_q_weight, q_partials, blocks, head_dim, stream);
  add_partials(d_k_weight, k_partials, blocks, head_dim, stream);
}

}  // namespace loom::cuda
