// `loom plan --search`: every ranked layout is valid for the GPUs and fits, best first.
#include <gtest/gtest.h>

#include "plan/search.h"
#include "plan_test_util.h"
#include "recipe/layout_check.h"
#include "recipe/recipe.h"

namespace loom {
namespace {

TEST(PlanSearch, RanksLayoutsOfTheSeedThatFitBestFirst) {
  const Recipe seed = recipe_load(test::source_path("recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml"), {},
                                  RecipeUse::inspect);
  const SearchResult result = plan_search(plan_input_from_recipe(seed), 0);
  EXPECT_EQ(result.gpus, 8);
  ASSERT_FALSE(result.fitting.empty());
  EXPECT_GT(result.not_fitting, 0);
  EXPECT_EQ(result.considered, static_cast<int64_t>(result.fitting.size()) + result.not_fitting);
  bool seed_layout_found = false;
  for (size_t i = 0; i < result.fitting.size(); ++i) {
    const Plan& p = result.fitting[i];
    const LayoutSpec& l = p.input.layout;
    EXPECT_TRUE(p.fits);
    EXPECT_EQ(l.world_size(), 8);
    EXPECT_TRUE(layout_check(p.input.workload, l, p.input.model, 8).empty());
    // 32B's weights and fp32 grads alone (6 B a parameter, 197 GB) need TP or PP.
    EXPECT_GT(l.tp * l.pp, 1);
    if (i > 0) {
      EXPECT_LE(p.time.tokens_per_s_per_gpu, result.fitting[i - 1].time.tokens_per_s_per_gpu);
    }
    seed_layout_found |= l.tp == 4 && l.pp == 2 && l.sequence_parallel && !l.recompute.enabled &&
                         !l.offload.enabled && p.micro.rows == 2;
  }
  EXPECT_TRUE(seed_layout_found);
  const std::string text = search_to_text(result, 5);
  EXPECT_NE(text.find("   1 "), std::string::npos) << text;
  EXPECT_EQ(search_to_json(result, 5).at("ranked").size(), 5u);
}

TEST(PlanSearch, NoLayoutOfOneGpuHoldsQwen3_32B) {
  PlanInput in = test::builtin_input("Qwen3-32B", 1, 8192, 8);
  const SearchResult result = plan_search(in, 1);
  EXPECT_TRUE(result.fitting.empty());
  EXPECT_GT(result.not_fitting, 0);
  EXPECT_NE(search_to_text(result, 10).find("no layout fits"), std::string::npos);
}

}  // namespace
}  // namespace loom
