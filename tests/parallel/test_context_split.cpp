// Context parallelism's split of a micro-batch (parallel/context_split.h) against examples
// worked out by hand.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace loom
