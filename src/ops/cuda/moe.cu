// The mixture-of-experts ops around the experts' GEMMs (ops.h "Mixture of experts"): the
// router's softmax and top-k and its backward, the dispatch order (a stable counting sort of
// the (token, slot) pairs by expert), the permutation of token rows into that order and back,
// the weighted combine and its backward, and the column sums of the router's probs.
//
// Deterministic throughout: the sort's counts are integers, every floating-point sum has a
// fixed order (a thread's loop over slots, a warp's butterfly, chunk partials added in
// order), and nothing waits on the host: the sort's offsets stay on the device for the
// grouped GEMMs.
#include <climits>
#include <cstdint>
#include <initializer_list>

#include "core/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "ops/op_workspace.h"

namespace loom::cuda {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

// Routing: a warp a token, 8 tokens a block. Lane l holds experts l, l + 32, l + 64, ...:
// kPerLane of them in registers (E ≤ 32·kPerLane), so that the k rounds of the top-k read no
// memory.
constexpr int kRouteWarps = 8;

template <int kPerLane>
__global__ void moe_route_forward_kernel(int32_t* expert_ids, float* weights, float* probs,
                                         const bf16* logits, int64_t tokens, int experts, int k,
                                         bool normalize) {
  const int lane = threadIdx.x % 32;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kRouteWarps) + threadIdx.x / 32;
  if (t >= tokens) return;  // the whole warp: t is the warp's
  const bf16* z = logits + t * experts;
  float p[kPerLane];
  float top = -INFINITY;
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int e = lane + 32 * s;
    p[s] = e < experts ? __bfloat162float(z[e]) : -INFINITY;
    top = fmaxf(top, p[s]);
  }
  top = warp_max(top);
  float total = 0.0f;
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    p[s] = lane + 32 * s < experts ? expf(p[s] - top) : 0.0f;
    total += p[s];
  }
  total = warp_sum(total);
  // Probs are ≥ 0; −1 marks a place that holds no expert, or one already chosen.
#pragma unroll
  for (int s = 0; s < kPerLane; ++s) {
    const int e = lane + 32 * s;
    if (e < experts) {
      p[s] /= total;
      probs[t * experts + e] = p[s];
    } else {
      p[s] = -1.0f;
    }
  }
  // Round j picks the largest prob left, the lower id among equal ones (the CPU twin's
  // strictly-larger scan in id order): each lane's best in id order, then a butterfly over
  // (prob, id) pairs, a total order, so every lane ends with the same winner. Lane j keeps
  // round j's; `chosen` adds the winners in round order, as the CPU twin does.
  int32_t my_id = 0;
  float my_weight = 0.0f, chosen = 0.0f;
  for (int j = 0; j < k; ++j) {
    float best = -1.0f;
    int best_id = INT_MAX;
#pragma unroll
    for (int s = 0; s < kPerLane; ++s) {
      if (p[s] > best) {
        best = p[s];
        best_id = lane + 32 * s;
      }
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(kFullMask, best, offset);
      const int other_id = __shfl_xor_sync(kFullMask, best_id, offset);
      if (other > best || (other == best && other_id < best_id)) {
        best = other;
        best_id = other_id;
      }
    }
#pragma unroll
    for (int s = 0; s < kPerLane; ++s)
      if (lane + 32 * s == best_id) p[s] = -1.0f;
    if (lane == j) {
      my_id = best_id;
      my_weight = best;
    }
    chosen += best;
  }
  if (lane < k) {
    expert_ids[t * k + lane] = my_id;
    weights[t * k + lane] = normalize ? my_weight / chosen : my_weight;
  }
}

