// Each layout rule (recipe/layout_check.h), on the side that holds and the side that breaks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/config.h"
#include "recipe/layout_check.h"
#include "recipe_test_util.h"

namespace loom {
namespace {

Qwen3Config qwen3_32b() {
  Qwen3Config config;
  EXPECT_TRUE(qwen3_config_builtin("Qwen3-32B", &config));
  return config;
}

// The seed's workload and layout: TP 4, PP 2, SP, 16,384 tokens per GPU, 8,192-token rows.
struct Layout {
  WorkloadSpec workload;
  LayoutSpec layout;
  Qwen3Config model = qwen3_32b();
  int64_t gpus = 8;
  Layout() {
    workload.row_tokens = 8192;
    workload.global_batch = 128;
    layout.tp = 4;
    layout.pp = 2;
    layout.sequence_parallel = true;
    layout.max_tokens_per_gpu = 16384;
    layout.rows_per_microbatch = 2;
  }
  std::vector<Violation> check() const { return layout_check(workload, layout, model, gpus); }
};

std::string fields(const std::vector<Violation>& violations) {
  std::string out;
  for (const Violation& v : violations) out += (out.empty() ? "" : " | ") + v.field + ": " + v.what;
  return out;
}

TEST(LayoutCheck, SeedLayoutHolds) {
  EXPECT_TRUE(Layout().check().empty()) << fields(Layout().check());
}

TEST(LayoutCheck, SizesMultiplyToTheGpus) {
  Layout s;
  s.gpus = 16;
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.tp, layout.pp, layout.cp, layout.dp, gpu.count");
  EXPECT_EQ(v[0].what, "found tp·pp·cp·dp = 4·2·1·1 = 8, expected gpu.count = 16");
  s.layout.dp = 2;  // 4·2·1·2 = 16
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.gpus = 0;  // a recipe without a gpu block: nothing to compare
  EXPECT_TRUE(s.check().empty());
}

TEST(LayoutCheck, AttentionHeadsDivideByTp) {
  Layout s;
  s.gpus = 0;
  s.layout.tp = 3;  // 64 heads, 8 KV heads: neither divides
  std::vector<Violation> v = s.check();
  ASSERT_NE(test::find_violation(v, "layout.tp"), nullptr) << fields(v);
  EXPECT_NE(fields(v).find("found 3, expected a divisor of the model's 64 attention heads"),
            std::string::npos)
      << fields(v);
  s.layout.tp = 8;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

// Block-scaled FP8 needs each TP shard of the linear layers in whole 128-blocks: Qwen3-32B's
// FFN of 25,600 is 6,400 a rank at TP4 (50 blocks), 1,600 at TP16 (12.5).
TEST(LayoutCheck, Fp8BlockScalingNeedsTpShardsOfWhole128Blocks) {
  Layout s;
  s.gpus = 0;
  s.workload.precision = "fp8";
  s.workload.fp8.scaling = "block";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.layout.tp = 16;
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.fp8.scaling, layout.tp");
  EXPECT_NE(v[0].what.find("a TP rank's intermediate_size = 1600, expected a multiple of 128"),
            std::string::npos)
      << v[0].what;
  s.workload.fp8.scaling = "tensor";  // one scale a tensor: no blocks to straddle
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.workload.fp8.scaling = "block";
  s.layout.tp = 1;  // nothing sharded
  s.layout.sequence_parallel = false;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

TEST(LayoutCheck, KvHeadsDivideByTpOrAreReplicated) {
  Layout s;
  s.gpus = 0;
  s.layout.tp = 16;  // 8 KV heads: each replicated over 2 TP ranks
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  // 12 heads split over 3 ranks, but 4 KV heads neither divide by 3 nor divide it.
  s.model.num_attention_heads = 12;
  s.model.num_key_value_heads = 4;
  s.model.intermediate_size = 3 * 8192;
  s.model.vocab_size = 3 * 50000;
  s.layout.sequence_parallel = false;  // 8,192-token rows do not split over 3 ranks
  s.layout.tp = 3;
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.tp");
  EXPECT_EQ(
      v[0].what,
      "found 3, expected a divisor of the model's 4 KV heads or a multiple of it (KV heads replicated)");
  s.layout.tp = 2;
  s.layout.sequence_parallel = true;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

TEST(LayoutCheck, LayersDivideByPpOrALayerSplitIsGiven) {
  Layout s;
  s.gpus = 0;
  s.layout.pp = 3;  // 64 layers
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.pp, layout.layer_split");
  EXPECT_EQ(
      v[0].what,
      "found pp = 3 with layer_split null, expected a divisor of the model's 64 layers, or a layer_split");
  s.layout.layer_split = {21, 21, 22};
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.layout.layer_split = {21, 21, 21};
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.layer_split");
  EXPECT_EQ(v[0].what, "found entries summing to 63, expected the model's 64 layers");
  s.layout.layer_split = {32, 32};
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.layer_split, layout.pp");
  EXPECT_EQ(v[0].what, "found 2 entries, expected one per pipeline stage (pp = 3)");
}

TEST(LayoutCheck, MaxTokensPerGpuHoldsARow) {
  Layout s;
  s.layout.max_tokens_per_gpu = 8192;  // exactly one row
  s.layout.rows_per_microbatch = 1;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.layout.max_tokens_per_gpu = 8191;
  s.layout.rows_per_microbatch = 0;
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.max_tokens_per_gpu, workload.row_tokens");
  EXPECT_EQ(
      v[0].what,
      "found max_tokens_per_gpu 8191, expected at least row_tokens = 8192 (a micro-batch holds whole rows)");
  // With CP a row spreads over cp GPUs.
  s.layout.max_tokens_per_gpu = 4096;
  s.layout.cp = 2;
  s.layout.tp = 2;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

TEST(LayoutCheck, RowsPerMicrobatchFitMaxTokens) {
  Layout s;
  s.layout.rows_per_microbatch = 3;  // 24,576 > 16,384
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.rows_per_microbatch, layout.max_tokens_per_gpu");
}

TEST(LayoutCheck, SequenceParallelOnlyWithTp) {
  Layout s;
  s.gpus = 0;
  s.layout.tp = 1;
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.sequence_parallel, layout.tp");
  EXPECT_EQ(v[0].what, "found sequence_parallel true with tp = 1, expected tp > 1");
  s.layout.sequence_parallel = false;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.layout.tp = 2;
  s.layout.sequence_parallel = true;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

TEST(LayoutCheck, GlobalBatchDividesByDpAndDenseHasNoExperts) {
  Layout s;
  s.gpus = 0;
  s.layout.dp = 3;
  s.layout.ep = 2;
  s.layout.dispatcher = "alltoall";
  std::vector<Violation> v = s.check();
  EXPECT_NE(test::find_violation(v, "workload.global_batch, layout.dp"), nullptr) << fields(v);
  EXPECT_NE(test::find_violation(v, "layout.ep"), nullptr) << fields(v);
  EXPECT_NE(test::find_violation(v, "layout.dispatcher"), nullptr) << fields(v);
  EXPECT_EQ(v.size(), 3u) << fields(v);
}

}  // namespace
}  // namespace loom
