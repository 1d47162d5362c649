// q/k RMSNorm over head_dim and rotate-half RoPE on the fused qkv, forward and backward.
// A group of G = head_dim / kElems lanes per (token, head), each lane holding kElems
// neighbouring values in registers (head_dim 128: a warp, four values a lane, one 8-byte
// load). The rotation pairs element i with i + hd/2, which sits kElems·G/2 values on: the
// same position of lane + G/2, one shuffle away. A warp handles 32 / G heads at once.
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

constexpr int kWarps = 8;                    // warps per block
constexpr int64_t kWeightGradBlocks = 1056;  // 8 per multiprocessor: enough to fill the GPU

// kElems bf16 values at p (8- or 16-byte aligned) as fp32, and back.
template <int kElems>
__device__ inline void load_elems(const bf16* p, float (&out)[kElems]) {
  static_assert(kElems == 4 || kElems == 8);
  if constexpr (kElems == 8) {
    load_bf16x8(p, out);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(p);
    const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float2 f = __bfloat1622float2(pairs[j]);
      out[2 * j] = f.x;
      out[2 * j + 1] = f.y;
    }
  }
}

template <int kElems>
__device__ inline void store_elems(bf16* p, const float (&in)[kElems]) {
  if constexpr (kElems == 8) {
    store_bf16x8(p, in);
  } else {
    uint2 raw;
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int j = 0; j < 2; ++j) pairs[j] = __floats2bfloat162_rn(in[2 * j], in[2 * j + 1]);
    *reinterpret_cast<uint2*>(p) = raw;
  }
}

