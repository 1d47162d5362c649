// Embedding gather and its deterministic backward: (id, position) pairs are sorted by id
// with CUB's stable radix sort, so each id's rows are added in position order by the one
// block that owns the id's first sorted entry. No float atomics: the same bits every run.
// Both work on the table's rows [vocab_begin, vocab_begin + vocab): the whole table
// (vocab_begin 0), or a tensor-parallel rank's shard, where other ids give zeros forward and
// nothing backward (they sort after the shard's rows, under the key `vocab`).
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "ops/op_workspace.h"

namespace loom::cuda {
namespace {

// The row of `id` in the shard, or -1 outside it.
__device__ inline int64_t shard_row(int32_t id, int64_t vocab_begin, int64_t vocab) {
  const int64_t row = static_cast<int64_t>(id) - vocab_begin;
  return row >= 0 && row < vocab ? row : -1;
}

__global__ void embedding_forward_kernel(bf16* out, const int32_t* ids, const bf16* table, int64_t hidden,
                                         int64_t vocab_begin, int64_t vocab) {
  const int64_t t = blockIdx.x;
  const int64_t row = shard_row(ids[t], vocab_begin, vocab);
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x)
    out[t * hidden + i] = row >= 0 ? table[row * hidden + i] : __float2bfloat16(0.0f);
}

// The sort's keys and values: each token's row in the shard (`vocab` for ids outside it, so
// they sort last) and its position.
__global__ void sort_keys_kernel(int32_t* rows, int32_t* positions, const int32_t* ids, int64_t n,
                                 int64_t vocab_begin, int64_t vocab) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const int64_t row = shard_row(ids[i], vocab_begin, vocab);
  rows[i] = static_cast<int32_t>(row >= 0 ? row : vocab);
  positions[i] = static_cast<int32_t>(i);
}

__global__ void embedding_backward_kernel(float* d_table, const int32_t* sorted_rows,
                                          const int32_t* sorted_positions, const bf16* d_out, int64_t tokens,
                                          int64_t hidden, int64_t vocab) {
  const int64_t first = blockIdx.x;
  const int32_t row = sorted_rows[first];
  if (row == vocab) return;                                // outside the shard
  if (first > 0 && sorted_rows[first - 1] == row) return;  // not the row's first entry
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float sum = 0;
    for (int64_t j = first; j < tokens && sorted_rows[j] == row; ++j)
      sum += __bfloat162float(d_out[static_cast<int64_t>(sorted_positions[j]) * hidden + i]);
    d_table[static_cast<int64_t>(row) * hidden + i] += sum;
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
                       int64_t vocab_begin, int64_t vocab, cudaStream_t stream) {
  if (tokens == 0) return;
  embedding_forward_kernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(out, ids, table, hidden,
                                                                              vocab_begin, vocab);
  LOOM_LAUNCH_CHECK();
}

int64_t embedding_backward_scratch_bytes(int64_t tokens) {
  return op_workspace::embedding_backward_bytes(tokens, static_cast<int64_t>(sort_temp_bytes(tokens)));
}

void embedding_backward(float* d_table, const int32_t* ids, const bf16* d_out, int64_t tokens, int64_t hidden,
                        int64_t vocab_begin, int64_t vocab, Scratch scratch, cudaStream_t stream) {
  if (tokens == 0) return;
  LOOM_ASSERT(scratch.bytes >= embedding_backward_scratch_bytes(tokens),
              "embedding_backward scratch too small");
  const int64_t array = op_workspace::embedding_backward_array_bytes(tokens);
  uint8_t* base = static_cast<uint8_t*>(scratch.data);
  int32_t* rows = reinterpret_cast<int32_t*>(base);
  int32_t* positions = reinterpret_cast<int32_t*>(base + array);
  int32_t* sorted_rows = reinterpret_cast<int32_t*>(base + 2 * array);
  int32_t* sorted_positions = reinterpret_cast<int32_t*>(base + 3 * array);
  void* temp = base + 4 * array;
  size_t temp_bytes = sort_temp_bytes(tokens);
  sort_keys_kernel<<<static_cast<unsigned>(ceil_div(tokens, 256)), 256, 0, stream>>>(
      rows, positions, ids, tokens, vocab_begin, vocab);
  LOOM_LAUNCH_CHECK();
  // Keys up to `vocab` (the ids outside the shard) inclusive.
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, rows, sorted_rows, positions,
                                                  sorted_positions, static_cast<int>(tokens), 0,
                                                  vocab_bits(vocab + 1), stream));
  embedding_backward_kernel<<<static_cast<unsigned>(tokens), 256, 0, stream>>>(
      d_table, sorted_rows, sorted_positions, d_out, tokens, hidden, vocab);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