// A warp a token. Its warp's row of d_p (E floats of shared memory) starts as
// d_probs_per_expert and takes each slot's gradient, added by lane 0 in slot order (as the
// CPU twin adds); then the softmax's backward, dz = p·(d_p − Σ p·d_p).
__global__ void moe_route_backward_kernel(bf16* d_logits, const float* d_weights,
                                          const float* d_probs_per_expert, const float* probs,
                                          const int32_t* expert_ids, const float* weights, int64_t tokens,
                                          int experts, int k, bool normalize) {
  extern __shared__ float shared_d_p[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t t = blockIdx.x * static_cast<int64_t>(kRouteWarps) + warp;
  if (t >= tokens) return;
  float* d_p = shared_d_p + warp * experts;
  const float* p = probs + t * experts;
  // Lane j holds slot j; an id out of range (not the forward's) adds nothing.
  int32_t id = -1;
  float p_id = 0.0f, dw = 0.0f, w = 0.0f;
  if (lane < k) {
    id = expert_ids[t * k + lane];
    if (id >= 0 && id < experts) {
      dw = d_weights[t * k + lane];
      w = weights[t * k + lane];
      p_id = p[id];
    } else {
      id = -1;
    }
  }
  // w_j = p_j / S with S = Σ_m p_m over the chosen: ∂/∂p_j = (dw_j − Σ_m dw_m · w_m) / S.
  const float chosen = warp_sum(p_id);
  const float dot_w = warp_sum(dw * w);
  const float slot_grad = normalize ? (dw - dot_w) / chosen : dw;
  for (int e = lane; e < experts; e += 32) d_p[e] = d_probs_per_expert ? d_probs_per_expert[e] : 0.0f;
  __syncwarp();
  for (int j = 0; j < k; ++j) {
    const int32_t id_j = __shfl_sync(kFullMask, id, j);
    const float grad_j = __shfl_sync(kFullMask, slot_grad, j);
    if (lane == 0 && id_j >= 0) d_p[id_j] += grad_j;
  }
  __syncwarp();
  float mean = 0.0f;
  for (int e = lane; e < experts; e += 32) mean += p[e] * d_p[e];
  mean = warp_sum(mean);
  for (int e = lane; e < experts; e += 32)
    d_logits[t * experts + e] = __float2bfloat16(p[e] * (d_p[e] - mean));
}

// The sort. Pairs i = t·k + j in chunks of kSortChunk, a block a chunk, each warp a run of
// kWarpPairs in 32-pair rounds. A key is the pair's expert, or `experts` for an id out of
// range. Three passes: each block counts its chunk's keys; one block scans the counts,
// key-major, into where each (key, chunk) run begins; each block counts again per warp and
// places each pair at its run's start plus the pairs of its key before it in (warp, round,
// lane) order, which is pair order: a stable sort.
constexpr int kSortThreads = 256, kSortWarps = kSortThreads / 32;
constexpr int64_t kSortChunk = op_workspace::kMoeSortChunkPairs;
constexpr int64_t kWarpPairs = kSortChunk / kSortWarps;
static_assert(kWarpPairs % 32 == 0, "a warp's run is whole rounds");
constexpr int kScanThreads = 1024;

__device__ inline int sort_key(const int32_t* ids, int64_t i, int experts) {
  const int32_t e = ids[i];
  return e >= 0 && e < experts ? e : experts;
}

// The pairs [begin, end) of this warp counted into counts[key] (this warp's row of shared
// memory). Lanes of one key in a round find each other with __match_any_sync; the lowest adds
// them all, so no two lanes write one place at once.
__device__ inline void count_warp_keys(int* counts, const int32_t* ids, int64_t begin, int64_t end,
                                       int experts) {
  const int lane = threadIdx.x % 32;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t i = base + lane;
    const int key = i < end ? sort_key(ids, i, experts) : -1;
    const unsigned same = __match_any_sync(kFullMask, key);
    if (key >= 0 && (same & ((1u << lane) - 1)) == 0) counts[key] += __popc(same);
    __syncwarp();
  }
}

// counts[key · chunks + chunk] = the chunk's pairs of `key` (keys 0..experts).
__global__ void moe_sort_count_kernel(int32_t* counts, const int32_t* ids, int64_t pairs, int experts) {
  extern __shared__ int warp_counts[];  // [kSortWarps][experts + 1]
  const int keys = experts + 1, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < kSortWarps * keys; i += blockDim.x) warp_counts[i] = 0;
  __syncthreads();
  const int64_t begin = blockIdx.x * kSortChunk + warp * kWarpPairs;
  count_warp_keys(warp_counts + warp * keys, ids, begin, min(begin + kWarpPairs, pairs), experts);
  __syncthreads();
  for (int key = threadIdx.x; key < keys; key += blockDim.x) {
    int total = 0;
    for (int w = 0; w < kSortWarps; ++w) total += warp_counts[w * keys + key];
    counts[static_cast<int64_t>(key) * gridDim.x + blockIdx.x] = total;
  }
}

