// Context parallelism's keys and values by piece (ops.h attention_context_backward;
// context_attention.h): each piece of this rank's queries reads its keys' K and V from a block
// of its own and writes their dK and dV to one, and a key read by several pieces (the two
// chunks of a row, both reading the row's first chunk) gets their sum, in piece order, in fp32.
#include <cstdint>

#include "core/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

// One block a token of the whole micro-batch, eight values a thread (head_dim is a multiple of
// 8: cuDNN's SDPA needs it). Its q heads are written 0, its k and v heads the sum of the
// blocks that `cover` lists for it.
__global__ void context_kv_sum_kernel(bf16* d_whole, const bf16* d_kv_pieces, const int32_t* cover,
                                      int64_t cover_width, int64_t q_width, int64_t kv_width) {
  const int64_t j = blockIdx.x;
  bf16* row = d_whole + j * (q_width + kv_width);
  for (int64_t c = 8 * threadIdx.x; c < q_width + kv_width; c += 8 * blockDim.x) {
    float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c >= q_width) {
      for (int64_t s = 0; s < cover_width; ++s) {
        const int32_t from = cover[j * cover_width + s];
        if (from < 0) break;
        float part[8];
        load_bf16x8(d_kv_pieces + from * kv_width + (c - q_width), part);
#pragma unroll
        for (int e = 0; e < 8; ++e) sum[e] += part[e];
      }
    }
    store_bf16x8(row + c, sum);
  }
}

// One block a packed key: its k and v heads out of whole's row, as 16-byte words.
__global__ void context_kv_gather_kernel(bf16* kv_pieces, const bf16* whole, const int32_t* source,
                                         int64_t q_width, int64_t kv_width) {
  const int64_t p = blockIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(whole + source[p] * (q_width + kv_width) + q_width);
  uint4* dst = reinterpret_cast<uint4*>(kv_pieces + p * kv_width);
  for (int64_t w = threadIdx.x; w < kv_width / 8; w += blockDim.x) dst[w] = src[w];
}

}  // namespace

void context_kv_gather(bf16* kv_pieces, const bf16* whole, const int32_t* source, int64_t packed,
                       int64_t q_heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream) {
  if (packed == 0) return;
  LOOM_ASSERT(head_dim % 8 == 0, "context_kv_gather needs a head_dim that is a multiple of 8");
  context_kv_gather_kernel<<<static_cast<unsigned>(packed), 128, 0, stream>>>(
      kv_pieces, whole, source, q_heads * head_dim, 2 * kv_heads * head_dim);
  LOOM_LAUNCH_CHECK();
}

void context_kv_sum(bf16* d_whole, const bf16* d_kv_pieces, const int32_t* cover, int64_t cover_width,
                    int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                    cudaStream_t stream) {
  if (tokens == 0) return;
  LOOM_ASSERT(head_dim % 8 == 0, "context_kv_sum needs a head_dim that is a multiple of 8");
  context_kv_sum_kernel<<<static_cast<unsigned>(tokens), 128, 0, stream>>>(
      d_whole, d_kv_pieces, cover, cover_width, q_heads * head_dim, 2 * kv_heads * head_dim);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
