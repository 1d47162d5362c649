// Context parallelism's split of a micro-batch over the CP ranks (docs/parallel.md, "Context
// parallelism"): pure index arithmetic, no Comm and no model.
//
// A micro-batch is whole rows of row_tokens tokens laid end to end. Each row is cut into 2·cp
// equal chunks, and CP rank r holds chunks r and 2·cp − 1 − r of every row, in that order
// (Megatron's load-balanced split: under a causal mask the early chunks see few keys and the
// late ones many, so pairing chunk r with its mirror gives every rank the same work). For
// row_tokens 8 and cp 2 (chunks of 2): rank 0 holds tokens 0 1 6 7, rank 1 tokens 2 3 4 5.
//
// A rank's tokens keep what one rank computes for them: their true position (RoPE) and their
// attention span. The spans are the micro-batch's (RowSpans::offsets: each row, or under
// isolated packing each sample and the row's padding), so a sample that crosses a chunk
// boundary still attends from its own first token, whichever rank holds it.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

// The row positions (in [0, row_tokens)) of CP rank `rank`'s tokens of one row, in the rank's
// order: chunk rank, then chunk 2·cp − 1 − rank. InputError (field "workload.row_tokens,
// layout.cp") when row_tokens is not a positive multiple of 2·cp.
std::vector<int32_t> context_row_tokens(int64_t row_tokens, int64_t cp, int64_t rank);

// CP rank `rank`'s tokens of a micro-batch of whole rows with attention spans `span_offsets`
// (RowSpans::offsets: 0, each span's end; every span within one row).
struct ContextShard {
  // Per local token, in the rank's order (row after row, each as context_row_tokens):
  std::vector<int32_t> source;     // its index in the micro-batch (the rows' order)
  std::vector<int32_t> key_begin;  // its span's first token (a micro-batch index): the first key it sees
  std::vector<int32_t> positions;  // its position in its span, source − key_begin: RoPE's
};
ContextShard context_shard(const std::vector<int32_t>& span_offsets, int64_t row_tokens, int64_t cp,
                           int64_t rank);

// The two orders of a micro-batch's `tokens` tokens that an all-gather over the CP group
// moves between: the gathered order (every rank's tokens, rank after rank, each in its own
// order) and the micro-batch's. context_rank_order[g] is the micro-batch index of gathered
// token g (what a reduce-scatter back to the ranks reads); context_row_order[t] the gathered
// index of micro-batch token t (what puts an all-gather's output back in the rows' order).
// Each is the other's inverse.
std::vector<int32_t> context_rank_order(int64_t tokens, int64_t row_tokens, int64_t cp);
std::vector<int32_t> context_row_order(int64_t tokens, int64_t row_tokens, int64_t cp);

// How a CP rank's attention reaches the other ranks' keys (layout.cp_comm): all_gather gathers
// every rank's qkv and attends to the whole rows at once (context_rank_order above), ring
// passes K/V blocks around the group (below).
enum class ContextComm : uint8_t { all_gather, ring };

// The ring form's schedule (docs/parallel.md, "The ring form"): the K/V blocks travel around
// the CP group, each rank sending to rank + 1 and receiving from rank − 1, so at step s
// (0 ≤ s < cp) CP rank `rank` holds the block of CP rank (rank − s) mod cp: that rank's k and
// v heads, its tokens in its order (context_row_tokens). Under the causal mask each of the
// rank's two query chunks sees each of the block's two key chunks (of every row) whole, up
// to its diagonal, or not at all: mask[q][k] for the rank's chunk q (0: chunk rank, 1: chunk
// 2·cp − 1 − rank) and the block's chunk k (the same for the block's rank). A span of isolated
// packing sees a subset of its causal keys, so `none` pairs are skipped on every kind of row.
// With this split every step has live pairs: a block from a lower rank is seen by both query
// chunks through its first chunk only, one from a higher rank by the second query chunk only
// (Megatron's three cases).
enum class ChunkMask : uint8_t { none, causal, full };
struct RingStep {
  int64_t block = 0;  // the CP rank whose K/V block this rank holds
  ChunkMask mask[2][2] = {};
};
std::vector<RingStep> context_ring_schedule(int64_t cp, int64_t rank);

}  // namespace loom