// One block: counts[0, n) replaced by their exclusive prefix sum (each thread a contiguous
// run), then offsets[e] = the start of key e's first chunk, e = 0..experts (offsets[experts]:
// the pairs of valid ids, all of them when every id is in range).
__global__ void moe_sort_scan_kernel(int32_t* counts, int32_t* offsets, int64_t n, int64_t chunks,
                                     int experts) {
  __shared__ int warp_starts[kScanThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t per_thread = ceil_div(n, kScanThreads);
  const int64_t begin = threadIdx.x * per_thread, end = min(begin + per_thread, n);
  int run = 0;
  for (int64_t i = begin; i < end; ++i) run += counts[i];
  int inclusive = run;
  for (int offset = 1; offset < 32; offset *= 2) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_starts[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int total = warp_starts[lane];
    int warp_inclusive = total;
    for (int offset = 1; offset < 32; offset *= 2) {
      const int other = __shfl_up_sync(kFullMask, warp_inclusive, offset);
      if (lane >= offset) warp_inclusive += other;
    }
    warp_starts[lane] = warp_inclusive - total;
  }
  __syncthreads();
  int start = warp_starts[warp] + inclusive - run;
  for (int64_t i = begin; i < end; ++i) {
    const int count = counts[i];
    counts[i] = start;
    start += count;
  }
  __syncthreads();  // the starts of other threads' runs are read below
  for (int e = threadIdx.x; e <= experts; e += blockDim.x) offsets[e] = counts[e * chunks];
}

// positions[i] for the chunk's pairs, from starts[key · chunks + chunk] (the scanned counts).
__global__ void moe_sort_place_kernel(int32_t* positions, const int32_t* ids, const int32_t* starts,
                                      int64_t pairs, int experts) {
  extern __shared__ int next[];  // [kSortWarps][experts + 1]: counts, then each warp's next place
  const int keys = experts + 1, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < kSortWarps * keys; i += blockDim.x) next[i] = 0;
  __syncthreads();
  const int64_t begin = blockIdx.x * kSortChunk + warp * kWarpPairs;
  const int64_t end = min(begin + kWarpPairs, pairs);
  count_warp_keys(next + warp * keys, ids, begin, end, experts);
  __syncthreads();
  // A warp's first place for a key: the chunk's start plus the earlier warps' counts.
  for (int key = threadIdx.x; key < keys; key += blockDim.x) {
    int place = starts[static_cast<int64_t>(key) * gridDim.x + blockIdx.x];
    for (int w = 0; w < kSortWarps; ++w) {
      const int count = next[w * keys + key];
      next[w * keys + key] = place;
      place += count;
    }
  }
  __syncthreads();
  int* warp_next = next + warp * keys;
  for (int64_t base = begin; base < end; base += 32) {
    const int64_t i = base + lane;
    const int key = i < end ? sort_key(ids, i, experts) : -1;
    const unsigned same = __match_any_sync(kFullMask, key);
    const unsigned earlier = same & ((1u << lane) - 1);
    if (key >= 0) positions[i] = warp_next[key] + __popc(earlier);
    __syncwarp();  // every lane has read warp_next before the first of its key moves it on
    if (key >= 0 && earlier == 0) warp_next[key] += __popc(same);
    __syncwarp();
  }
}

// Rows of bf16 values kWidth at a time: 8 through 16-byte accesses when the hidden size is a
// multiple of 8 and the rows 16-byte aligned (every Qwen3 size), else one at a time.
template <int kWidth>
__device__ inline void load_row_part(const bf16* p, float (&out)[kWidth]) {
  if constexpr (kWidth == 8)
    load_bf16x8(p, out);
  else
    out[0] = __bfloat162float(*p);
}

template <int kWidth>
__device__ inline void store_row_part(bf16* p, const float (&in)[kWidth]) {
  if constexpr (kWidth == 8)
    store_bf16x8(p, in);
  else
    *p = __float2bfloat16(in[0]);
}

constexpr int kRowThreads = 128;

// A block a token: its row read once and written to its k places.
template <int kWidth>
__global__ void moe_permute_kernel(bf16* sorted, const bf16* x, const int32_t* positions, int64_t hidden,
                                   int k) {
  const int64_t t = blockIdx.x;
  const int32_t* place = positions + t * k;
  for (int64_t c = threadIdx.x * kWidth; c < hidden; c += kRowThreads * kWidth) {
    if constexpr (kWidth == 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(x + t * hidden + c);
      for (int j = 0; j < k; ++j) *reinterpret_cast<uint4*>(sorted + place[j] * hidden + c) = v;
    } else {
      const bf16 v = x[t * hidden + c];
      for (int j = 0; j < k; ++j) sorted[place[j] * hidden + c] = v;
    }
  }
}

