#include "parallel/context_split.h"

#include <array>
#include <string>

#include "core/error.h"

namespace loom {

std::vector<int32_t> context_row_tokens(int64_t row_tokens, int64_t cp, int64_t rank) {
  LOOM_ASSERT(cp >= 1 && rank >= 0 && rank < cp, "context_row_tokens: rank outside the CP group");
  if (row_tokens <= 0 || row_tokens % (2 * cp) != 0)
    throw_input_error("workload.row_tokens, layout.cp",
                      "found " + std::to_string(row_tokens) + ", expected a positive multiple of 2·cp = " +
                          std::to_string(2 * cp) + " (each CP rank takes two of 2·cp chunks of a row)");
  const int64_t chunk = row_tokens / (2 * cp);
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(2 * chunk));
  for (int64_t c : {rank, 2 * cp - 1 - rank})
    for (int64_t i = 0; i < chunk; ++i) out.push_back(static_cast<int32_t>(c * chunk + i));
  return out;
}

ContextShard context_shard(const std::vector<int32_t>& span_offsets, int64_t row_tokens, int64_t cp,
                           int64_t rank) {
  const std::vector<int32_t> in_row = context_row_tokens(row_tokens, cp, rank);
  LOOM_ASSERT(!span_offsets.empty() && span_offsets.front() == 0 && span_offsets.back() % row_tokens == 0,
              "context_shard: spans that are not whole rows");
  const int64_t tokens = span_offsets.back();
  // Each token's span start, from the spans in order.
  std::vector<int32_t> span_begin(static_cast<size_t>(tokens));
  for (size_t s = 0; s + 1 < span_offsets.size(); ++s) {
    const int32_t begin = span_offsets[s], end = span_offsets[s + 1];
    LOOM_ASSERT(begin < end && begin / row_tokens == (end - 1) / row_tokens,
                "context_shard: a span that is empty or crosses a row");
    for (int32_t t = begin; t < end; ++t) span_begin[static_cast<size_t>(t)] = begin;
  }
  ContextShard shard;
  for (int64_t row = 0; row < tokens / row_tokens; ++row)
    for (int32_t t : in_row) {
      const auto source = static_cast<int32_t>(row * row_tokens + t);
      const int32_t key_begin = span_begin[static_cast<size_t>(source)];
      shard.source.push_back(source);
      shard.key_begin.push_back(key_begin);
      shard.positions.push_back(source - key_begin);
    }
  return shard;
}

std::vector<int32_t> context_rank_order(int64_t tokens, int64_t row_tokens, int64_t cp) {
  LOOM_ASSERT(tokens >= 0 && row_tokens > 0 && tokens % row_tokens == 0,
              "context_rank_order: tokens that are not whole rows");
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(tokens));
  for (int64_t rank = 0; rank < cp; ++rank) {
    const std::vector<int32_t> in_row = context_row_tokens(row_tokens, cp, rank);
    for (int64_t row = 0; row < tokens / row_tokens; ++row)
      for (int32_t t : in_row) out.push_back(static_cast<int32_t>(row * row_tokens + t));
  }
  return out;
}

std::vector<int32_t> context_row_order(int64_t tokens, int64_t row_tokens, int64_t cp) {
  const std::vector<int32_t> rank_order = context_rank_order(tokens, row_tokens, cp);
  std::vector<int32_t> out(rank_order.size());
  for (size_t g = 0; g < rank_order.size(); ++g)
    out[static_cast<size_t>(rank_order[g])] = static_cast<int32_t>(g);
  return out;
}

std::vector<RingStep> context_ring_schedule(int64_t cp, int64_t rank) {
  LOOM_ASSERT(cp >= 1 && rank >= 0 && rank < cp, "context_ring_schedule: rank outside the CP group");
  auto chunks = [cp](int64_t r) { return std::array<int64_t, 2>{r, 2 * cp - 1 - r}; };
  std::vector<RingStep> steps;
  for (int64_t s = 0; s < cp; ++s) {
    RingStep step;
    step.block = (rank - s + cp) % cp;
    for (size_t q = 0; q < 2; ++q)
      for (size_t k = 0; k < 2; ++k) {
        const int64_t query_chunk = chunks(rank)[q], key_chunk = chunks(step.block)[k];
        step.mask[q][k] = key_chunk < query_chunk    ? ChunkMask::full
                          : key_chunk == query_chunk ? ChunkMask::causal
                                                     : ChunkMask::none;
      }
    steps.push_back(step);
  }
  return steps;
}

}  // namespace loom
