// The readers of the sharding spec (model/shard_spec.h) agree: for real Qwen3 sizes and the
// layouts loom trains, the plan's stages (plan/shard.h) have the layers and the parameter
// tensors of the engine's rank shards (train/rank_shard.h), and the engine refuses a layout
// with the recipe check's message.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "plan/shard.h"
#include "recipe/rules.h"
#include "train/rank_shard.h"

namespace loom {
namespace {

LayoutSpec layout(int64_t tp, int64_t pp, std::vector<int64_t> layer_split = {}) {
  LayoutSpec l;
  l.tp = tp;
  l.pp = pp;
  l.layer_split = std::move(layer_split);
  l.max_tokens_per_gpu = 8192;
  return l;
}

LayoutSpec sp(LayoutSpec l) {
  l.sequence_parallel = true;
  return l;
}

struct Case {
  std::string model;
  LayoutSpec layout;
};

TEST(ShardAgreement, ThePlansStagesHoldTheRankShardsLayersAndTensors) {
  const std::vector<Case> cases = {
      {"Qwen3-0.6B", layout(1, 1)},
      {"Qwen3-0.6B", layout(16, 4)},  // tied, KV heads shared by 2 ranks
      {"Qwen3-4B", sp(layout(2, 2))},
      {"Qwen3-32B", sp(layout(4, 2))},  // the seed's
      {"Qwen3-32B", layout(8, 2, {30, 34})},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.model + " tp " + std::to_string(k.layout.tp) + " pp " + std::to_string(k.layout.pp));
    ModelConfig c;
    ASSERT_TRUE(qwen3_config_builtin(k.model, &c));
    const ParamTable full = param_table_build(c);
    const GpuShard g = gpu_shard(c, k.layout, MicroBatchShape{1, 4096, 1, 4096});
    const ParallelLayout layout{static_cast<int>(k.layout.tp), 1, 1, static_cast<int>(k.layout.pp)};
    EngineOptions options;
    options.sequence_parallel = k.layout.sequence_parallel;
    options.layer_split = k.layout.layer_split;
    ASSERT_EQ(g.stage_layers.size(), static_cast<size_t>(k.layout.pp));
    for (int s = 0; s < layout.pp; ++s) {
      for (int r = 0; r < layout.tp; ++r) {
        const RankShard shard = rank_shard(c, full, layout, RankCoords{r, 0, 0, s}, options);
        EXPECT_EQ(shard.model.layer_end - shard.model.layer_begin, g.stage_layers[static_cast<size_t>(s)]);
        std::vector<int64_t> sizes;
        for (const ParamSpec& p : shard.table.params) sizes.push_back(p.numel());
        EXPECT_EQ(sizes, g.stage_tensor_sizes(s)) << "stage " << s << " rank " << r;
        EXPECT_EQ(shard.table.total_numel, g.stage_params(s));
      }
    }
  }
}

// Under expert parallelism the engine lays its experts after the dense tensors (the two
// regions of the distributed optimizer, train/rank_shard.h): the same tensors as the plan's
// stage, in another order, the plan's expert parameters the shard's expert tensors; and an ep
// that does not divide the experts is refused by both with one message.
TEST(ShardAgreement, UnderEpThePlanCountsTheRankShardsExperts) {
  ModelConfig c;
  ASSERT_TRUE(qwen3_config_builtin("Qwen3-30B-A3B", &c));
  const ParamTable full = param_table_build(c);
  LayoutSpec l = sp(layout(2, 2));
  l.dp = 4;
  l.ep = 4;
  const GpuShard g = gpu_shard(c, l, MicroBatchShape{1, 4096, 1, 4096});
  const ParallelLayout rank_layout{2, 1, 4, 2, 4};
  EngineOptions options;
  options.sequence_parallel = true;
  for (int s = 0; s < 2; ++s)
    for (int e = 0; e < 4; ++e) {
      const RankShard shard = rank_shard(c, full, rank_layout, RankCoords{1, 0, e, s}, options);
      std::vector<int64_t> sizes, plan = g.stage_tensor_sizes(s);
      int64_t experts = 0;
      for (const ParamSpec& p : shard.table.params) {
        sizes.push_back(p.numel());
        if (is_expert_kind(p.kind)) experts += p.numel();
      }
      std::sort(sizes.begin(), sizes.end());
      std::sort(plan.begin(), plan.end());
      EXPECT_EQ(sizes, plan) << "stage " << s << " EP rank " << e;
      EXPECT_EQ(experts, g.stage_expert_params(s));
      ASSERT_EQ(shard.regions.size(), 2u);
      EXPECT_EQ(shard.regions[1].group, GroupKind::edp);
      EXPECT_EQ(shard.regions[1].begin, shard.regions[0].padded);
    }

  Recipe recipe;
  recipe.workload.row_tokens = 8192;
  recipe.workload.global_batch = 8;
  recipe.layout = l;
  recipe.layout.ep = 3;
  recipe.layout.dp = 3;
  const std::vector<Violation> v = recipe_rules(recipe, &c, {});
  ASSERT_FALSE(v.empty());
  try {
    rank_shard(c, full, ParallelLayout{2, 1, 3, 2, 3}, RankCoords{}, options);
    ADD_FAILURE() << "rank_shard accepted what recipe_rules refuses: " << v[0].field;
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), v[0].field + ": " + v[0].what);
  }
}

TEST(ShardAgreement, TheEngineRefusesALayoutWithTheRecipeChecksFirstMessage) {
  ModelConfig c;
  ASSERT_TRUE(qwen3_config_builtin("Qwen3-32B", &c));
  const ParamTable full = param_table_build(c);
  Recipe recipe;
  recipe.workload.row_tokens = 8192;
  recipe.workload.global_batch = 8;
  for (const LayoutSpec& l : {layout(3, 1), layout(1, 3), layout(1, 2, {30, 30})}) {
    recipe.layout = l;
    const std::vector<Violation> v = recipe_rules(recipe, &c, {});
    ASSERT_FALSE(v.empty());
    EngineOptions options;
    options.layer_split = l.layer_split;
    const ParallelLayout layout{static_cast<int>(l.tp), 1, 1, static_cast<int>(l.pp)};
    try {
      rank_shard(c, full, layout, RankCoords{}, options);
      ADD_FAILURE() << "rank_shard accepted what recipe_rules refuses: " << v[0].field;
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), v[0].field + ": " + v[0].what);
    }
  }
}

}  // namespace
}  // namespace loom
