// LoRA dropout (ops.h lora_dropout): an adapter's input with the mask of ops/lora_dropout.h
// applied, out (+)= x ⊙ m / (1 − p) in fp32, rounded once to bf16. The mask is drawn here from
// the value's address, the same function the CPU twin calls, so neither side stores it.
#include <cstdint>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "ops/lora_dropout.h"

namespace loom::cuda {
namespace {

struct Mask {
  const int32_t* tokens;  // [T, 2]: row in the step's batch, index in the row
  uint64_t seed;
  uint32_t threshold;
  float scale;
  int64_t feature_begin;
};

__device__ inline float masked(const Mask& m, uint64_t token, int64_t column, float x) {
  return lora_dropout_kept(token, m.feature_begin + column, m.threshold) ? x * m.scale : 0.0f;
}

// Eight values of one row a thread through 16-byte accesses (memory-bound, as add.cu), the
// token's seed drawn once for the eight; grid-stride over a grid that fills the GPU once.
__global__ void lora_dropout_vector_kernel(bf16* out, const bf16* x, Mask m, int64_t width, int64_t vectors,
                                           bool accumulate) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t at = 8 * i, t = at / width, column = at % width;
    const uint64_t token = lora_dropout_token(m.seed, m.tokens[2 * t], m.tokens[2 * t + 1]);
    float v[8], o[8];
    load_bf16x8(x + at, v);
    if (accumulate) load_bf16x8(out + at, o);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float d = masked(m, token, column + e, v[e]);
      v[e] = accumulate ? o[e] + d : d;
    }
    store_bf16x8(out + at, v);
  }
}

// Values [begin, n) one a thread: the tail past the last whole vector, or all of them where a
// row is not a whole number of vectors or a pointer is not 16-byte aligned.
__global__ void lora_dropout_scalar_kernel(bf16* out, const bf16* x, Mask m, int64_t width, int64_t begin,
                                           int64_t n, bool accumulate) {
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / width, column = i % width;
    const uint64_t token = lora_dropout_token(m.seed, m.tokens[2 * t], m.tokens[2 * t + 1]);
    const float d = masked(m, token, column, __bfloat162float(x[i]));
    out[i] = __float2bfloat16(accumulate ? __bfloat162float(out[i]) + d : d);
  }
}

}  // namespace

void lora_dropout(bf16* out, const bf16* x, const int32_t* tokens, uint64_t seed, uint32_t threshold,
                  float scale, int64_t feature_begin, int64_t rows, int64_t width, bool accumulate,
                  cudaStream_t stream) {
  const Mask m{tokens, seed, threshold, scale, feature_begin};
  const int64_t n = rows * width;
  const auto address = [](const bf16* p) { return reinterpret_cast<uintptr_t>(p); };
  const bool aligned = (address(out) | address(x)) % 16 == 0 && width % 8 == 0;
  const int64_t vectors = aligned ? n / 8 : 0;
  if (vectors > 0) {
    lora_dropout_vector_kernel<<<elementwise_grid(vectors), 256, 0, stream>>>(out, x, m, width, vectors,
                                                                              accumulate);
    LOOM_LAUNCH_CHECK();
  }
  if (8 * vectors < n) {
    lora_dropout_scalar_kernel<<<elementwise_grid(n - 8 * vectors), 256, 0, stream>>>(
        out, x, m, width, 8 * vectors, n, accumulate);
    LOOM_LAUNCH_CHECK();
  }
}

}  // namespace loom::cuda
