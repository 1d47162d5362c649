// `loom plan --search`: every ranked layout is valid for the GPUs and fits, best first.
#include <gtest/gtest.h>

#include "plan/search.h"
#include "plan_test_util.h"
#include "recipe/recipe.h"
#include "recipe/rules.h"

namespace loom {
namespace {

TEST(PlanSearch, RanksLayoutsOfTheSeedThatFitBestFirst) {
  const Recipe seed = recipe_load(test::source_path("recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml"), {},
                                  RecipeUse::inspect);
  const SearchResult result = plan_search(seed, 0);
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
    Recipe candidate = seed;
    candidate.layout = l;
    candidate.gpu_count = 8;
    EXPECT_TRUE(recipe_rules(candidate, &candidate.model_config, {}).empty());
    // 32B's weights and fp32 grads alone (6 B a parameter, 197 GB) need TP or PP.
    EXPECT_GT(l.tp * l.pp, 1);
    if (i > 0) {
      EXPECT_LE(p.time.tokens_per_s_per_gpu, result.fitting[i - 1].time.tokens_per_s_per_gpu);
    }
    seed_layout_found |= l.tp == 4 && l.pp == 2 && l.sequence_parallel && !l.recompute.enabled &&
                         !l.offload.enabled && p.micro.rows == 2;
  }
  EXPECT_TRUE(seed_layout_found);
  for (const Plan& p : result.fitting) {
    EXPECT_EQ(p.input.layout.cp, 1) << plan_layout_label(p.input, p.micro);
  }
  const std::string text = search_to_text(result, 5);
  EXPECT_NE(text.find("   1 "), std::string::npos) << text;
  EXPECT_EQ(search_to_json(result, 5).at("ranked").size(), 5u);
}

// A mixture of experts' search explores expert parallelism: the seed's rows on the
// Qwen3-30B-A3B slice (recipes/qwen3-30b-a3b-slice: its config with 8 of the 48 layers, 128
// experts each; a plan of the whole model's 48 sparse layers takes ~0.1 s) rank layouts with
// ep > 1 among those that fit, each one the rules accept.
TEST(PlanSearch, ExploresExpertParallelismForAMixtureOfExperts) {
  Recipe recipe = recipe_load(test::source_path("recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml"), {},
                              RecipeUse::inspect);
  recipe.model_config = model_config_load(test::source_path("recipes/qwen3-30b-a3b-slice/config.json"));
  recipe.model = "Qwen3-30B-A3B (8 layers)";
  // Eight rows a step: a DP rank takes 8 / dp rows at most a micro-batch.
  recipe.workload.global_batch = 8;
  const SearchResult result = plan_search(recipe, 8);
  ASSERT_FALSE(result.fitting.empty());
  int64_t with_ep = 0;
  for (const Plan& p : result.fitting) {
    const LayoutSpec& l = p.input.layout;
    Recipe candidate = recipe;
    candidate.layout = l;
    candidate.gpu_count = 8;
    EXPECT_TRUE(recipe_rules(candidate, &candidate.model_config, {}).empty());
    EXPECT_EQ(l.dp % l.ep, 0);
    with_ep += l.ep > 1 ? 1 : 0;
  }
  EXPECT_GT(with_ep, 0);
  EXPECT_NE(search_to_text(result, static_cast<size_t>(result.fitting.size())).find(" EP"),
            std::string::npos);
}

// Long rows and a global batch of one row: no DP layout has a row for each DP rank, so the
// search explores context parallelism in both of its forms, each candidate one the rules
// accept, its micro-batch whole rows spread over the cp GPUs. Where a layout fits without CP
// (the seed), none with CP is planned: CP's GPUs would do DP's work and move K/V besides.
TEST(PlanSearch, ExploresContextParallelismInBothForms) {
  Recipe recipe = recipe_load(test::source_path("recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml"), {},
                              RecipeUse::inspect);
  recipe.model = "Qwen3-1.7B";
  ASSERT_TRUE(qwen3_config_builtin(recipe.model, &recipe.model_config));
  recipe.workload.row_tokens = 65536;
  recipe.workload.global_batch = 1;
  const SearchResult result = plan_search(recipe, 4);
  ASSERT_FALSE(result.fitting.empty());
  int64_t gathered = 0, ring = 0;
  for (const Plan& p : result.fitting) {
    const LayoutSpec& l = p.input.layout;
    Recipe candidate = recipe;
    candidate.layout = l;
    candidate.gpu_count = 4;
    EXPECT_TRUE(recipe_rules(candidate, &candidate.model_config, {}).empty());
    EXPECT_EQ(p.micro.rows * recipe.workload.row_tokens, l.max_tokens_per_gpu * l.cp);
    if (l.cp > 1) (l.cp_comm == "ring" ? ring : gathered) += 1;
  }
  EXPECT_GT(gathered, 0);
  EXPECT_GT(ring, 0);
  EXPECT_NE(search_to_text(result, result.fitting.size()).find(" ring"), std::string::npos);
}

TEST(PlanSearch, NoLayoutOfOneGpuHoldsQwen3_32B) {
  const Recipe seed = recipe_load(test::source_path("recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml"), {},
                                  RecipeUse::inspect);
  const SearchResult result = plan_search(seed, 1);
  EXPECT_TRUE(result.fitting.empty());
  EXPECT_GT(result.not_fitting, 0);
  EXPECT_NE(search_to_text(result, 10).find("no layout fits"), std::string::npos);
}

// A layout that breaks one of the recipe's rules is no candidate: Qwen3-32B's FFN of 25,600
// is 1,600 a rank at TP16, not whole 128-blocks, so block-scaled FP8 leaves out TP16 where
// tensor scaling keeps it (on 16 GPUs, tp up to the 16 a node here).
// Long rows (docs/plan.md, "Long rows"): Qwen3-8B at 32,768 tokens a row on one GPU. On an
// H200 full recompute with the optimizer offloaded fits, and at equal predicted speed the
// layout without activation offload ranks first (it holds less GPU + host memory in all); on an
// H100 only activation offload makes it fit (76.23 GiB against 84.31).
TEST(PlanSearch, LongRowsTakeActivationOffloadOnlyWhereTheInputsDoNotFit) {
  const std::string path = test::source_path("bench/gpu/qwen3-8b-32k.yaml");
  const SearchResult h200 = plan_search(recipe_load(path, {}, RecipeUse::inspect), 0);
  ASSERT_GE(h200.fitting.size(), 2u);
  const LayoutSpec& first = h200.fitting[0].input.layout;
  EXPECT_TRUE(first.recompute.enabled && first.recompute.granularity == "full");
  EXPECT_TRUE(first.offload.enabled);
  EXPECT_FALSE(first.activation_offload);
  EXPECT_EQ(h200.fitting[0].micro.rows, 1);
  const Plan& second = h200.fitting[1];
  EXPECT_TRUE(second.input.layout.activation_offload);
  EXPECT_EQ(second.time.tokens_per_s_per_gpu, h200.fitting[0].time.tokens_per_s_per_gpu);
  EXPECT_LT(second.memory.peak().device_bytes(), h200.fitting[0].memory.peak().device_bytes());
  for (const Plan& p : h200.fitting) EXPECT_TRUE(p.input.layout.offload.enabled);  // 16 B a parameter

  const SearchResult h100 = plan_search(recipe_load(path, {"gpu.type=H100"}, RecipeUse::inspect), 0);
  ASSERT_EQ(h100.fitting.size(), 1u);
  EXPECT_TRUE(h100.fitting[0].input.layout.activation_offload);
  EXPECT_TRUE(h100.fitting[0].fits);
}

TEST(PlanSearch, LeavesOutTheLayoutsTheRecipesRulesRefuse) {
  const std::string seed = test::source_path("recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml");
  const std::vector<std::string> sixteen = {"gpu.per_node=16", "gpu.count=16", "layout.dp=2"};
  auto tp16 = [](const SearchResult& r) {
    int64_t n = 0;
    for (const Plan& p : r.fitting) n += p.input.layout.tp == 16 ? 1 : 0;
    return n;
  };
  std::vector<std::string> tensor = sixteen;
  tensor.push_back("workload.precision=fp8");
  const Recipe fp8_tensor = recipe_load(seed, tensor, RecipeUse::inspect);
  const SearchResult kept = plan_search(fp8_tensor, 0);
  EXPECT_GT(tp16(kept), 0) << "tensor scaling has no block rule: TP16 fits";
  std::vector<std::string> block = tensor;
  block.push_back("workload.fp8={scaling: block}");
  const Recipe fp8_block = recipe_load(seed, block, RecipeUse::inspect);
  const SearchResult left_out = plan_search(fp8_block, 0);
  EXPECT_EQ(tp16(left_out), 0);
  EXPECT_LT(left_out.considered, kept.considered);
  ASSERT_FALSE(left_out.fitting.empty());
  for (const Plan& p : left_out.fitting) {
    Recipe candidate = fp8_block;
    candidate.layout = p.input.layout;
    candidate.gpu_count = 16;
    EXPECT_TRUE(recipe_rules(candidate, &candidate.model_config, {}).empty()) << p.input.layout.tp;
  }
}

}  // namespace
}  // namespace loom