template <int kWidth>
__global__ void moe_permute_backward_kernel(bf16* d_x, const bf16* d_sorted, const int32_t* positions,
                                            int64_t hidden, int k, bool accumulate) {
  const int64_t t = blockIdx.x;
  const int32_t* place = positions + t * k;
  for (int64_t c = threadIdx.x * kWidth; c < hidden; c += kRowThreads * kWidth) {
    float sum[kWidth];
    if (accumulate) {
      load_row_part<kWidth>(d_x + t * hidden + c, sum);
    } else {
#pragma unroll
      for (int e = 0; e < kWidth; ++e) sum[e] = 0.0f;
    }
    for (int j = 0; j < k; ++j) {
      float v[kWidth];
      load_row_part<kWidth>(d_sorted + place[j] * hidden + c, v);
#pragma unroll
      for (int e = 0; e < kWidth; ++e) sum[e] += v[e];
    }
    store_row_part<kWidth>(d_x + t * hidden + c, sum);
  }
}

template <int kWidth>
__global__ void moe_combine_forward_kernel(bf16* out, const bf16* y, const int32_t* positions,
                                           const float* weights, int64_t hidden, int k) {
  const int64_t t = blockIdx.x;
  const int32_t* place = positions + t * k;
  const float* w = weights + t * k;
  for (int64_t c = threadIdx.x * kWidth; c < hidden; c += kRowThreads * kWidth) {
    float sum[kWidth];
#pragma unroll
    for (int e = 0; e < kWidth; ++e) sum[e] = 0.0f;
    for (int j = 0; j < k; ++j) {
      float v[kWidth];
      load_row_part<kWidth>(y + place[j] * hidden + c, v);
      const float weight = w[j];
#pragma unroll
      for (int e = 0; e < kWidth; ++e) sum[e] += weight * v[e];
    }
    store_row_part<kWidth>(out + t * hidden + c, sum);
  }
}

// A warp a (token, slot) pair, 8 a block: its d_y row and its weight's gradient, the warp's
// dot product of d_out[t] and y[positions[t, j]] added by a butterfly (a fixed order).
constexpr int kCombineWarps = 8;

template <int kWidth>
__global__ void moe_combine_backward_kernel(bf16* d_y, float* d_weights, const bf16* d_out, const bf16* y,
                                            const int32_t* positions, const float* weights, int64_t pairs,
                                            int64_t hidden, int k) {
  const int lane = threadIdx.x % 32;
  const int64_t pair = blockIdx.x * static_cast<int64_t>(kCombineWarps) + threadIdx.x / 32;
  if (pair >= pairs) return;
  const int64_t t = pair / k, row = positions[pair];
  const float w = weights[pair];
  float dot = 0.0f;
  for (int64_t c = lane * kWidth; c < hidden; c += 32 * kWidth) {
    float g[kWidth], v[kWidth], dy[kWidth];
    load_row_part<kWidth>(d_out + t * hidden + c, g);
    load_row_part<kWidth>(y + row * hidden + c, v);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      dot += g[e] * v[e];
      dy[e] = w * g[e];
    }
    store_row_part<kWidth>(d_y + row * hidden + c, dy);
  }
  dot = warp_sum(dot);
  if (lane == 0) d_weights[pair] = dot;
}

// Block (column block x, chunk y): partials[y, column] = Σ of the chunk's rows in fp64.
constexpr int64_t kColumnChunkRows = op_workspace::kColumnSumChunkRows;

__global__ void column_sum_partials_kernel(double* partials, const float* x, int64_t rows, int64_t cols) {
  const int64_t column = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (column >= cols) return;
  const int64_t begin = blockIdx.y * kColumnChunkRows;
  const int64_t end = begin + kColumnChunkRows < rows ? begin + kColumnChunkRows : rows;
  double sum = 0.0;
  for (int64_t r = begin; r < end; ++r) sum += x[r * cols + column];
  partials[blockIdx.y * cols + column] = sum;
}

