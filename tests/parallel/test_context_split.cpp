// Context parallelism's split of a micro-batch (parallel/context_split.h) against examples
// worked out by hand.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "core/error.h"
#include "parallel/context_split.h"

namespace loom {
namespace {

using Ints = std::vector<int32_t>;

TEST(ContextSplit, ChunksPairEachRankWithItsMirror) {
  // 8 tokens, cp 2: chunks of 2; rank 0 takes chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(context_row_tokens(8, 2, 0), (Ints{0, 1, 6, 7}));
  EXPECT_EQ(context_row_tokens(8, 2, 1), (Ints{2, 3, 4, 5}));
  // 16 tokens, cp 4: chunks of 2; rank r takes chunks r and 7 − r.
  EXPECT_EQ(context_row_tokens(16, 4, 0), (Ints{0, 1, 14, 15}));
  EXPECT_EQ(context_row_tokens(16, 4, 1), (Ints{2, 3, 12, 13}));
  EXPECT_EQ(context_row_tokens(16, 4, 2), (Ints{4, 5, 10, 11}));
  EXPECT_EQ(context_row_tokens(16, 4, 3), (Ints{6, 7, 8, 9}));
  // cp 1 is the whole row in order.
  EXPECT_EQ(context_row_tokens(4, 1, 0), (Ints{0, 1, 2, 3}));
}

TEST(ContextSplit, RefusesARowNotOfWholeChunksNamingTheFields) {
  try {
    context_row_tokens(20, 4, 0);
    FAIL() << "20 tokens split into 8 chunks";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("workload.row_tokens, layout.cp"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("multiple of 2·cp = 8"), std::string::npos) << e.what();
  }
}

TEST(ContextSplit, PlainRowsRestartPositionsAtEachRow) {
  // Two rows of 8, each one span: rank 1 holds tokens 2..5 of each row.
  const ContextShard s = context_shard({0, 8, 16}, 8, 2, 1);
  EXPECT_EQ(s.source, (Ints{2, 3, 4, 5, 10, 11, 12, 13}));
  EXPECT_EQ(s.key_begin, (Ints{0, 0, 0, 0, 8, 8, 8, 8}));
  EXPECT_EQ(s.positions, (Ints{2, 3, 4, 5, 2, 3, 4, 5}));
  const ContextShard r0 = context_shard({0, 8, 16}, 8, 2, 0);
  EXPECT_EQ(r0.source, (Ints{0, 1, 6, 7, 8, 9, 14, 15}));
  EXPECT_EQ(r0.positions, (Ints{0, 1, 6, 7, 0, 1, 6, 7}));
}

TEST(ContextSplit, IsolatedSamplesKeepTheirSpansAcrossChunks) {
  // One row of 8: samples [0, 3) and [3, 7), padding [7, 8). Sample 0 crosses from chunk 0
  // (rank 0) into chunk 1 (rank 1); sample 1 spans chunks 1, 2 and 3 (both ranks).
  const Ints spans{0, 3, 7, 8};
  const ContextShard r0 = context_shard(spans, 8, 2, 0);
  EXPECT_EQ(r0.source, (Ints{0, 1, 6, 7}));
  EXPECT_EQ(r0.key_begin, (Ints{0, 0, 3, 7}));
  EXPECT_EQ(r0.positions, (Ints{0, 1, 3, 0}));
  const ContextShard r1 = context_shard(spans, 8, 2, 1);
  EXPECT_EQ(r1.source, (Ints{2, 3, 4, 5}));
  EXPECT_EQ(r1.key_begin, (Ints{0, 3, 3, 3}));
  EXPECT_EQ(r1.positions, (Ints{2, 0, 1, 2}));
}

TEST(ContextSplit, IsolatedSamplesUnderCp4) {
  // One row of 16, cp 4 (chunks of 2): samples [0, 5), [5, 6), [6, 13), padding [13, 16).
  const Ints spans{0, 5, 6, 13, 16};
  const ContextShard r1 = context_shard(spans, 16, 4, 1);  // tokens 2 3 12 13
  EXPECT_EQ(r1.key_begin, (Ints{0, 0, 6, 13}));
  EXPECT_EQ(r1.positions, (Ints{2, 3, 6, 0}));
  const ContextShard r2 = context_shard(spans, 16, 4, 2);  // tokens 4 5 10 11
  EXPECT_EQ(r2.key_begin, (Ints{0, 5, 6, 6}));
  EXPECT_EQ(r2.positions, (Ints{4, 0, 4, 5}));
}

TEST(ContextSplit, GatheredAndRowOrdersAreEachOthersInverse) {
  // Two rows of 8, cp 2: the all-gather holds rank 0's 0 1 6 7 8 9 14 15, then rank 1's.
  const Ints rank_order = context_rank_order(16, 8, 2);
  EXPECT_EQ(rank_order, (Ints{0, 1, 6, 7, 8, 9, 14, 15, 2, 3, 4, 5, 10, 11, 12, 13}));
  const Ints row_order = context_row_order(16, 8, 2);
  EXPECT_EQ(row_order, (Ints{0, 1, 8, 9, 10, 11, 2, 3, 4, 5, 12, 13, 14, 15, 6, 7}));
  for (size_t g = 0; g < rank_order.size(); ++g)
    EXPECT_EQ(row_order[static_cast<size_t>(rank_order[g])], static_cast<int32_t>(g));
  // Each rank's part of the gathered order is its shard's sources.
  const ContextShard r1 = context_shard({0, 8, 16}, 8, 2, 1);
  EXPECT_EQ(Ints(rank_order.begin() + 8, rank_order.end()), r1.source);
}

constexpr ChunkMask N = ChunkMask::none, C = ChunkMask::causal, F = ChunkMask::full;

// A step's block and its mask as rows of the rank's query chunks, columns of the block's key chunks.
void expect_step(const RingStep& step, int64_t block, std::array<std::array<ChunkMask, 2>, 2> mask) {
  EXPECT_EQ(step.block, block);
  for (size_t q = 0; q < 2; ++q)
    for (size_t k = 0; k < 2; ++k)
      EXPECT_EQ(step.mask[q][k], mask[q][k]) << "query chunk " << q << ", key chunk " << k;
}

TEST(ContextSplit, RingScheduleUnderCp2) {
  // Rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2. Step 0: its own block (the diagonal:
  // chunk 0 sees itself causally, chunk 3 sees chunk 0 whole and itself causally); step 1: the
  // other rank's block.
  const std::vector<RingStep> r0 = context_ring_schedule(2, 0);
  ASSERT_EQ(r0.size(), 2u);
  expect_step(r0[0], 0, {{{C, N}, {F, C}}});
  expect_step(r0[1], 1, {{{N, N}, {F, F}}});  // chunks 1, 2: after chunk 0, before chunk 3
  const std::vector<RingStep> r1 = context_ring_schedule(2, 1);
  expect_step(r1[0], 1, {{{C, N}, {F, C}}});
  expect_step(r1[1], 0, {{{F, N}, {F, N}}});  // chunks 0, 3: chunk 0 before both, 3 after both
}

TEST(ContextSplit, RingScheduleUnderCp4) {
  // Rank 2 holds chunks 2 and 5; blocks arrive from ranks 1 (chunks 1, 6), 0 (0, 7), 3 (3, 4).
  const std::vector<RingStep> r2 = context_ring_schedule(4, 2);
  ASSERT_EQ(r2.size(), 4u);
  expect_step(r2[0], 2, {{{C, N}, {F, C}}});
  expect_step(r2[1], 1, {{{F, N}, {F, N}}});
  expect_step(r2[2], 0, {{{F, N}, {F, N}}});
  expect_step(r2[3], 3, {{{N, N}, {F, F}}});
  const std::vector<RingStep> r3 = context_ring_schedule(4, 3);  // chunks 3 and 4
  EXPECT_EQ(r3[1].block, 2);
  EXPECT_EQ(r3[3].block, 0);
  expect_step(r3[3], 0, {{{F, N}, {F, N}}});
}

// The schedule's mask bounds the keys the spans give: on plain and isolated rows, a query
// attends to a key of a `none` pair never, and to one of a `causal` pair only at or before
// itself; on plain rows every `full` pair's keys are all seen.
TEST(ContextSplit, RingScheduleCoversEveryQuerysKeys) {
  const int64_t row_tokens = 16, cp = 4, chunk = row_tokens / (2 * cp);
  for (const Ints& spans : {Ints{0, 16, 32}, Ints{0, 5, 6, 13, 16, 19, 32}}) {
    const bool plain = spans.size() == 3;
    const Ints rank_order = context_rank_order(spans.back(), row_tokens, cp);
    for (int64_t rank = 0; rank < cp; ++rank) {
      const ContextShard shard = context_shard(spans, row_tokens, cp, rank);
      for (const RingStep& step : context_ring_schedule(cp, rank)) {
        const Ints keys(rank_order.begin() + step.block * static_cast<int64_t>(shard.source.size()),
                        rank_order.begin() + (step.block + 1) * static_cast<int64_t>(shard.source.size()));
        for (size_t i = 0; i < shard.source.size(); ++i) {
          const int32_t query = shard.source[i];
          for (int32_t key : keys) {
            if (key / row_tokens != query / row_tokens) continue;  // another row: never in a span
            const size_t q = (query % row_tokens) / chunk == rank ? 0 : 1;
            const size_t k = (key % row_tokens) / chunk == step.block ? 0 : 1;
            const bool seen = key >= shard.key_begin[i] && key <= query;
            const ChunkMask mask = step.mask[q][k];
            if (seen) {
              EXPECT_NE(mask, ChunkMask::none) << "query " << query << ", key " << key;
            }
            if (plain && mask == ChunkMask::full) {
              EXPECT_TRUE(seen) << "query " << query << ", key " << key;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace loom
