// What `loom train` leaves in output_dir besides final/: metrics.jsonl, result.yaml (the
// recipe with its result block, valid where it lies) and tensorboard/ event files.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/version.h"
#include "recipe/recipe.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kTiny = std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/qwen3-tiny-cpu.yaml";

// A scratch folder for one short run of the tiny CPU recipe.
class TrainOutputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_test_train_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path run() const { return dir_ / "run"; }
  fs::path dir_;
};

void check_metrics_jsonl(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::string line;
  int64_t step = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int64_t>(), ++step);
    for (const char* key :
         {"loss", "grad_norm", "lr", "tokens", "step_time_s", "tokens_per_s_per_gpu", "mfu", "max_mem_gib"})
      EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_EQ(j["tokens"].get<int64_t>(), 2 * 64);
  }
  EXPECT_EQ(step, 3);
}

void check_result_yaml(const fs::path& run) {
  const std::string path = (run / "result.yaml").string();
  std::vector<Violation> violations = recipe_validate(path);
  EXPECT_TRUE(violations.empty()) << violations_to_string(violations);
  const YAML::Node doc = YAML::LoadFile(path);
  const YAML::Node result = doc["result"];
  EXPECT_EQ(result["steps_per_run"].as<int>(), 3);
  EXPECT_EQ(result["window"][0].as<int>(), 2);
  EXPECT_EQ(result["window"][1].as<int>(), 3);
  EXPECT_EQ(result["window_tokens"].as<int64_t>(), 2 * 2 * 64);
  EXPECT_EQ(result["runs"].as<int>(), 1);
  EXPECT_FALSE(result["profiler"].as<bool>());
  EXPECT_EQ(result["measured"].Scalar().size(), 10u);
  EXPECT_NE(result["mfu_note"].Scalar().find("train.device cpu"), std::string::npos);
  // Recomputed from metrics.jsonl, the figures agree with the block.
  std::vector<StepMetrics> steps = metrics_read_jsonl((run / "metrics.jsonl").string());
  ModelConfig config = model_config_load(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/config.json");
  const WindowResult w = window_measure(steps, 2, 3, 1, config.matmul_params());
  EXPECT_NEAR(result["tokens_per_s_per_gpu"].as<double>(), w.tokens_per_s_per_gpu, 0.006);
  EXPECT_NEAR(result["step_time_cv_percent"].as<double>(), 100 * w.step_time_cv, 0.006);
  EXPECT_EQ(result["active_params"]["count"].as<int64_t>(), config.matmul_params());
  EXPECT_NEAR(result["usd_per_million_tokens"].as<double>(),
              usd_per_million_tokens(2.0, w.tokens_per_s_per_gpu), 0.006);
  EXPECT_GT(result["gpu_hours"].as<double>(), 0.0);
  EXPECT_EQ(result["loom"].Scalar(), loom_version());  // which loom measured it
  // The relative paths were rewritten for output_dir: they name the tiny recipe's files.
  // The absolute one (output_dir, from --set) is kept.
  const fs::path config_path = run / doc["train"]["init"]["random"]["config"].Scalar();
  EXPECT_TRUE(fs::equivalent(config_path, std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/config.json"));
  EXPECT_TRUE(fs::equivalent(run / doc["train"]["data"]["path"].Scalar(),
                             std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/rows.jsonl"));
  EXPECT_EQ(doc["train"]["output_dir"].Scalar(), run.string());
}

std::pair<std::string, int> run_capture(const std::string& command) {
  std::string out;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {"", -1};
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  const int status = pclose(pipe);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

void check_tensorboard(const fs::path& run) {
  const fs::path tb = run / "tensorboard";
  ASSERT_TRUE(fs::is_directory(tb));
  int files = 0;
  for (const auto& entry : fs::directory_iterator(tb))
    files += entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_EQ(files, 1);
  const char* python = std::getenv("LOOM_PYTHON");
  if (!python || !*python)
    GTEST_SKIP() << "LOOM_PYTHON is not set; TensorBoard's reader did not run (the rest did)";
  auto [out, status] = run_capture(std::string(python) + " " + LOOM_SOURCE_DIR +
                                   "/tests/io/read_tensorboard.py " + tb.string());
  if (status == 77)
    GTEST_SKIP() << "LOOM_PYTHON has no tensorboard package (scripts/python_env.sh installs it)";
  ASSERT_EQ(status, 0);
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["tags"],
            nlohmann::json({"grad norm", "lm loss", "lr", "memory", "mfu", "step time", "throughput"}));
  std::vector<StepMetrics> steps = metrics_read_jsonl((run / "metrics.jsonl").string());
  ASSERT_EQ(j["scalars"]["lm loss"].size(), steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(j["scalars"]["lm loss"][i][0].get<int64_t>(), steps[i].step);
    EXPECT_FLOAT_EQ(j["scalars"]["lm loss"][i][1].get<float>(), static_cast<float>(steps[i].loss));
    EXPECT_FLOAT_EQ(j["scalars"]["lr"][i][1].get<float>(), static_cast<float>(steps[i].lr));
    EXPECT_FLOAT_EQ(j["scalars"]["grad norm"][i][1].get<float>(), static_cast<float>(steps[i].grad_norm));
  }
}

// One run of 3 steps of 2 rows (about a second under the sanitizers), all its outputs checked.
TEST_F(TrainOutputs, MetricsResultAndTensorBoard) {
  Recipe recipe = recipe_load(kTiny,
                              {"train.output_dir=" + run().string(), "train.steps=3",
                               "workload.global_batch=2", "result.window=[2,3]", "gpu.usd_per_gpu_hour=2.0"},
                              RecipeUse::train);
  TrainOptions options;
  options.progress = false;
  train_run(recipe, options);
  check_metrics_jsonl(run());
  check_result_yaml(run());
  check_tensorboard(run());  // last: it skips without LOOM_PYTHON
}

// A step whose rows hold no target (every loss mask 0) once logged loss 0.0, a perfect step to
// any reader: its record says so instead, loss null beside "no_targets": true, and the run goes on.
TEST_F(TrainOutputs, AStepWithoutTargetsHasNoLoss) {
  fs::create_directories(dir_);
  {
    std::ofstream rows(dir_ / "rows.jsonl");
    for (int r = 0; r < 2; ++r) {
      nlohmann::json row = {{"tokens", std::vector<int>(64, 7 + r)}, {"loss_mask", std::vector<int>(64, 0)}};
      rows << row.dump() << "\n";
    }
  }
  Recipe recipe =
      recipe_load(kTiny,
                  {"train.output_dir=" + run().string(), "train.data.path=" + (dir_ / "rows.jsonl").string(),
                   "train.steps=2", "workload.global_batch=2", "result.window=[1,2]"},
                  RecipeUse::train);
  TrainOptions options;
  options.progress = false;
  train_run(recipe, options);
  std::ifstream in(run() / "metrics.jsonl");
  std::string line;
  int64_t steps = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.at("loss").is_null()) << line;
    EXPECT_EQ(j.at("no_targets"), true) << line;
    EXPECT_EQ(j.at("grad_norm").get<double>(), 0.0) << line;
    ++steps;
  }
  EXPECT_EQ(steps, 2);
  const std::vector<StepMetrics> read = metrics_read_jsonl((run() / "metrics.jsonl").string());
  ASSERT_EQ(read.size(), 2u);
  EXPECT_TRUE(read[0].no_targets);
  EXPECT_TRUE(std::isnan(read[0].loss));
}

// With train.reference, result.yaml gets its correctness block: a run with another layout
// (full recompute, which changes no numerics) passes against the run it repeats; a run whose
// learning rate differs fails the configuration rules, and train reports it.
TEST_F(TrainOutputs, CorrectnessBlockAgainstAReferenceRun) {
  const std::vector<std::string> base = {"train.steps=3", "workload.global_batch=2", "result.window=[2,3]"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = base;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  TrainOptions options;
  options.progress = false;
  const fs::path reference = dir_ / "reference";
  train_run(recipe_load(kTiny, with({"train.output_dir=" + reference.string()}), RecipeUse::train), options);
  const std::vector<std::string> against = {"train.reference.recipe=" + (reference / "result.yaml").string(),
                                            "train.reference.metrics=" + reference.string()};

  std::vector<std::string> same = with(against);
  same.push_back("train.output_dir=" + run().string());
  same.push_back("layout.recompute={granularity: full}");
  TrainSummary summary = train_run(recipe_load(kTiny, same, RecipeUse::train), options);
  EXPECT_FALSE(summary.correctness_failed);
  const std::string result = (run() / "result.yaml").string();
  std::vector<Violation> violations = recipe_validate(result);
  EXPECT_TRUE(violations.empty()) << violations_to_string(violations);
  YAML::Node block = YAML::LoadFile(result)["correctness"];
  ASSERT_TRUE(block.IsMap()) << "result.yaml has no correctness block";
  EXPECT_EQ(block["result"].Scalar(), "pass") << block["summary"].Scalar();
  EXPECT_EQ(block["convergence"]["correlation"].as<double>(), 1.0);
  ASSERT_EQ(block["component_tests"].size(), 1u);
  EXPECT_EQ(block["component_tests"][0]["result"].Scalar(), "pass");

  std::vector<std::string> other_lr = with(against);
  other_lr.push_back("train.output_dir=" + (dir_ / "other_lr").string());
  other_lr.push_back("train.optimizer.lr=1.0e-3");
  summary = train_run(recipe_load(kTiny, other_lr, RecipeUse::train), options);
  EXPECT_TRUE(summary.correctness_failed);
  block = YAML::LoadFile((dir_ / "other_lr" / "result.yaml").string())["correctness"];
  EXPECT_EQ(block["result"].Scalar(), "fail");
}

}  // namespace
}  // namespace loom
