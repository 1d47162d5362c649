// `loom plan` and `loom train`'s refusal of a layout that does not fit, through the loom
// binary: exit codes 0 / 1 / 2, --json, --search.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "data/row_store.h"
#include "plan_test_util.h"
#include "support/run_binary.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string& seed() {
  static const std::string path = test::source_path("recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml");
  return path;
}

class PlanCli : public ::testing::Test {
 protected:
  std::string file(const std::string& name) const { return dir_.file(name); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream out(file(name), std::ios::binary | std::ios::trunc);
    out << text;
  }
  // Runs loom with `args`; status, stdout and stderr.
  int loom(const std::string& args) {
    const test::BinaryRun run = test::run_binary(LOOM_BINARY, args, dir_);
    out_ = run.out;
    err_ = run.err;
    return run.code;
  }
  test::TempDir dir_{"plan-cli"};
  std::string out_, err_;
};

TEST_F(PlanCli, SeedFitsExitsZeroWithTheBreakdown) {
  EXPECT_EQ(loom("plan " + seed()), 0) << err_;
  for (const char* needle :
       {"Qwen3-32B on 8 x H200", "TP4 PP2 DP1 SP", "weights", "activations", "= arenas (max_mem_gib)",
        "= on the GPU", ": fits", "pipeline_bubble", "tokens/s/GPU"})
    EXPECT_NE(out_.find(needle), std::string::npos) << needle << "\n" << out_;
  EXPECT_EQ(err_, "");
}

TEST_F(PlanCli, OneGpuOf32BDoesNotFitExitsOne) {
  EXPECT_EQ(
      loom("plan " + seed() +
           " --set layout.tp=1 --set layout.pp=1 --set layout.sequence_parallel=false --set gpu.count=1"),
      1)
      << err_;
  EXPECT_NE(out_.find("DOES NOT FIT"), std::string::npos) << out_;
}

TEST_F(PlanCli, BadInputExitsTwo) {
  EXPECT_EQ(loom("plan " + file("missing.yaml")), 2);
  EXPECT_NE(err_.find("missing.yaml"), std::string::npos) << err_;
  EXPECT_EQ(loom("plan " + seed() + " --set layout.tp=3"), 2);
  EXPECT_NE(err_.find("layout.tp"), std::string::npos) << err_;
  EXPECT_EQ(out_, "");
  EXPECT_EQ(loom("plan " + seed() + " --set gpu.type=B300 --set gpu.memory_gb=null --set status=draft"), 2);
  EXPECT_NE(err_.find("gpu.type: found B300"), std::string::npos) << err_;
}

TEST_F(PlanCli, JsonHasEveryTermAndConstant) {
  ASSERT_EQ(loom("plan " + seed() + " --json"), 0) << err_;
  const nlohmann::json j = nlohmann::json::parse(out_);
  EXPECT_EQ(j.at("model"), "Qwen3-32B");
  EXPECT_EQ(j.at("layout").at("tp"), 4);
  EXPECT_TRUE(j.at("memory").at("fits").get<bool>());
  EXPECT_EQ(j.at("memory").at("stages").size(), 2u);
  int64_t sum = 0;
  for (const auto& t :
       j.at("memory").at("stages").at(j.at("memory").at("peak_stage").get<size_t>()).at("terms"))
    sum += t.at("bytes").get<int64_t>();
  EXPECT_EQ(sum, j.at("memory").at("device_bytes").get<int64_t>());
  EXPECT_TRUE(j.at("constants").contains("sdpa_backward_workspace_dq_units"));
  EXPECT_TRUE(j.at("constants").contains("gemm_forward_flops_per_s"));
  EXPECT_GT(j.at("time").at("tokens_per_s_per_gpu").get<double>(), 0);
  EXPECT_FALSE(j.at("memory").at("attention_backward_by_row").get<bool>());
}

TEST_F(PlanCli, SearchPrintsTheTopLayouts) {
  ASSERT_EQ(loom("plan " + seed() + " --search --top 3"), 0) << err_;
  EXPECT_NE(out_.find("   1 "), std::string::npos) << out_;
  EXPECT_NE(out_.find("   3 "), std::string::npos) << out_;
  EXPECT_EQ(out_.find("   4 "), std::string::npos) << out_;
  ASSERT_EQ(loom("plan " + seed() + " --search --top 2 --json"), 0) << err_;
  EXPECT_EQ(nlohmann::json::parse(out_).at("ranked").size(), 2u);
  // Qwen3-32B on one GPU: nothing fits.
  EXPECT_EQ(loom("plan " + seed() + " --search --gpus 1"), 1) << err_;
  EXPECT_NE(out_.find("no layout fits"), std::string::npos) << out_;
}

