// Rows moved by position (ops.h gather_rows / scatter_rows): the lm_head's rows with a
// target gathered before it and their gradient put back after it (decoder.cpp).
#include <cstdint>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

// One block a moved row. Rows whose width is a multiple of 8 (every Qwen3 hidden size) move
// as 16-byte words; others value by value.
template <bool kScatter>
__global__ void move_rows_kernel(bf16* out, const bf16* x, const int32_t* index, int64_t width) {
  const int64_t i = blockIdx.x, position = index[i];
  const int64_t from = (kScatter ? i : position) * width, to = (kScatter ? position : i) * width;
  if (width % 8 == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(x + from);
    uint4* dst = reinterpret_cast<uint4*>(out + to);
    for (int64_t w = threadIdx.x; w < width / 8; w += blockDim.x) dst[w] = src[w];
  } else {
    for (int64_t e = threadIdx.x; e < width; e += blockDim.x) out[to + e] = x[from + e];
  }
}

template <bool kScatter>
void move_rows(bf16* out, const bf16* x, const int32_t* index, int64_t n, int64_t width,
               cudaStream_t stream) {
  if (n == 0) return;
  move_rows_kernel<kScatter><<<static_cast<unsigned>(n), 128, 0, stream>>>(out, x, index, width);
  LOOM_LAUNCH_CHECK();
}

}  // namespace

void gather_rows(bf16* out, const bf16* x, const int32_t* index, int64_t n, int64_t width,
                 cudaStream_t stream) {
  move_rows<false>(out, x, index, n, width, stream);
}

void scatter_rows(bf16* out, const bf16* x, const int32_t* index, int64_t n, int64_t width,
                  cudaStream_t stream) {
  move_rows<true>(out, x, index, n, width, stream);
}

}  // namespace loom::cuda