__global__ void column_sum_final_kernel(float* out, const double* partials, int64_t chunks, int64_t cols) {
  const int64_t column = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (column >= cols) return;
  double sum = 0.0;
  for (int64_t c = 0; c < chunks; ++c) sum += partials[c * cols + column];
  out[column] = static_cast<float>(sum);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The 16-byte path when the rows allow it (every pointer 16-byte aligned, hidden a multiple of 8).
bool rows_vectorized(int64_t hidden, std::initializer_list<const void*> rows) {
  if (hidden % 8 != 0) return false;
  for (const void* p : rows)
    if (!aligned16(p)) return false;
  return true;
}

}  // namespace

void moe_route_forward(int32_t* expert_ids, float* weights, float* probs, const bf16* logits, int64_t tokens,
                       int64_t experts, int64_t k, bool normalize, cudaStream_t stream) {
  LOOM_ASSERT(experts >= 1 && experts <= kMoeMaxExperts && k >= 1 && k <= kMoeMaxTopK && k <= experts,
              "moe_route_forward: experts or top-k out of the kernel's range");
  if (tokens == 0) return;
  // A lane's share of the row in registers, E/32 rounded up to a power of two: 1 at E ≤ 32, 16 at 512.
  const auto kernel = experts <= 32    ? moe_route_forward_kernel<1>
                      : experts <= 64  ? moe_route_forward_kernel<2>
                      : experts <= 128 ? moe_route_forward_kernel<4>
                      : experts <= 256 ? moe_route_forward_kernel<8>
                                       : moe_route_forward_kernel<16>;
  kernel<<<static_cast<unsigned>(ceil_div(tokens, kRouteWarps)), 32 * kRouteWarps, 0, stream>>>(
      expert_ids, weights, probs, logits, tokens, static_cast<int>(experts), static_cast<int>(k), normalize);
  LOOM_LAUNCH_CHECK();
}

void moe_route_backward(bf16* d_logits, const float* d_weights, const float* d_probs_per_expert,
                        const float* probs, const int32_t* expert_ids, const float* weights, int64_t tokens,
                        int64_t experts, int64_t k, bool normalize, cudaStream_t stream) {
  LOOM_ASSERT(experts >= 1 && experts <= kMoeMaxExperts && k >= 1 && k <= kMoeMaxTopK,
              "moe_route_backward: experts or top-k out of the kernel's range");
  if (tokens == 0) return;
  const size_t shared = static_cast<size_t>(kRouteWarps * experts) * sizeof(float);  // 16 KB at E = 512
  moe_route_backward_kernel<<<static_cast<unsigned>(ceil_div(tokens, kRouteWarps)), 32 * kRouteWarps, shared,
                              stream>>>(d_logits, d_weights, d_probs_per_expert, probs, expert_ids, weights,
                                        tokens, static_cast<int>(experts), static_cast<int>(k), normalize);
  LOOM_LAUNCH_CHECK();
}

int64_t moe_sort_scratch_bytes(int64_t pairs, int64_t experts) {
  return op_workspace::moe_sort_bytes(pairs, experts);
}

void moe_sort(int32_t* positions, int32_t* offsets, const int32_t* expert_ids, int64_t pairs, int64_t experts,
              Scratch scratch, cudaStream_t stream) {
  LOOM_ASSERT(experts >= 1 && experts <= kMoeSortMaxExperts, "moe_sort: experts out of the kernel's range");
  LOOM_ASSERT(pairs < INT32_MAX, "moe_sort: positions past int32");
  LOOM_ASSERT(scratch.bytes >= moe_sort_scratch_bytes(pairs, experts), "moe_sort scratch too small");
  if (pairs == 0) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(offsets, 0, static_cast<size_t>(experts + 1) * 4, stream));
    return;
  }
  const int64_t chunks = ceil_div(pairs, kSortChunk);
  auto* counts = static_cast<int32_t*>(scratch.data);
  const int e = static_cast<int>(experts);
  const size_t shared = static_cast<size_t>(kSortWarps * (experts + 1)) * sizeof(int);  // 32 KB at E = 1,024
  moe_sort_count_kernel<<<static_cast<unsigned>(chunks), kSortThreads, shared, stream>>>(counts, expert_ids,
                                                                                         pairs, e);
  LOOM_LAUNCH_CHECK();
  moe_sort_scan_kernel<<<1, kScanThreads, 0, stream>>>(counts, offsets, chunks * (experts + 1), chunks, e);
  LOOM_LAUNCH_CHECK();
  moe_sort_place_kernel<<<static_cast<unsigned>(chunks), kSortThreads, shared, stream>>>(
      positions, expert_ids, counts, pairs, e);
  LOOM_LAUNCH_CHECK();
}

