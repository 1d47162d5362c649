// The THD backward's groups of calls (ops/thd_groups.h), worked by hand: a model of one byte a
// bucketed token and a bound of 1,024 bytes, then Qwen3-1.7B's heads at 131,072-token rows.
#include <gtest/gtest.h>

#include <vector>

#include "ops/op_workspace.h"
#include "ops/thd_groups.h"

namespace loom {
namespace {

std::vector<int32_t> offsets_of(const std::vector<int32_t>& lengths) {
  std::vector<int32_t> offsets{0};
  for (int32_t n : lengths) offsets.push_back(offsets.back() + n);
  return offsets;
}

void expect_group(const ThdGroup& g, int64_t first, int64_t count, int64_t first_token, int64_t tokens,
                  int64_t sequences, int64_t sequence_tokens) {
  EXPECT_EQ(g.first, first);
  EXPECT_EQ(g.count, count);
  EXPECT_EQ(g.first_token, first_token);
  EXPECT_EQ(g.tokens, tokens);
  EXPECT_EQ(g.sequences, sequences);
  EXPECT_EQ(g.sequence_tokens, sequence_tokens);
}

const ThdWorkspaceModel kByte{1, 1024, 1};

TEST(ThdGroups, ShortSequencesShareOneCallOfEight) {
  // 100, 100, 100 → longest 128 (at least 64), 3 → 8 sequences: 1,024 bytes, the bound.
  const auto groups = thd_backward_groups(offsets_of({100, 100, 100}), kByte);
  ASSERT_EQ(groups.size(), 1u);
  expect_group(groups[0], 0, 3, 0, 300, 8, 128);
  EXPECT_EQ(groups[0].workspace_bytes, 1024);
}

TEST(ThdGroups, ALongSequenceRunsAloneWithoutTheFloorOfEight) {
  // 600 → 1,024 tokens: 8, 4 and 2 sequences would pass the bound, 1 is 1,024. With the 100
  // the call would take 2 × 1,024: the 100 and the 50 start a call of their own (8 × 128).
  const auto groups = thd_backward_groups(offsets_of({600, 100, 50}), kByte);
  ASSERT_EQ(groups.size(), 2u);
  expect_group(groups[0], 0, 1, 0, 600, 1, 1024);
  expect_group(groups[1], 1, 2, 600, 150, 8, 128);
  EXPECT_EQ(thd_bucketed_sequences(3, 128, kByte), 8);
  EXPECT_EQ(thd_bucketed_sequences(1, 256, kByte), 4);
  EXPECT_EQ(thd_bucketed_sequences(3, 256, kByte), 4);
  EXPECT_EQ(thd_bucketed_sequences(5, 256, kByte), 8);
}

TEST(ThdGroups, ASequenceOverTheBoundStillRunsAlone) {
  const auto groups = thd_backward_groups(offsets_of({2000, 64}), kByte);
  ASSERT_EQ(groups.size(), 2u);
  expect_group(groups[0], 0, 1, 0, 2000, 1, 2048);
  EXPECT_EQ(groups[0].workspace_bytes, 2048);
  expect_group(groups[1], 1, 1, 2000, 64, 8, 64);
}

TEST(ThdGroups, ManySequencesSplitAtTheBucketThatPassesTheBound) {
  // 17 of 64: 16 bucket to 16 × 64 = 1,024; the 17th would make 32 × 64.
  const auto groups = thd_backward_groups(offsets_of(std::vector<int32_t>(17, 64)), kByte);
  ASSERT_EQ(groups.size(), 2u);
  expect_group(groups[0], 0, 16, 0, 1024, 16, 64);
  expect_group(groups[1], 16, 1, 1024, 64, 8, 64);
}

TEST(ThdGroups, OffsetsStayWithinInt32) {
  // 2^30 elements a token: a window of two tokens would end at 2^31.
  const ThdWorkspaceModel wide{0, 1024, int64_t{1} << 30};
  const auto groups = thd_backward_groups(offsets_of({1, 1, 1}), wide);
  ASSERT_EQ(groups.size(), 3u);
  expect_group(groups[2], 2, 1, 2, 1, 8, 64);
}

TEST(ThdGroups, QwenSmallModelAt131072TokensAsksWhatItsLongestSampleAsks) {
  // Qwen3-1.7B: 16 q heads of 128, 8 kv heads; 33 dQ units: 270,336 bytes a bucketed token.
  const ThdWorkspaceModel model = thd_workspace_model(HeadLayout{16, 8, 128});
  EXPECT_EQ(model.bytes_per_token, 33 * 4 * 16 * 128);
  EXPECT_EQ(model.token_elements, 32 * 128);
  // A 131,072-token row: 65,536 + 32,768 + 16,384 + 8,192 + 8,192. One call would be 8 ×
  // 65,536 bucketed tokens (132 GiB); grouped, the 65,536 runs alone (16.5 GiB), then the
  // 32,768 (8.25 GiB) and the 16,384 (4.125 GiB, past the 4 GiB bound by itself) alone, and
  // the two 8,192 a call each (together 2 × 8,192, 4.125 GiB; alone 2.06).
  const auto groups = thd_backward_groups(offsets_of({65536, 32768, 16384, 8192, 8192}), model);
  ASSERT_EQ(groups.size(), 5u);
  expect_group(groups[0], 0, 1, 0, 65536, 1, 65536);
  EXPECT_EQ(groups[0].workspace_bytes, int64_t{65536} * 270336);
  expect_group(groups[1], 1, 1, 65536, 32768, 1, 32768);
  expect_group(groups[2], 2, 1, 98304, 16384, 1, 16384);
  expect_group(groups[3], 3, 1, 114688, 8192, 1, 8192);
  expect_group(groups[4], 4, 1, 122880, 8192, 1, 8192);
  // The window's offsets: 131,072 tokens × 4,096 elements = 2^29, within int32.
  EXPECT_LT(int64_t{131072} * model.token_elements, int64_t{1} << 31);
}

// The other sizes a 131,072-token row sets: the lm_head's logits run in chunks of at most
// 8,192 rows (16 of them), and the int32 THD offsets of the widest model loom knows built in,
// Qwen3-32B's 64 q and 8 kv heads of 128 (10,240 elements a token), stay below 2^31.
TEST(ThdGroups, A131072TokenRowsOtherSizes) {
  EXPECT_EQ(op_workspace::lm_head_chunk_rows(131072, 8192), 8192);
  EXPECT_EQ(op_workspace::lm_head_logits_bytes(131072, 151936, 8192), int64_t{8192} * 151936 * 2);
  const ThdWorkspaceModel wide = thd_workspace_model(HeadLayout{64, 8, 128});
  EXPECT_LT(int64_t{131072} * wide.token_elements, (int64_t{1} << 31) - 1);
  // Two rows of it in one micro-batch would pass int32: each row's samples go in calls of their own.
  const auto groups =
      thd_backward_groups(offsets_of({131072, 131072}), ThdWorkspaceModel{0, int64_t{1} << 40, 10240});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].first_token, 131072);
}

}  // namespace
}  // namespace loom
