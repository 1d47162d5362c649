// Shared helpers of the .cu files: launch checks and warp/block reductions.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/cuda_check.h"

#define LOOM_LAUNCH_CHECK() LOOM_CUDA_CHECK(cudaGetLastError())

namespace loom::cuda {

// d_weight[i] += Σ_b partials[b·width + i], b in order (rmsnorm.cu).
void add_partials(float* d_weight, const float* partials, int64_t blocks, int64_t width, cudaStream_t stream);

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
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

}  // namespace loom::cuda
