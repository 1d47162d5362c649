// `loom check config`: each numerics class fails on a change of its own fields and passes
// otherwise; layout changes are listed and allowed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "check/config_check.h"
#include "core/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kShaA(64, 'a');
const std::string kShaB(64, 'b');

// The tiny CPU recipe (recipes/tiny) with its config.json and rows beside it.
const char* const kBase = R"(schema_version: 1
model: qwen3-tiny
status: draft
workload: {row_tokens: 64, global_batch: 8, precision: fp32}
layout: {tp: 1, pp: 1, cp: 1, dp: 1, sequence_parallel: false, max_tokens_per_gpu: 512,
         recompute: null, offload: null}
train:
  device: cpu
  seed: 1234
  init: {random: {config: config.json}}
  data: {path: rows.jsonl}
  steps: 16
  optimizer: {lr: 3.0e-3, min_lr: 3.0e-4, decay: cosine, warmup_fraction: 0.1,
              weight_decay: 0.1, beta1: 0.9, beta2: 0.98, eps: 1.0e-8, clip_grad: 1.0}
  output_dir: out
)";

class ConfigCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("loom_config_check_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::copy_file(fs::path(LOOM_SOURCE_DIR) / "recipes/tiny/config.json", dir_ / "config.json");
    file("rows.jsonl", "{\"tokens\": [1, 2], \"loss_mask\": [0, 1]}\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string file(const std::string& name, const std::string& text) {
    fs::create_directories((dir_ / name).parent_path());
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }

  // The base recipe with each (from, to) replaced once, written as `name`.
  std::string recipe(const std::string& name,
                     const std::vector<std::pair<std::string, std::string>>& edits = {}) {
    std::string text = kBase;
    for (const auto& [from, to] : edits) {
      const size_t at = text.find(from);
      EXPECT_NE(at, std::string::npos) << from;
      if (at != std::string::npos) text.replace(at, from.size(), to);
    }
    return file(name, text);
  }

  fs::path dir_;
};

using Names = std::vector<std::string>;

TEST_F(ConfigCheck, SameRecipeWithAnotherLayoutPasses) {
  const ConfigCheckReport r = config_check_files(
      recipe("candidate.yaml",
             {{"tp: 1, pp: 1", "tp: 2, pp: 2"},
              {"max_tokens_per_gpu: 512", "max_tokens_per_gpu: 128"},
              {"recompute: null", "recompute: {granularity: full, method: uniform, num_layers: 1}"}}),
      recipe("reference.yaml"));
  EXPECT_TRUE(r.passed) << config_report_text(r);
  ASSERT_EQ(r.classes.size(), 6u);
  EXPECT_EQ(r.layout_differences.size(), 4u) << config_report_text(r);
  const std::string text = config_report_text(r);
  EXPECT_NE(text.find("layout.tp: 2 vs 1"), std::string::npos) << text;
  EXPECT_NE(text.find("the same rows file, byte for byte"), std::string::npos) << text;
  EXPECT_NE(text.find("result: pass"), std::string::npos) << text;
  EXPECT_EQ(config_report_json(r)["classes"][0]["class"], "model");
}

// The classes a changed copy of the base recipe fails against the base. Most cases change
// the loaded Recipe itself: a load costs about 0.1 s under the sanitizers.
class ConfigClasses : public ConfigCheck {
 protected:
  void SetUp() override {
    ConfigCheck::SetUp();
    base_ = recipe_load(recipe("base.yaml"), {}, RecipeUse::inspect);
  }
  Names failing_classes(const Recipe& candidate, const Recipe* reference = nullptr) {
    const ConfigCheckReport r = config_check(candidate, reference ? *reference : base_);
    Names names;
    for (const ConfigClassResult& c : r.classes)
      if (!c.pass) names.push_back(c.name);
    EXPECT_EQ(r.passed, names.empty());
    return names;
  }
  template <typename Edit>
  Names failing_after(const Edit& edit) {
    Recipe candidate = base_;
    candidate.document.reset(YAML::Clone(base_.document));  // operator= would write through to base_
    edit(candidate);
    return failing_classes(candidate);
  }
  Recipe base_;
};

TEST_F(ConfigClasses, EachClassFailsOnItsOwnFields) {
  EXPECT_EQ(failing_after([](Recipe&) {}), Names{});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.seed = 7; }), Names{"model"});  // a random init's seed
  EXPECT_EQ(failing_after([](Recipe& r) { r.model = "org/qwen3-tiny"; }),
            Names{});  // the org is not the model
  EXPECT_EQ(failing_after([](Recipe& r) { r.model = "qwen3-tiny-b"; }), Names{"model"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.model_config.rope_theta = 1e4; }), Names{"model"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.init_hf_checkpoint = "ckpt"; }), Names{"model"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.workload.row_tokens = 32; }), Names{"data"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.workload.global_batch = 4; }), Names{"schedule"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.steps = 20; }), Names{"schedule"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.lr = 1e-3; }), Names{"schedule"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.min_lr = 0; }), Names{"schedule"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.decay = "linear"; }), Names{"schedule"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.warmup_fraction = 0; }), Names{"schedule"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.beta1 = 0.8; }), Names{"optimizer"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.beta2 = 0.999; }), Names{"optimizer"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.eps = 1e-6; }), Names{"optimizer"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.weight_decay = 0; }), Names{"optimizer"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.train.optimizer.clip_grad = 0.5; }), Names{"optimizer"});
  EXPECT_EQ(failing_after([](Recipe& r) { r.workload.precision = "bf16"; }), Names{"precision"});
  // Placement is not numerics.
  EXPECT_EQ(failing_after([](Recipe& r) {
              r.train.device = "cuda";
              r.layout.tp = 2;
              r.layout.recompute.enabled = true;
            }),
            Names{});
}