// A draft recipe training a random Qwen3-32B on one GPU: the plan refuses it (exit 2, the
// breakdown on stderr) before anything is read; --force goes on to the trainer, which on
// this GPU-less machine refuses train.device cuda for its own reason.
TEST_F(PlanCli, TrainRefusesALayoutThatDoesNotFitUnlessForced) {
  write("config.json", R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 5120,
    "intermediate_size": 25600, "num_hidden_layers": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
    "tie_word_embeddings": false})");
  write("rows.jsonl", "");
  write("recipe.yaml",
        "schema_version: 1\nmodel: Qwen3-32B\nstatus: draft\n"
        "workload: {row_tokens: 8192, global_batch: 2, precision: bf16}\n"
        "layout: {tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 16384}\n"
        "train:\n  device: cuda\n  init: {random: {config: config.json}}\n"
        "  data: {path: rows.jsonl}\n  steps: 2\n  output_dir: run\n");
  EXPECT_EQ(loom("train " + file("recipe.yaml")), 2);
  EXPECT_NE(err_.find("does not fit on the GPU (--force trains anyway)"), std::string::npos) << err_;
  EXPECT_NE(err_.find("DOES NOT FIT"), std::string::npos) << err_;
  EXPECT_FALSE(fs::exists(file("run")));
  // Forced: the trainer's own checks speak (no GPU here, or the empty rows file on a GPU).
  EXPECT_EQ(loom("train " + file("recipe.yaml") + " --force"), 2);
  EXPECT_EQ(err_.find("does not fit on the GPU"), std::string::npos) << err_;
  EXPECT_TRUE(err_.find("train.device: cuda, but") != std::string::npos ||
              err_.find("no rows") != std::string::npos)
      << err_;
  // The same recipe on the CPU is not planned: it fails on the empty rows file.
  EXPECT_EQ(loom("train " + file("recipe.yaml") + " --set train.device=cpu --set workload.precision=fp32"),
            2);
  EXPECT_EQ(err_.find("does not fit on the GPU"), std::string::npos) << err_;
  EXPECT_NE(err_.find("no rows"), std::string::npos) << err_;
}

// An isolated row store (loom data build --packing isolated): loom plan reads its sample
// boundaries and sizes the attention backward's workspace by the micro-batches' largest THD
// call (ops/thd_groups.h). Two rows of 8,192 a micro-batch, 10 and 8 spans (16 samples and
// the two paddings), the longest 5,000: it runs alone (8,192 bucketed tokens), the 17 others
// (~669 each, 1,024 bucketed) eight a call (8 × 1,024). One call would have been 32 × 8,192;
// the same rows packed are 2 × 8,192 in one call.
TEST_F(PlanCli, IsolatedRowStoreSizesTheThdWorkspace) {
  const int64_t row_tokens = 8192;
  {
    RowStoreWriter writer(file("isolated"), row_tokens, RowPacking::isolated);
    const std::vector<int32_t> tokens(row_tokens, 7);
    std::vector<uint8_t> mask(row_tokens, 1);
    const std::vector<int32_t> first{0, 5000, 6000, 7000, 7500, 7600, 7700, 7800, 7900, 8000};
    const std::vector<int32_t> second{0, 1000, 2000, 3000, 4000, 5000, 6000, 7000};
    for (const std::vector<int32_t>* bounds : {&first, &second}) {
      std::fill(mask.begin(), mask.end(), 1);
      std::fill(mask.begin() + bounds->back(), mask.end(), 0);  // the padding has no target
      writer.append(tokens.data(), mask.data(), *bounds);
    }
    writer.commit({});
  }
  const std::string recipe = test::source_path("bench/gpu/qwen3-1.7b-2x8k.yaml");
  ASSERT_EQ(loom("plan " + recipe + " --json --set train.data.path=" + file("isolated")), 0) << err_;
  const nlohmann::json isolated = nlohmann::json::parse(out_);
  ASSERT_EQ(loom("plan " + recipe + " --json"), 0) << err_;
  const nlohmann::json rows = nlohmann::json::parse(out_);
  const auto workspace = [](const nlohmann::json& plan) {
    for (const nlohmann::json& t : plan["memory"]["stages"][0]["terms"])
      if (t["name"] == "workspace") return t;
    return nlohmann::json{};
  };
  const std::string what = workspace(isolated)["what"].get<std::string>();
  EXPECT_NE(what.find("THD, in calls of at most 8192 bucketed tokens"), std::string::npos) << what;
  const double units = isolated["constants"]["sdpa_backward_workspace_dq_units"].get<double>();
  const auto sdpa = static_cast<int64_t>(units * 4.0 * 8192 * 16 * 128);
  EXPECT_NE(what.find("SDPA backward (" + std::to_string(sdpa) + " B"), std::string::npos) << what;
  // Less than the packed rows' one call of 2 × 8,192.
  EXPECT_LT(workspace(isolated)["bytes"].get<int64_t>(), workspace(rows)["bytes"].get<int64_t>());
}

}  // namespace
}  // namespace loom
