// The residual add on its own, where no norm follows on the same rank to fuse it into (a
// pipeline stage's output, ops.h add): out = a + b in fp32, rounded once to bf16.
#include <cstdint>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

// Eight values a thread through 16-byte accesses (the add is memory-bound: wide accesses
// cut the instructions per byte), grid-stride over a grid that fills the GPU once.
__global__ void add_vector_kernel(bf16* out, const bf16* a, const bf16* b, int64_t vectors) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float x[8], y[8];
    load_bf16x8(a + 8 * i, x);
    load_bf16x8(b + 8 * i, y);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] += y[e];
    store_bf16x8(out + 8 * i, x);
  }
}

// Values [begin, n) one a thread: the tail past the last whole vector, or all of them where a
// pointer is not 16-byte aligned.
__global__ void add_scalar_kernel(bf16* out, const bf16* a, const bf16* b, int64_t begin, int64_t n) {
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

}  // namespace

void add(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream) {
  const auto address = [](const bf16* p) { return reinterpret_cast<uintptr_t>(p); };
  const bool aligned = (address(out) | address(a) | address(b)) % 16 == 0;
  const int64_t vectors = aligned ? n / 8 : 0;
  if (vectors > 0) {
    add_vector_kernel<<<elementwise_grid(vectors), 256, 0, stream>>>(out, a, b, vectors);
    LOOM_LAUNCH_CHECK();
  }
  if (8 * vectors < n) {
    add_scalar_kernel<<<elementwise_grid(n - 8 * vectors), 256, 0, stream>>>(out, a, b, 8 * vectors, n);
    LOOM_LAUNCH_CHECK();
  }
}

}  // namespace loom::cuda