// Sum over the aligned group of `lanes` lanes (a power of two ≤ 32) this lane belongs to.
__device__ inline float group_sum(float value, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

// Where a lane is: its (token, head) pair, its place in the head, and its rope angles.
struct LaneSlot {
  int64_t pair, t, h;
  int sub;    // lane within the head's group
  bool valid;  // pair < tokens · heads (idle lanes still take part in the shuffles)
  bool low;   // holds elements of the first half of the head
};

__device__ inline LaneSlot lane_slot(int64_t slot, int lanes, int64_t tokens, int64_t total_heads) {
  const int lane = threadIdx.x % 32;
  LaneSlot s;
  s.pair = slot * (32 / lanes) + lane / lanes;
  s.sub = lane % lanes;
  s.valid = s.pair < tokens * total_heads;
  s.t = s.valid ? s.pair / total_heads : 0;
  s.h = s.valid ? s.pair % total_heads : 0;
  s.low = s.sub < lanes / 2;
  return s;
}

template <int kElems>
__global__ void qk_norm_rope_forward_kernel(bf16* qkv_out, float* rstd, const bf16* qkv, const bf16* q_weight,
                                            const bf16* k_weight, const int32_t* positions,
                                            const float2* rope, int64_t tokens, int64_t q_heads,
                                            int64_t kv_heads, int64_t head_dim, float eps) {
  const int lanes = static_cast<int>(head_dim / kElems);
  const int64_t total_heads = q_heads + 2 * kv_heads, half = head_dim / 2;
  const LaneSlot s =
      lane_slot(blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32, lanes, tokens, total_heads);
  const int64_t at = s.pair * head_dim + s.sub * kElems;
  float x[kElems] = {};
  if (s.valid) load_elems<kElems>(qkv + at, x);
  const bool is_v = s.h >= q_heads + kv_heads;
  float sum_sq = 0;
#pragma unroll
  for (int e = 0; e < kElems; ++e) sum_sq += x[e] * x[e];
  const float r = rsqrtf(group_sum(sum_sq, lanes) / static_cast<float>(head_dim) + eps);
  if (s.valid && !is_v && s.sub == 0) rstd[s.t * (q_heads + kv_heads) + s.h] = r;
  float w[kElems], normed[kElems], partner[kElems], out[kElems];
  load_elems<kElems>((s.h < q_heads ? q_weight : k_weight) + s.sub * kElems, w);
#pragma unroll
  for (int e = 0; e < kElems; ++e) normed[e] = x[e] * r * w[e];
#pragma unroll
  for (int e = 0; e < kElems; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, normed[e], lanes / 2);
  if (!s.valid) return;
  if (is_v) {  // v heads pass through
    store_elems<kElems>(qkv_out + at, x);
    return;
  }
  const float2* angles = rope + static_cast<int64_t>(positions[s.t]) * half + (s.sub % (lanes / 2)) * kElems;
#pragma unroll
  for (int e = 0; e < kElems; ++e) {
    const float2 cs = angles[e];
    // out[i] = n[i]·c − n[i+h]·s (i < h); out[i+h] = n[i+h]·c + n[i]·s.
    out[e] = normed[e] * cs.x + (s.low ? -partner[e] : partner[e]) * cs.y;
  }
  store_elems<kElems>(qkv_out + at, out);
}

// Per (token, head): dn = the rotation's transpose applied to dy; n = x̂·w, x̂ = x·rstd;
// dx = rstd·(dn·w − x̂·mean(dn·w·x̂)); the weight partial += dn·x̂. Block b handles the
// warp slots b·kWarps + warp, + gridDim.x·kWarps, ...; each lane adds its columns' partials
// in registers, and the block adds its lanes' in a fixed order at the end.
template <int kElems>
__global__ void qk_norm_rope_backward_kernel(bf16* d_qkv, float* q_partials, float* k_partials,
                                             const bf16* d_out, const bf16* qkv, const bf16* q_weight,
                                             const bf16* k_weight, const float* rstd,
                                             const int32_t* positions, const float2* rope, int64_t tokens,
                                             int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  __shared__ float q_acc[kWarps * 32][kElems];
  __shared__ float k_acc[kWarps * 32][kElems];
  const int lanes = static_cast<int>(head_dim / kElems);
  const int64_t total_heads = q_heads + 2 * kv_heads, half = head_dim / 2;
  const int64_t slots = ceil_div(tokens * total_heads, 32 / lanes);
  float qw[kElems], kw[kElems], q_sum[kElems] = {}, k_sum[kElems] = {};
  const int sub = (threadIdx.x % 32) % lanes;
  load_elems<kElems>(q_weight + sub * kElems, qw);
  load_elems<kElems>(k_weight + sub * kElems, kw);
  for (int64_t slot = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32; slot < slots;
       slot += static_cast<int64_t>(gridDim.x) * kWarps) {
    const LaneSlot s = lane_slot(slot, lanes, tokens, total_heads);
    const int64_t at = s.pair * head_dim + s.sub * kElems;
    const bool is_q = s.h < q_heads, is_v = s.h >= q_heads + kv_heads;
    float dy[kElems] = {}, x[kElems] = {}, partner[kElems], dn[kElems];
    if (s.valid) load_elems<kElems>(d_out + at, dy);
#pragma unroll
    for (int e = 0; e < kElems; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, dy[e], lanes / 2);
    const bool normed = s.valid && !is_v;
    const float r = normed ? rstd[s.t * (q_heads + kv_heads) + s.h] : 0.0f;
    if (normed) {
      load_elems<kElems>(qkv + at, x);
      const float2* angles =
          rope + static_cast<int64_t>(positions[s.t]) * half + (s.sub % (lanes / 2)) * kElems;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const float2 cs = angles[e];
        dn[e] = dy[e] * cs.x + (s.low ? partner[e] : -partner[e]) * cs.y;
      }
    } else {
#pragma unroll
      for (int e = 0; e < kElems; ++e) dn[e] = 0;
    }
    // Selected element by element: a pointer to either array would put both in local memory.
    float w[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) w[e] = is_q ? qw[e] : kw[e];
    float dot = 0;
#pragma unroll
    for (int e = 0; e < kElems; ++e) dot += dn[e] * w[e] * x[e] * r;
    const float mean = group_sum(dot, lanes) / static_cast<float>(head_dim);
    if (!s.valid) continue;
    if (is_v) {
      store_elems<kElems>(d_qkv + at, dy);
      continue;
    }
    float dx[kElems];
#pragma unroll
    for (int e = 0; e < kElems; ++e) {
      const float x_hat = x[e] * r;
      dx[e] = r * (dn[e] * w[e] - x_hat * mean);
      if (is_q)
        q_sum[e] += dn[e] * x_hat;
      else
        k_sum[e] += dn[e] * x_hat;
    }
    store_elems<kElems>(d_qkv + at, dx);
  }
#pragma unroll
  for (int e = 0; e < kElems; ++e) {
    q_acc[threadIdx.x][e] = q_sum[e];
    k_acc[threadIdx.x][e] = k_sum[e];
  }
  __syncthreads();
  // Column i belongs to lane i / kElems of every group: add them in thread order.
  for (int64_t i = threadIdx.x; i < head_dim; i += blockDim.x) {
    const int owner = static_cast<int>(i / kElems), e = static_cast<int>(i % kElems);
    float q = 0, k = 0;
    for (int thread = owner; thread < kWarps * 32; thread += lanes) {
      q += q_acc[thread][e];
      k += k_acc[thread][e];
    }
    q_partials[blockIdx.x * head_dim + i] = q;
    k_partials[blockIdx.x * head_dim + i] = k;
  }
}

