// Micro-batching against slime's build_dp_schedule. The expected plans were printed by
// slime a897e1f's own slime/utils/dp_schedule.py (use_dynamic_batch_size, balance_data and
// balance_by_flops off, vpp 1), run on these inputs.
#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/micro_batching.h"

namespace loom {
namespace {

using Plan = std::vector<std::vector<std::vector<int64_t>>>;

TEST(MicroBatching, FirstFitInRowOrder) {
  // 5→0, 9→1, 3→0, 7→2, 2→0 (full at 10), 8→3, 4→4, 6→4.
  EXPECT_EQ(micro_batches_first_fit({5, 9, 3, 7, 2, 8, 4, 6}, 10),
            (std::vector<std::vector<int64_t>>{{0, 2, 4}, {1}, {3}, {5}, {6, 7}}));
  // A row over the cap gets a micro-batch of its own.
  EXPECT_EQ(micro_batches_first_fit({15, 3, 3}, 10), (std::vector<std::vector<int64_t>>{{0}, {1, 2}}));
}

TEST(MicroBatching, SeedLayoutPairsConsecutiveRows) {
  // The seed: 128 rows of 8,192 tokens, max_tokens_per_gpu 16,384, DP 1: 64 micro-batches
  // of two consecutive rows.
  MicroBatchPlan plan = micro_batches_plan(std::vector<int64_t>(128, 8192), 16384, 1, 1);
  ASSERT_EQ(plan.per_rank.size(), 1u);
  ASSERT_EQ(plan.num_microbatches(), 64);
  for (int64_t k = 0; k < 64; ++k)
    EXPECT_EQ(plan.per_rank[0][static_cast<size_t>(k)], (std::vector<int64_t>{2 * k, 2 * k + 1}));
}

TEST(MicroBatching, MatchesSlime) {
  struct Case {
    std::vector<int64_t> lengths;
    int64_t max_tokens;
    int cp, dp;
    Plan expected;
  };
  const std::vector<Case> cases = {
      {{8192, 8192, 8192, 8192, 8192, 8192, 8192, 8192}, 16384, 1, 2, {{{0, 1}, {4, 5}}, {{2, 3}, {6, 7}}}},
      // 5 bins → 6: the later of the two 10-token bins, [6, 7], splits longest first.
      {{5, 9, 3, 7, 2, 8, 4, 6}, 10, 1, 2, {{{0, 2, 4}, {3}, {7}}, {{1}, {5}, {6}}}},
      {{15, 3, 3, 3, 3, 3, 3, 3}, 10, 1, 2, {{{0}, {4, 5, 6}}, {{1, 2, 3}, {7}}}},
      // 2 bins → 4: [3, 4, 5] splits into [3, 5] + [4], then [0, 1, 2] into [0, 2] + [1].
      {{4, 4, 4, 4, 4, 4}, 12, 1, 4, {{{0, 2}}, {{3, 5}}, {{4}}, {{1}}}},
      // CP 2 doubles the cap to 16.
      {{6, 1, 5, 2, 4, 3, 7, 7}, 8, 2, 3, {{{0, 1, 2, 3}}, {{4, 5, 6}}, {{7}}}},
      {{10, 10, 10}, 30, 1, 2, {{{0, 2}}, {{1}}}},
  };
  for (const Case& c : cases) {
    MicroBatchPlan plan = micro_batches_plan(c.lengths, c.max_tokens, c.cp, c.dp);
    EXPECT_EQ(plan.per_rank, c.expected) << "case with " << c.lengths.size() << " rows, dp " << c.dp;
    for (const auto& rank : plan.per_rank) EXPECT_EQ(static_cast<int>(rank.size()), plan.num_microbatches());
  }
}

TEST(MicroBatching, RefusesWhatSlimeAssertsOn) {
  // Fewer rows than DP ranks.
  try {
    micro_batches_plan({10, 10, 10}, 10, 1, 4);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("workload.global_batch, layout.dp"), std::string::npos) << e.what();
  }
  // 5 single-row micro-batches cannot become 8.
  try {
    micro_batches_plan({10, 10, 10, 10, 10}, 10, 1, 4);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("make 5 micro-batches even split one row each, and DP 4 needs 8"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom
