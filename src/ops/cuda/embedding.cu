// Embedding gather and its deterministic backward: (id, position) pairs are sorted by id
// with CUB's stable radix sort, so each id's rows are added in position order by the one
// block that owns the id's first sorted entry. No float atomics: the same bits every run.
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

__global__ void embedding_forward_kernel(bf16* out, const int32_t* ids, const bf16* table, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const bf16* row = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) out[t * hidden + i] = row[i];
}

__global__ void iota_kernel(int32_t* values, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) values[i] = static_cast<int32_t>(i);
}

__global__ void embedding_backward_kernel(float* d_table, const int32_t* sorted_ids,
                                          const int32_t* sorted_positions, const bf16* d_out, int64_t tokens,
                                          int64_t hidden) {
  const int64_t first = blockIdx.x;
  const int32_t id = sorted_ids[first];
  if (first > 0 && sorted_ids[first - 1] == id) return;  // not the id's first entry
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float sum = 0;
    for (int64_t j = first; j < tokens && sorted_ids[j] == id; ++j)
      sum += __bfloat162float(d_out[static_cast<int64_t>(sorted_positions[j]) * hidden + i]);
    d_table[static_cast<int64_t>(id) * hidden + i] += sum;
  }
}

int vocab_bits(int64_t vocab) {
  int bits = 1;
  while ((int64_t{1} << bits) < vocab) ++bits;
  return bits;
}

size_t sort_temp_bytes(int64_t tokens) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                  static_cast<int32_t*>(nullptr), static_cast<int>(tokens));
  return bytes;
}

}  // namespace

void embedding_forward(bf16* out, const int32_t* ids, const bf16* table, int64_t tokens, int64_t hidden,
                       cudaStream_t stream) {
  if (tokens == 0) return;
  embedding_forward_kernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(out, ids, table, hidden);
  LOOM_LAUNCH_CHECK();
}

int64_t embedding_backward_scratch_bytes(int64_t tokens) {
  // positions, sorted ids, sorted positions (each 256-byte aligned), then CUB's temporary.
  const int64_t array = (tokens * 4 + 255) / 256 * 256;
  return 3 * array + static_cast<int64_t>(sort_temp_bytes(tokens));
}

void embedding_backward(float* d_table, const int32_t* ids, const bf16* d_out, int64_t tokens, int64_t hidden,
                        int64_t vocab, Scratch scratch, cudaStream_t stream) {
  if (tokens == 0) return;
  LOOM_ASSERT(scratch.bytes >= embedding_backward_scratch_bytes(tokens),
              "embedding_backward scratch too small");
  const int64_t array = (tokens * 4 + 255) / 256 * 256;
  uint8_t* base = static_cast<uint8_t*>(scratch.data);
  int32_t* positions = reinterpret_cast<int32_t*>(base);
  int32_t* sorted_ids = reinterpret_cast<int32_t*>(base + array);
  int32_t* sorted_positions = reinterpret_cast<int32_t*>(base + 2 * array);
  void* temp = base + 3 * array;
  size_t temp_bytes = sort_temp_bytes(tokens);
  iota_kernel<<<static_cast<unsigned>(ceil_div(tokens, 256)), 256, 0, stream>>>(positions, tokens);
  LOOM_LAUNCH_CHECK();
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ids, sorted_ids, positions,
                                                  sorted_positions, static_cast<int>(tokens), 0,
                                                  vocab_bits(vocab), stream));
  embedding_backward_kernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(
      d_table, sorted_ids, sorted_positions, d_out, tokens, hidden);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