TEST_F(ConfigClasses, LossComparesTheLossMaskRuleWhereBothGiveOne) {
  auto with_mask = [&](const char* mask) {
    Recipe r = base_;
    r.document.reset(YAML::Clone(base_.document));
    r.document["workload"]["dataset"]["build"]["loss_mask"] = mask;
    return r;
  };
  const Recipe qwen3 = with_mask("qwen3"), other = with_mask("other");
  EXPECT_EQ(failing_classes(other, &qwen3), Names{"loss"});
  EXPECT_EQ(failing_classes(qwen3, &qwen3), Names{});
  EXPECT_EQ(failing_classes(qwen3), Names{});  // the base gives none: noted, not failed
  EXPECT_NE(config_check(qwen3, base_).result_of("loss").notes.front().find("not given in both"),
            std::string::npos);
}

TEST_F(ConfigClasses, OmittedOptimizerFieldsTakeTheDefaults) {
  // beta2 0.98 and eps 1e-8 are the schema defaults: leaving them out is the same configuration.
  const Recipe omitted = recipe_load(recipe("omitted.yaml", {{"beta2: 0.98, ", ""}, {"eps: 1.0e-8, ", ""}}),
                                     {}, RecipeUse::inspect);
  EXPECT_EQ(failing_classes(omitted), Names{});
}

TEST_F(ConfigClasses, DataComparesRowsFilesByteForByte) {
  Recipe other = base_;
  other.train.data_path = file("other.jsonl", "{\"tokens\": [1, 3], \"loss_mask\": [0, 1]}\n");
  EXPECT_EQ(failing_classes(other), Names{"data"});
  Recipe copy = base_;
  copy.train.data_path = file("copy.jsonl", "{\"tokens\": [1, 2], \"loss_mask\": [0, 1]}\n");
  EXPECT_EQ(failing_classes(copy), Names{});
}

TEST_F(ConfigClasses, DataComparesRowsSha256FromRecipeOrManifest) {
  file("store/manifest.json", "{\"format\": \"loom-rows-1\", \"rows_sha256\": \"" + kShaA + "\"}");
  auto with = [&](const std::string& data_path, const std::string& sha) {
    Recipe r = base_;
    r.document.reset(YAML::Clone(base_.document));
    r.train.data_path = (dir_ / data_path).string();
    if (!sha.empty()) r.document["workload"]["dataset"]["rows_sha256"] = sha;
    return r;
  };
  const Recipe store = with("store", ""), recipe_a = with("absent.jsonl", kShaA),
               recipe_b = with("absent.jsonl", kShaB);
  // A row store's manifest against a recipe's rows_sha256.
  EXPECT_EQ(failing_classes(store, &recipe_a), Names{});
  EXPECT_EQ(failing_classes(store, &recipe_b), Names{"data"});
  // A recipe whose rows_sha256 disagrees with its own row store.
  const ConfigCheckReport r = config_check(with("store", kShaB), recipe_b);
  EXPECT_FALSE(r.result_of("data").pass);
  EXPECT_NE(r.result_of("data").differences.front().find("differs from"), std::string::npos);
  // A .jsonl without a checksum against a checksum only: nothing in common to compare.
  EXPECT_EQ(failing_classes(base_, &recipe_a), Names{"data"});
  EXPECT_NE(config_check(base_, recipe_a).result_of("data").differences.front().find("no common checksum"),
            std::string::npos);
  // A manifest that writes rows_sha256 twice (once read as its last value) is no checksum.
  file("twice/manifest.json", "{\"rows_sha256\": \"" + kShaB + "\", \"rows_sha256\": \"" + kShaA + "\"}");
  const ConfigCheckReport twice = config_check(with("twice", ""), recipe_a);
  EXPECT_FALSE(twice.result_of("data").pass);
  EXPECT_NE(twice.result_of("data").differences.front().find("'rows_sha256' a second time"),
            std::string::npos)
      << twice.result_of("data").differences.front();
}

TEST_F(ConfigCheck, SeedRecipeAgainstItselfAndItsReferenceLayout) {
  const std::string seed = std::string(LOOM_SOURCE_DIR) + "/recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml";
  std::ifstream in(seed);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The reference recipe of the seed's check: TP 8, PP 1, full recompute, offload.
  std::string reference = text;
  auto edit = [&](const std::string& from, const std::string& to) {
    const size_t at = reference.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    reference.replace(at, from.size(), to);
  };
  edit("  tp: 4\n  pp: 2\n", "  tp: 8\n  pp: 1\n");
  edit("  recompute: null\n", "  recompute: {granularity: full, method: uniform, num_layers: 1}\n");
  edit("  offload: null\n", "  offload: {optimizer_fraction: 1.0, overlap: true}\n");
  edit("  max_tokens_per_gpu: 16384\n", "  max_tokens_per_gpu: 20480\n");
  const std::string path = file("reference.yaml", reference);
  ConfigCheckReport r = config_check_files(seed, path);
  EXPECT_TRUE(r.passed) << config_report_text(r);
  EXPECT_GE(r.layout_differences.size(), 4u) << config_report_text(r);
  edit("  rows_sha256: 8f76", "  rows_sha256: 0f76");
  r = config_check_files(seed, file("reference.yaml", reference));
  EXPECT_FALSE(r.result_of("data").pass) << config_report_text(r);
  EXPECT_TRUE(r.result_of("schedule").pass) << config_report_text(r);  // steps from result.steps_per_run
}

TEST_F(ConfigCheck, UnreadableRecipeIsBadInput) {
  EXPECT_THROW(config_check_files((dir_ / "absent.yaml").string(), recipe("reference.yaml")), InputError);
}

}  // namespace
}  // namespace loom
