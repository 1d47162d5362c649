// The op workspace a kernel asks for, as a function of its shape and the GPU: the one
// definition the CUDA kernels size their scratch with (ops/cuda/*.cu, cuda_ops.cpp) and
// `loom plan`'s shape backend (ops/shape/shape_ops.h) counts. Host code, no CUDA: the plan
// runs where there is no GPU, so the multiprocessor count is an argument.
#pragma once

#include <algorithm>
#include <cstdint>

namespace loom::op_workspace {

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// rmsnorm.cu: blocks a multiprocessor of the backward's weight-gradient partials (enough to
// fill the GPU); each block adds its tokens' dy·x̂ per column, a float partial per column.
constexpr int64_t kRmsnormWeightGradBlocksPerSm = 8;
constexpr int64_t rmsnorm_weight_grad_blocks(int64_t tokens, int64_t multiprocessors) {
  return std::min(tokens, kRmsnormWeightGradBlocksPerSm * multiprocessors);
}
constexpr int64_t rmsnorm_backward_bytes(int64_t tokens, int64_t hidden, int64_t multiprocessors) {
  return rmsnorm_weight_grad_blocks(tokens, multiprocessors) * hidden * 4;
}

// qk_norm_rope.cu: the grid is at most 8 blocks a multiprocessor (two rounds of the four that
// fit); it bounds the q and k weight-gradient partials, a float per head_dim column each.
constexpr int64_t kQkNormRopeGridBlocksPerSm = 8;
constexpr int64_t qk_norm_rope_blocks(int64_t tokens, int64_t multiprocessors) {
  return std::min(tokens, kQkNormRopeGridBlocksPerSm * multiprocessors);
}
constexpr int64_t qk_norm_rope_backward_bytes(int64_t tokens, int64_t head_dim, int64_t multiprocessors) {
  return 2 * qk_norm_rope_blocks(tokens, multiprocessors) * head_dim * 4;
}

// bias.cu: a float partial per column of each chunk of 256 rows.
constexpr int64_t kBiasChunkRows = 256;
constexpr int64_t bias_backward_bytes(int64_t tokens, int64_t width) {
  return ceil_div(tokens, kBiasChunkRows) * width * 4;
}

// reduce.cu: a fixed grid of 4 blocks a multiprocessor, an fp64 partial each.
constexpr int64_t kReduceBlocksPerSm = 4;
constexpr int64_t reduce_blocks(int64_t multiprocessors) {
  return kReduceBlocksPerSm * multiprocessors;
}
constexpr int64_t reduce_bytes(int64_t multiprocessors) {
  return reduce_blocks(multiprocessors) * 8;
}

// embedding.cu: rows, positions, sorted rows and sorted positions, each 256-byte aligned,
// then CUB's radix-sort temporary (which CUB sizes on the GPU: embedding_sort_bytes_estimate
// stands for it where there is none, about a second copy of keys and values).
constexpr int64_t embedding_backward_array_bytes(int64_t tokens) {
  return ceil_div(tokens * 4, 256) * 256;
}
constexpr int64_t embedding_backward_bytes(int64_t tokens, int64_t sort_bytes) {
  return 4 * embedding_backward_array_bytes(tokens) + sort_bytes;
}
constexpr int64_t embedding_sort_bytes_estimate(int64_t tokens) {
  return 2 * tokens * 8;
}

// moe.cu moe_sort: the T·k (token, slot) pairs in chunks of 2,048 (a block's: 8 warps of 256),
// an int32 count per chunk of each expert and of the key past the last (ids out of range),
// which a scan turns in place into where each chunk's pairs of an expert begin. 1M pairs
// over 512 experts: 512 chunks, 1 MB.
constexpr int64_t kMoeSortChunkPairs = 2048;
constexpr int64_t moe_sort_bytes(int64_t pairs, int64_t experts) {
  return ceil_div(pairs, kMoeSortChunkPairs) * (experts + 1) * 4;
}

// moe.cu column_sum: an fp64 partial per column of each chunk of 256 rows, added in order.
constexpr int64_t kColumnSumChunkRows = 256;
constexpr int64_t column_sum_bytes(int64_t rows, int64_t cols) {
  return ceil_div(rows, kColumnSumChunkRows) * cols * 8;
}

// cuda_ops.cpp lm_head_chunks: the lm_head's bf16 logits, a chunk of rows at a time: the
// fewest chunks of at most loss_chunk_tokens, of equal size up to a multiple of 256 (10,240
// rows are two of 5,120, not 8,192 and 2,048).
constexpr int64_t lm_head_chunk_rows(int64_t tokens, int64_t loss_chunk_tokens) {
  const int64_t chunks = ceil_div(tokens, loss_chunk_tokens);
  return std::min({loss_chunk_tokens, tokens, ceil_div(ceil_div(tokens, chunks), 256) * 256});
}
constexpr int64_t lm_head_logits_bytes(int64_t tokens, int64_t vocab, int64_t loss_chunk_tokens) {
  return lm_head_chunk_rows(tokens, loss_chunk_tokens) * vocab * 2;
}

// grouped_gemm.cu (the MoE layers' grouped GEMMs): CUTLASS's TMA descriptors, which its
// grouped kernel rewrites in global memory as a multiprocessor moves from expert to expert
// (128 bytes each, at most 5 a multiprocessor: A, B, C and one D for each of two epilogue
// warp groups; three 64-byte alignments between its parts), then the per-expert arguments
// the setup kernel writes: 9 arrays (the problem shape; the pointers to A, B, C, D; their
// strides) of 16 bytes an expert at most, each 256-byte aligned.
constexpr int64_t kGroupedGemmTensorMapsPerSm = 5, kGroupedGemmTensorMapBytes = 128;
constexpr int64_t kGroupedGemmArrays = 9, kGroupedGemmArrayEntryBytes = 16;
constexpr int64_t grouped_gemm_tensor_map_bytes(int64_t multiprocessors) {
  return ceil_div(kGroupedGemmTensorMapsPerSm * kGroupedGemmTensorMapBytes * multiprocessors + 3 * 64, 256) *
         256;
}
constexpr int64_t grouped_gemm_array_bytes(int64_t experts) {
  return ceil_div(experts * kGroupedGemmArrayEntryBytes, 256) * 256;
}
constexpr int64_t grouped_gemm_workspace_bytes(int64_t experts, int64_t multiprocessors) {
  return grouped_gemm_tensor_map_bytes(multiprocessors) +
         kGroupedGemmArrays * grouped_gemm_array_bytes(experts);
}

// cuda_ops.cpp grouped_linear_*: CUTLASS's kernel takes n and k in multiples of 8 (TMA's
// 16-byte rows); other shapes (no Qwen3 MoE's) run grouped_linear.cu's CUDA-core kernels,
// which need no workspace. The backward's two GEMMs share one workspace.
constexpr bool grouped_gemm_takes(int64_t n, int64_t k) {
  return n % 8 == 0 && k % 8 == 0;
}
constexpr int64_t grouped_linear_bytes(int64_t experts, int64_t n, int64_t k, int64_t multiprocessors) {
  return grouped_gemm_takes(n, k) ? grouped_gemm_workspace_bytes(experts, multiprocessors) : 0;
}

// cuda_ops.cpp attention_shape: rows of unequal lengths run as THD with their count and
// longest length bucketed to powers of two (at least 8 sequences of at least 64 tokens).
constexpr int64_t power_of_two_at_least(int64_t n, int64_t floor) {
  int64_t p = floor;
  while (p < n) p *= 2;
  return p;
}
constexpr int64_t kThdMinSequences = 8, kThdMinSequenceTokens = 64;

}  // namespace loom::op_workspace
