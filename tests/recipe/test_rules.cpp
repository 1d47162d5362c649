// Each of the recipe's rules (recipe/rules.h), on the side that holds and the side that breaks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/config.h"
#include "recipe/rules.h"
#include "recipe_test_util.h"

namespace loom {
namespace {

ModelConfig qwen3_32b() {
  ModelConfig config;
  EXPECT_TRUE(qwen3_config_builtin("Qwen3-32B", &config));
  return config;
}

// The seed's workload and layout: TP 4, PP 2, SP, 16,384 tokens per GPU, 8,192-token rows,
// bf16 on train.device cuda (the defaults).
struct Layout {
  WorkloadSpec workload;
  LayoutSpec layout;
  TrainSpec train;
  ModelConfig model = qwen3_32b();
  int64_t gpus = 8;
  RuleCapabilities capabilities;
  Layout() {
    workload.row_tokens = 8192;
    workload.global_batch = 128;
    layout.tp = 4;
    layout.pp = 2;
    layout.sequence_parallel = true;
    layout.max_tokens_per_gpu = 16384;
    layout.rows_per_microbatch = 2;
  }
  std::vector<Violation> check() const {
    Recipe recipe;
    recipe.workload = workload;
    recipe.layout = layout;
    recipe.train = train;
    recipe.gpu_count = gpus;
    return recipe_rules(recipe, &model, capabilities);
  }
};

std::string fields(const std::vector<Violation>& violations) {
  std::string out;
  for (const Violation& v : violations) out += (out.empty() ? "" : " | ") + v.field + ": " + v.what;
  return out;
}

TEST(RecipeRules, SeedLayoutHolds) {
  EXPECT_TRUE(Layout().check().empty()) << fields(Layout().check());
}

TEST(RecipeRules, SizesMultiplyToTheGpus) {
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

TEST(RecipeRules, AttentionHeadsDivideByTp) {
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
TEST(RecipeRules, Fp8BlockScalingNeedsTpShardsOfWhole128Blocks) {
  Layout s;
  s.gpus = 0;
  s.train.device = "cpu";  // the rule holds on any device
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
  s.train.device = "cuda";  // reported once: the width that straddles is not also the GEMMs'
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.fp8.scaling, layout.tp");
  s.workload.fp8.scaling = "tensor";  // one scale a tensor: no blocks to straddle
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.workload.fp8.scaling = "block";
  s.layout.tp = 1;  // nothing sharded
  s.layout.sequence_parallel = false;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

TEST(RecipeRules, KvHeadsDivideByTpOrAreReplicated) {
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

TEST(RecipeRules, LayersDivideByPpOrALayerSplitIsGiven) {
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

TEST(RecipeRules, MaxTokensPerGpuHoldsARow) {
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
  s.layout.max_tokens_per_gpu = 4095;
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.max_tokens_per_gpu, workload.row_tokens");
  EXPECT_EQ(v[0].what,
            "found max_tokens_per_gpu 4095 · cp 2 = 8190, expected at least row_tokens = 8192 (a micro-batch "
            "holds whole rows)");
}

TEST(RecipeRules, ContextParallelSplitsRowsInWholeChunks) {
  Layout s;  // TP 2 × CP 2 × PP 2 on 8 GPUs
  s.layout.tp = 2;
  s.layout.cp = 2;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.workload.row_tokens = 8190;  // not a multiple of 2·cp = 4
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.row_tokens, layout.cp");
  EXPECT_EQ(v[0].what,
            "found 8190, expected a multiple of 2·cp = 4 (each CP rank takes two of 2·cp chunks of a row)");
  s.workload.row_tokens = 8192;
  // `loom train` (which knows the machine) runs CP on GPU ranks as `loom plan` prices it.
  s.capabilities.cuda_engine = true;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  // The ring form's block attention has no CUDA kernel yet.
  s.layout.cp_comm = "ring";
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.cp_comm, train.device");
  EXPECT_EQ(
      v[0].what,
      "found ring on train.device cuda, expected all_gather (the ring form's block attention has no CUDA "
      "kernel yet)");
  // Either form on CPU ranks; `loom plan` prices the ring on GPUs too.
  s.capabilities.cuda_engine.reset();
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

TEST(RecipeRules, RowsPerMicrobatchFitMaxTokens) {
  Layout s;
  s.layout.rows_per_microbatch = 3;  // 24,576 > 16,384
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.rows_per_microbatch, layout.max_tokens_per_gpu");
}

TEST(RecipeRules, SequenceParallelOnlyWithTp) {
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

TEST(RecipeRules, ActivationOffloadNeedsFullRecomputeAndOnePipelineStage) {
  Layout s;
  s.layout.activation_offload = true;  // the seed: pp 2, no recompute
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 2u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.activation_offload, layout.recompute.granularity");
  EXPECT_EQ(
      v[0].what,
      "found activation_offload true with recompute null, expected granularity full (what it offloads are "
      "the inputs full recompute keeps)");
  EXPECT_EQ(v[1].field, "layout.activation_offload, layout.pp");
  s.layout.recompute.enabled = true;
  s.layout.recompute.granularity = "selective";
  v = s.check();
  ASSERT_EQ(v.size(), 2u) << fields(v);
  EXPECT_EQ(v[0].what,
            "found activation_offload true with granularity selective, expected granularity full (what it "
            "offloads are the inputs full recompute keeps)");
  s.layout.recompute.granularity = "full";
  s.layout.pp = 1;
  s.layout.dp = 2;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

TEST(RecipeRules, GlobalBatchDividesByDpAndDenseHasNoExperts) {
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

// workload.moe belongs to a model with experts; hf's aux loss to one pipeline stage. EP
// divides the experts and dp, runs on CPU ranks only so far, and a dense model has none.
TEST(RecipeRules, MoeSettingsNeedExpertsAndHfOneStage) {
  Layout dense;
  dense.workload.moe_set = true;
  std::vector<Violation> v = dense.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.moe");

  Layout moe;
  ASSERT_TRUE(qwen3_config_builtin("Qwen3-30B-A3B", &moe.model));
  moe.layout.tp = 2;
  moe.layout.rows_per_microbatch = 0;
  moe.gpus = 0;
  moe.workload.moe_set = true;
  moe.workload.moe_aux_loss = {"megatron", 0.001};
  EXPECT_TRUE(moe.check().empty()) << fields(moe.check());
  moe.workload.moe_aux_loss.kind = "hf";
  v = moe.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.moe.aux_loss.kind, layout.pp");
  moe.layout.pp = 1;
  EXPECT_TRUE(moe.check().empty()) << fields(moe.check());
  moe.train.device = "cpu";
  moe.workload.precision = "fp32";
  moe.layout.dp = 4;
  moe.layout.tp = 1;
  moe.layout.sequence_parallel = false;
  moe.layout.pp = 2;
  moe.workload.moe_aux_loss.kind = "megatron";
  moe.layout.ep = 4;  // 128 experts, 32 a rank
  EXPECT_TRUE(moe.check().empty()) << fields(moe.check());
  moe.layout.ep = 3;
  v = moe.check();
  ASSERT_EQ(v.size(), 2u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.ep");
  EXPECT_EQ(v[0].what, "found 3, expected a divisor of the model's 128 experts (num_experts)");
  EXPECT_EQ(v[1].field, "layout.ep, layout.dp");
  EXPECT_EQ(v[1].what,
            "found ep = 3, expected a divisor of dp = 4 (EP ranks are carved out of the DP ranks)");
  moe.layout.ep = 2;
  moe.train.device = "cuda";
  moe.workload.precision = "bf16";
  EXPECT_TRUE(moe.check().empty()) << fields(moe.check());  // `loom plan` prices it
  moe.capabilities.cuda_engine = true;                      // and `loom train` runs it
  EXPECT_TRUE(moe.check().empty()) << fields(moe.check());
  moe.capabilities = {};
  moe.layout.ep = 1;
  moe.layout.etp = 2;
  v = moe.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.etp");

  Layout dense_ep;
  dense_ep.layout.dp = 2;
  dense_ep.layout.tp = 2;
  dense_ep.layout.ep = 2;
  v = dense_ep.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.ep");
  EXPECT_EQ(v[0].what, "found 2, expected 1 (a dense model has no experts)");
}

// Llama 3's block at a tiny size (recipes/tiny/llama-config.json) with another FFN size.
ModelConfig llama_tiny(int64_t intermediate_size) {
  ModelConfig c = qwen3_32b();
  c.model_type = "llama";
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.num_hidden_layers = 2;
  c.vocab_size = 256;
  c.intermediate_size = intermediate_size;
  return c;
}

Layout tiny_fp8(int64_t intermediate_size, const std::string& device) {
  Layout s;
  s.model = llama_tiny(intermediate_size);
  s.gpus = 0;
  s.workload.row_tokens = 64;
  s.workload.global_batch = 8;
  s.workload.precision = "fp8";
  s.layout = LayoutSpec{};
  s.layout.max_tokens_per_gpu = 512;
  s.train.device = device;
  return s;
}

// cuBLASLt's FP8 GEMMs take n and k in multiples of 16: an FFN of 200 is down's k (and its
// input gradient's n). The CPU emulation takes any width; bf16 has no FP8 GEMM.
// train.lora: each target once, a rank no wider than the narrowest targeted module, dropout in
// [0, 1) and a dense model for now; the seed's TP4 × PP2 layout takes LoRA, with dropout too.
TEST(RecipeRules, LoraTargetsOnceRankWithinTheWidthsDenseModel) {
  Layout s;
  s.train.lora.rank = 16;
  s.train.lora.alpha = 32;
  s.train.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  Layout dropout = s;
  dropout.train.lora.dropout = 0.05;
  EXPECT_TRUE(dropout.check().empty()) << fields(dropout.check());

  Layout bad = s;
  bad.train.lora.targets.push_back("q_proj");
  bad.train.lora.rank = 1025;  // k_proj and v_proj are 8 KV heads · 128 = 1,024 rows wide
  bad.train.lora.dropout = 1.0;
  std::vector<Violation> v = bad.check();
  EXPECT_NE(test::find_violation(v, "train.lora.targets"), nullptr) << fields(v);
  EXPECT_NE(test::find_violation(v, "train.lora.rank, train.lora.targets"), nullptr) << fields(v);
  EXPECT_NE(test::find_violation(v, "train.lora.dropout"), nullptr) << fields(v);
  EXPECT_NE(fields(v).find("above k_proj's width 1024"), std::string::npos) << fields(v);
  EXPECT_NE(fields(v).find("expected a number in [0, 1)"), std::string::npos) << fields(v);

  Layout none = s;
  none.train.lora.targets.clear();
  v = none.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "train.lora.targets");

  Layout moe = s;
  ASSERT_TRUE(qwen3_config_builtin("Qwen3-30B-A3B", &moe.model));
  moe.layout.tp = 2;
  moe.layout.rows_per_microbatch = 0;
  moe.gpus = 0;
  v = moe.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "train.lora, model");
}

TEST(RecipeRules, Fp8GemmsOnCudaNeedWidthsInMultiplesOf16) {
  Layout s = tiny_fp8(200, "cuda");
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.precision, train.device");
  EXPECT_NE(
      v[0].what.find("found FP8 linear layers on train.device cuda with a TP rank's intermediate_size = "
                     "200, expected multiples of 16"),
      std::string::npos)
      << v[0].what;
  s.model = llama_tiny(208);  // 13 · 16
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  // Each width named once, however many GEMMs share it: hidden 72 is qkv's and gate_up's k,
  // o_proj's and down's n.
  s.model.hidden_size = 72;
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_NE(v[0].what.find("a TP rank's hidden_size = 72, expected"), std::string::npos) << v[0].what;
  // Per TP rank: 208 / 2 = 104 is not a multiple of 16, so TP2 breaks what one rank keeps.
  s.model.hidden_size = 64;
  s.layout.tp = 2;
  s.layout.dp = 1;
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.precision, train.device, layout.tp");
  EXPECT_NE(v[0].what.find("intermediate_size = 104"), std::string::npos) << v[0].what;
  s.layout.tp = 1;
  s.model = llama_tiny(200);
  s.train.device = "cpu";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.train.device = "cuda";
  s.workload.precision = "bf16";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

// Block scaling on cuda: every GEMM width and the rows' tokens in whole 128-blocks; the CPU
// takes a partial last block.
TEST(RecipeRules, Fp8BlockScalingOnCudaNeedsWhole128Blocks) {
  Layout s;
  s.gpus = 0;
  s.workload.precision = "fp8";
  s.workload.fp8.scaling = "block";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.workload.row_tokens = 8000;
  s.layout.max_tokens_per_gpu = 16000;
  s.layout.sequence_parallel = false;
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.fp8.scaling, train.device, layout.tp");
  EXPECT_NE(v[0].what.find("found block scaling on train.device cuda with workload.row_tokens = 8000, "
                           "expected multiples of 128"),
            std::string::npos)
      << v[0].what;
  s.train.device = "cpu";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());

  Layout tiny = tiny_fp8(256, "cuda");  // hidden 64, q heads · head_dim 64, kv 32
  tiny.workload.fp8.scaling = "block";
  tiny.workload.row_tokens = 128;
  tiny.layout.max_tokens_per_gpu = 512;
  v = tiny.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.fp8.scaling, train.device");
  EXPECT_EQ(v[0].what.find("(q + 2·kv heads) · head_dim"), std::string::npos)
      << "qkv's n, 128, is whole blocks: " << v[0].what;
  EXPECT_NE(v[0].what.find("a TP rank's hidden_size = 64 and q heads · head_dim = 64, expected"),
            std::string::npos)
      << v[0].what;
}

TEST(RecipeRules, TheDeviceTakesItsPrecisions) {
  Layout s;
  s.gpus = 0;
  s.train.device = "cpu";
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.precision, train.device");
  EXPECT_EQ(
      v[0].what,
      "found bf16 on train.device cpu, expected fp32 (the CPU reference computes in fp32) or fp8 (fp32 with "
      "FP8 linear layers)");
  s.workload.precision = "fp32";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.train.device = "cuda";
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.precision, train.device");
  EXPECT_NE(v[0].what.find("found fp32 on train.device cuda, expected bf16"), std::string::npos) << v[0].what;
  s.workload.precision = "bf16";
  s.workload.fp8.set = true;  // a workload.fp8 block, but no FP8
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.fp8, workload.precision");
  s.workload.precision = "fp8";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

// The machine's capabilities are the caller's to say: unknown (validate, plan), the rule is
// not checked; a CUDA engine that does not run here is refused, naming why.
TEST(RecipeRules, CudaWithoutAnEngineIsRefusedOnlyWhereTheCallerKnows) {
  Layout s;
  s.gpus = 0;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.capabilities.cuda_engine = false;
  s.capabilities.cuda_engine_why = "no CUDA device is visible";
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "train.device");
  EXPECT_EQ(v[0].what, "cuda, but no CUDA device is visible (expected train.device: cpu here)");
  s.capabilities.cuda_engine = true;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.capabilities.cuda_engine = false;
  s.train.device = "cpu";
  s.workload.precision = "fp32";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

TEST(RecipeRules, Fp8KeepsSomeLayerInFp8AndKeepBestNeedsAnEval) {
  Layout s = tiny_fp8(256, "cpu");  // 2 layers
  s.workload.fp8.set = true;
  s.workload.fp8.bf16_first_layers = 1;
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
  s.workload.fp8.bf16_last_layers = 1;
  std::vector<Violation> v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "workload.fp8.bf16_first_layers, workload.fp8.bf16_last_layers");
  EXPECT_NE(v[0].what.find("expected fewer than the model's 2 layers"), std::string::npos) << v[0].what;
  s.workload.fp8.bf16_last_layers = 0;
  s.train.checkpoint_keep_best = true;
  v = s.check();
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "train.checkpoint.keep_best, train.eval");
  s.train.eval_path = "eval.jsonl";
  EXPECT_TRUE(s.check().empty()) << fields(s.check());
}

// Without a model config only the rules that need none run.
TEST(RecipeRules, WithoutAModelTheRulesThatNeedOneAreLeftOut) {
  Recipe recipe;
  recipe.workload.row_tokens = 64;
  recipe.workload.global_batch = 8;
  recipe.workload.precision = "fp8";
  recipe.workload.fp8.bf16_first_layers = 100;
  recipe.layout.tp = 3;
  recipe.layout.max_tokens_per_gpu = 32;
  const std::vector<Violation> v = recipe_rules(recipe, nullptr, {});
  ASSERT_EQ(v.size(), 1u) << fields(v);
  EXPECT_EQ(v[0].field, "layout.max_tokens_per_gpu, workload.row_tokens");
}

}  // namespace
}  // namespace loom