void moe_permute(bf16* sorted, const bf16* x, const int32_t* positions, int64_t tokens, int64_t k,
                 int64_t hidden, cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return;
  const unsigned grid = static_cast<unsigned>(tokens);
  const auto kernel = rows_vectorized(hidden, {sorted, x}) ? moe_permute_kernel<8> : moe_permute_kernel<1>;
  kernel<<<grid, kRowThreads, 0, stream>>>(sorted, x, positions, hidden, static_cast<int>(k));
  LOOM_LAUNCH_CHECK();
}

void moe_permute_backward(bf16* d_x, const bf16* d_sorted, const int32_t* positions, int64_t tokens,
                          int64_t k, int64_t hidden, bool accumulate, cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return;
  const unsigned grid = static_cast<unsigned>(tokens);
  const auto kernel = rows_vectorized(hidden, {d_x, d_sorted}) ? moe_permute_backward_kernel<8>
                                                               : moe_permute_backward_kernel<1>;
  kernel<<<grid, kRowThreads, 0, stream>>>(d_x, d_sorted, positions, hidden, static_cast<int>(k), accumulate);
  LOOM_LAUNCH_CHECK();
}

void moe_combine_forward(bf16* out, const bf16* y, const int32_t* positions, const float* weights,
                         int64_t tokens, int64_t k, int64_t hidden, cudaStream_t stream) {
  if (tokens == 0 || hidden == 0) return;
  const unsigned grid = static_cast<unsigned>(tokens);
  const auto kernel =
      rows_vectorized(hidden, {out, y}) ? moe_combine_forward_kernel<8> : moe_combine_forward_kernel<1>;
  kernel<<<grid, kRowThreads, 0, stream>>>(out, y, positions, weights, hidden, static_cast<int>(k));
  LOOM_LAUNCH_CHECK();
}

void moe_combine_backward(bf16* d_y, float* d_weights, const bf16* d_out, const bf16* y,
                          const int32_t* positions, const float* weights, int64_t tokens, int64_t k,
                          int64_t hidden, cudaStream_t stream) {
  const int64_t pairs = tokens * k;
  if (pairs == 0) return;
  const unsigned grid = static_cast<unsigned>(ceil_div(pairs, kCombineWarps));
  const auto kernel = rows_vectorized(hidden, {d_y, d_out, y}) ? moe_combine_backward_kernel<8>
                                                               : moe_combine_backward_kernel<1>;
  kernel<<<grid, 32 * kCombineWarps, 0, stream>>>(d_y, d_weights, d_out, y, positions, weights, pairs, hidden,
                                                  static_cast<int>(k));
  LOOM_LAUNCH_CHECK();
}

int64_t column_sum_scratch_bytes(int64_t rows, int64_t cols) {
  return op_workspace::column_sum_bytes(rows, cols);
}

void column_sum(float* out, const float* x, int64_t rows, int64_t cols, Scratch scratch,
                cudaStream_t stream) {
  LOOM_ASSERT(scratch.bytes >= column_sum_scratch_bytes(rows, cols), "column_sum scratch too small");
  if (cols == 0) return;
  if (rows == 0) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(cols) * 4, stream));
    return;
  }
  const int64_t chunks = ceil_div(rows, kColumnChunkRows);
  LOOM_ASSERT(chunks <= 65535, "column_sum: too many rows for the grid's y dimension");
  // Threads a block: the columns rounded up to a warp, at most 256 (E = 128: one block of 128).
  const int threads = static_cast<int>(cols < 256 ? ceil_div(cols, 32) * 32 : 256);
  auto* partials = static_cast<double*>(scratch.data);
  const unsigned column_blocks = static_cast<unsigned>(ceil_div(cols, threads));
  column_sum_partials_kernel<<<dim3(column_blocks, static_cast<unsigned>(chunks)), threads, 0, stream>>>(
      partials, x, rows, cols);
  LOOM_LAUNCH_CHECK();
  column_sum_final_kernel<<<column_blocks, threads, 0, stream>>>(out, partials, chunks, cols);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
