// Deterministic sums over fp32 arrays (the loss's Σ nll, the grad norm's Σ g²): a fixed grid
// of blocks each adds a strided share in fp64, then one block adds the partials in order.
// fp64 because the grad norm sums billions of squares; the reduction is memory-bound, so
// the fp64 adds cost nothing measurable. Each fp64 operation is spelled with its intrinsic
// (a square added as one fma, as nvcc's default contraction had compiled `sum += v * v`), so
// the fused scale + Σ x² below adds exactly what a scale pass followed by Σ x² adds.
#include <algorithm>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "ops/op_workspace.h"

namespace loom::cuda {
namespace {

constexpr int kThreads = 512;

// The grid of every kernel here: a fixed grid per device, so a sum's order (and bits) is
// the same at every call.
int grid_blocks() {
  return static_cast<int>(op_workspace::reduce_blocks(multiprocessor_count()));
}

// A thread's elements are i, i + stride, i + 2·stride, ... (stride: the grid's threads),
// added in that order. The loads of kUnroll of them are issued before the first is added:
// one 4-byte load a thread at a time keeps too few bytes in flight to reach HBM's rate.
// The order of the adds, and so the bits, are those of the one-at-a-time loop.
constexpr int kUnroll = 8;

// visit(i, x[i]) for this thread's elements, in order.
template <typename Visit>
__device__ inline void for_each_thread_element(const float* x, int64_t n, Visit visit) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    float values[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) values[u] = x[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) visit(i + u * stride, values[u]);
  }
  for (; i < n; i += stride) visit(i, x[i]);
}

__global__ void reduce_partials_kernel(double* partials, const float* x, int64_t n, bool square) {
  __shared__ double shared[32];
  double sum = 0;
  for_each_thread_element(x, n, [&](int64_t, float x_value) {
    const double value = x_value;
    sum = square ? __fma_rn(value, value, sum) : __dadd_rn(sum, value);
  });
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// scale_kernel then reduce_partials_kernel (square) in one pass: the same grid, so each
// thread scales and adds the same elements in the same order, and the scaled value is
// rounded to fp32 (__fmul_rn, never contracted) and stored before it is squared, as the
// separate scale pass stored it. One read + write of x instead of a read + write and a read.
__global__ void scale_square_partials_kernel(double* partials, float* x, int64_t n, float scale) {
  __shared__ double shared[32];
  double sum = 0;
  for_each_thread_element(x, n, [&](int64_t at, float x_value) {
    const float scaled = __fmul_rn(x_value, scale);
    x[at] = scaled;
    const double value = scaled;
    sum = __fma_rn(value, value, sum);
  });
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

__global__ void reduce_final_kernel(double* result, const double* partials, int count) {
  __shared__ double shared[32];
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) *result = sum;
}

// A 64-bit fingerprint of n 16-bit words: each word, mixed with its index (splitmix64's
// finaliser), added into one sum. Addition commutes, so the grid's order does not matter.
__device__ inline uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fingerprint_kernel(unsigned long long* result, const uint16_t* words, int64_t n) {
  uint64_t sum = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    sum += mix((static_cast<uint64_t>(i) << 16) ^ words[i]);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0) atomicAdd(result, static_cast<unsigned long long>(sum));
}

__device__ inline bool is_nonfinite(float v) {
  return (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u;  // exponent all ones: ±inf or NaN
}

// Range blockIdx.y; the x blocks stride over it, each warp adds its count once.
__global__ void count_nonfinite_kernel(unsigned long long* counts, const float* x, const CountRange* ranges) {
  const CountRange r = ranges[blockIdx.y];
  const float* values = x + r.offset;
  unsigned long long count = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < r.numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    count += is_nonfinite(values[i]) ? 1 : 0;
  for (int offset = 16; offset > 0; offset /= 2) count += __shfl_xor_sync(0xffffffffu, count, offset);
  if ((threadIdx.x & 31) == 0 && count > 0) atomicAdd(counts + r.slot, count);
}

__global__ void scale_kernel(float* x, int64_t n, float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(x[i], scale);
}

}  // namespace

int64_t reduce_scratch_bytes() {
  return op_workspace::reduce_bytes(multiprocessor_count());
}

void reduce_sum(double* result, const float* x, int64_t n, bool square, Scratch scratch,
                cudaStream_t stream) {
  LOOM_ASSERT(scratch.bytes >= reduce_scratch_bytes(), "reduce_sum scratch too small");
  double* partials = static_cast<double*>(scratch.data);
  const int blocks = grid_blocks();
  reduce_partials_kernel<<<blocks, kThreads, 0, stream>>>(partials, x, n, square);
  LOOM_LAUNCH_CHECK();
  reduce_final_kernel<<<1, kThreads, 0, stream>>>(result, partials, blocks);
  LOOM_LAUNCH_CHECK();
}

void scale_reduce_sum_squares(double* result, float* x, int64_t n, float scale, Scratch scratch,
                              cudaStream_t stream) {
  LOOM_ASSERT(scratch.bytes >= reduce_scratch_bytes(), "scale_reduce_sum_squares scratch too small");
  double* partials = static_cast<double*>(scratch.data);
  const int blocks = grid_blocks();
  scale_square_partials_kernel<<<blocks, kThreads, 0, stream>>>(partials, x, n, scale);
  LOOM_LAUNCH_CHECK();
  reduce_final_kernel<<<1, kThreads, 0, stream>>>(result, partials, blocks);
  LOOM_LAUNCH_CHECK();
}

void scale_inplace(float* x, int64_t n, float scale, cudaStream_t stream) {
  if (n == 0) return;
  scale_kernel<<<grid_blocks(), kThreads, 0, stream>>>(x, n, scale);
  LOOM_LAUNCH_CHECK();
}

void count_nonfinite(unsigned long long* counts, const float* x, const CountRange* ranges, int count,
                     int64_t max_numel, cudaStream_t stream) {
  // Blocks a range: enough for 8 values a thread of the largest, at most the reductions' grid
  // (which Qwen3-32B's 778M-value embedding gets); a small range's blocks past its end return
  // at once.
  const unsigned blocks =
      static_cast<unsigned>(std::clamp<int64_t>(ceil_div(max_numel, kThreads * 8), 1, grid_blocks()));
  constexpr int kMostRanges = 65535;  // gridDim.y's limit
  for (int first = 0; first < count; first += kMostRanges) {
    const unsigned ranges_here = static_cast<unsigned>(std::min(kMostRanges, count - first));
    count_nonfinite_kernel<<<dim3(blocks, ranges_here), kThreads, 0, stream>>>(counts, x, ranges + first);
    LOOM_LAUNCH_CHECK();
  }
}

void fingerprint(unsigned long long* result, const void* data, int64_t bytes, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof *result, stream));
  const int64_t words = bytes / 2;
  if (words == 0) return;
  fingerprint_kernel<<<grid_blocks(), kThreads, 0, stream>>>(result, static_cast<const uint16_t*>(data),
                                                             words);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