int64_t weight_grad_blocks(int64_t pairs, int64_t heads_per_warp) {
  const int64_t needed = ceil_div(ceil_div(pairs, heads_per_warp), kWarps);
  return needed < kWeightGradBlocks ? needed : kWeightGradBlocks;
}

// Values a lane holds: four (8-byte accesses) up to head_dim 128, eight beyond. The group
// of head_dim / elems lanes must be a power of two between 2 and 32.
int elems_for(int64_t head_dim) {
  const int elems = head_dim > 128 ? 8 : 4;
  const int64_t lanes = head_dim / elems;
  LOOM_ASSERT(head_dim % elems == 0 && lanes >= 2 && lanes <= 32 && (lanes & (lanes - 1)) == 0,
              "qk_norm_rope: the CUDA kernels need head_dim = 8, 16, 32, 64, 128 or 256");
  return elems;
}

template <typename Launch>
void with_elems(int64_t head_dim, Launch launch) {
  if (elems_for(head_dim) == 8)
    launch(std::integral_constant<int, 8>{});
  else
    launch(std::integral_constant<int, 4>{});
  LOOM_LAUNCH_CHECK();
}

}  // namespace

void qk_norm_rope_forward(bf16* qkv_out, float* rstd, const bf16* qkv, const bf16* q_weight,
                          const bf16* k_weight, const int32_t* positions, const float2* rope, int64_t tokens,
                          int64_t q_heads, int64_t kv_heads, int64_t head_dim, float eps,
                          cudaStream_t stream) {
  const int64_t pairs = tokens * (q_heads + 2 * kv_heads);
  if (pairs == 0) return;
  with_elems(head_dim, [&](auto elems) {
    constexpr int kElems = decltype(elems)::value;
    const int64_t heads_per_warp = 32 / (head_dim / kElems);
    const auto blocks = static_cast<unsigned>(ceil_div(ceil_div(pairs, heads_per_warp), kWarps));
    qk_norm_rope_forward_kernel<kElems><<<blocks, kWarps * 32, 0, stream>>>(
        qkv_out, rstd, qkv, q_weight, k_weight, positions, rope, tokens, q_heads, kv_heads, head_dim, eps);
  });
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
  LOOM_ASSERT(scratch.bytes >= qk_norm_rope_backward_scratch_bytes(tokens, head_dim),
              "qk_norm_rope_backward scratch too small");
  const int64_t pairs = tokens * (q_heads + 2 * kv_heads);
  if (pairs == 0) return;
  int64_t blocks = 0;
  float* q_partials = static_cast<float*>(scratch.data);
  with_elems(head_dim, [&](auto elems) {
    constexpr int kElems = decltype(elems)::value;
    blocks = weight_grad_blocks(pairs, 32 / (head_dim / kElems));
    qk_norm_rope_backward_kernel<kElems><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
        d_qkv, q_partials, q_partials + blocks * head_dim, d_qkv_out, qkv, q_weight, k_weight, rstd, positions,
        rope, tokens, q_heads, kv_heads, head_dim);
  });
  add_partials(d_q_weight, q_partials, blocks, head_dim, stream);
  add_partials(d_k_weight, q_partials + blocks * head_dim, blocks, head_dim, stream);
}

}  // namespace loom::cuda
