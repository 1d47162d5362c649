// Shared helpers of the .cu files: launch checks and warp/block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/cuda_check.h"

#define LOOM_LAUNCH_CHECK() LOOM_CUDA_CHECK(cudaGetLastError())

namespace loom::cuda {

// d_weight[i] += Σ_b partials[b·width + i] in a fixed order (rmsnorm.cu).
void add_partials(float* d_weight, const float* partials, int64_t blocks, int64_t width, cudaStream_t stream);

__host__ __device__ inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The current device's multiprocessor count (132 on an H100 or H200 SXM): the fixed grids
// below are a number of blocks a multiprocessor. Read once per device (device.cu), since
// it is asked on every launch.
int multiprocessor_count();

// The grid of an elementwise kernel's grid-stride loop over n items, 256 threads a block:
// enough blocks to fill the GPU once, 16 of 256 threads a multiprocessor.
inline unsigned elementwise_grid(int64_t n) {
  const int64_t max_blocks = 16 * static_cast<int64_t>(multiprocessor_count());
  const int64_t blocks = ceil_div(n, 256);
  return static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks);
}

// Eight bf16 values through one 16-byte access, as fp32 (the memory-bound kernels move whole
// 16-byte vectors: a quarter of the instructions per byte of paired accesses). `p` must be
// 16-byte aligned: every row of a hidden size that is a multiple of 8 is.
// Eight bf16 values held as one 16-byte word, as floats: a kernel may load the words of
// several items first (the loads in flight together) and widen each when it uses it.
__device__ inline void unpack_bf16x8(const uint4& raw, float (&out)[8]) {
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(pairs[j]);
    out[2 * j] = f.x;
    out[2 * j + 1] = f.y;
  }
}

__device__ inline void load_bf16x8(const __nv_bfloat16* p, float (&out)[8]) {
  unpack_bf16x8(*reinterpret_cast<const uint4*>(p), out);
}

__device__ inline void store_bf16x8(__nv_bfloat16* p, const float (&in)[8]) {
  uint4 raw;
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int j = 0; j < 4; ++j) pairs[j] = __floats2bfloat162_rn(in[2 * j], in[2 * j + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}

template <typename T>
__device__ inline T warp_sum(T value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

template <typename T>
__device__ inline T warp_max(T value) {
  for (int offset = 16; offset > 0; offset /= 2)
    value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Sum over a block of up to 1024 threads; every thread gets the result. `shared` holds 32
// values. The order is fixed by the block size, so the result is deterministic.
template <typename T>
__device__ inline T block_sum(T value, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  value = warp_sum(value);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  return warp_sum(total);
}

template <typename T>
__device__ inline T block_max(T value, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  value = warp_max(value);
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(-INFINITY);
  return warp_max(total);
}

// The magnitude of v as stored in bf16: what an amax of the stored tensor sees.
__device__ inline float stored_magnitude(float v) {
  return fabsf(__bfloat162float(__float2bfloat16(v)));
}

// Joins this block's `most` (≥ 0; each thread's, NaN passed over by fmaxf as the CPU twin's
// std::fmax) into *amax, an amax that a memset zeroed before the kernel (ops.h amax and the
// producers' out_amax). Thread 0 joins the block's max by an integer atomicMax on its bits:
// non-negative floats order as their bit patterns, and a max is the same whichever block
// comes first, so the result is deterministic. A block whose max is not above the value
// already there skips the atomic: kernels of a block per token would otherwise queue tens
// of thousands of them on one address. Call it last: threads other than 0 return.
__device__ inline void block_amax_into(float* amax, float most) {
  for (int offset = 16; offset > 0; offset /= 2)
    most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, offset));
  __shared__ float warps[32];
  __syncthreads();
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = most;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (unsigned w = 1; w < (blockDim.x + 31) / 32; ++w) most = fmaxf(most, warps[w]);
  if (most > __ldcg(amax)) atomicMax(reinterpret_cast<int*>(amax), __float_as_int(most));
}

}  // namespace loom::cuda
