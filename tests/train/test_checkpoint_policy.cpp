// CheckpointPolicy (train/checkpoint_policy.h): which steps checkpoint (periodic but not the
// last, a voted stop, the last of a --stop-at-step), which checkpoints keep_best keeps (the
// lowest eval loss of a checkpointed step, ranked only by that step's own evaluation), and
// what a resumed run recovers of it (the best eval among metrics.jsonl's records whose step
// still has a checkpoint). The checkpoints are the tiny recipe's model's, written for real on
// the CPU engine: the folders kept are what a run leaves, and what the tests look at.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/init.h"
#include "model/config.h"
#include "train/checkpoint_policy.h"
#include "train/engine.h"
#include "train/metrics.h"
#include "train/nonfinite.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::vector<int64_t> kept_steps(const fs::path& dir) {
  std::vector<int64_t> steps;
  for (const CheckpointRef& c : checkpoint_list(dir.string())) steps.push_back(c.step);
  return steps;
}

class CheckpointPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom-checkpoint-policy-" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "-" +
            std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  CheckpointPolicySpec spec(int64_t every, int64_t keep, bool keep_best, int64_t last_step = 10) const {
    return CheckpointPolicySpec{dir_.string(), every, keep, keep_best, 10, last_step, true, 0};
  }

  // Checkpoint `step` if due, after an evaluation `eval` (nullopt: none yet).
  void after(CheckpointPolicy& policy, int64_t step, std::optional<EvalMetrics> eval, bool stop = false) {
    policy.after_step(step, stop, eval, *engine_, identity_, guard_);
  }

  const ModelConfig config_ = model_config_load(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/config.json");
  const ParamTable table_ = param_table_build(config_);
  std::unique_ptr<TrainEngine> engine_ = [this] {
    RandomInitSource init(config_, table_, 1);
    return engine_create(config_, table_, init, EngineDevice::cpu);
  }();
  RunIdentity identity_{
      nlohmann::json{{"numerics", nlohmann::json::object()}, {"layout", nlohmann::json::object()}}};
  NonfiniteGuard guard_{"stop", 3, 0};
  fs::path dir_;
};

TEST_F(CheckpointPolicyTest, PeriodicButNotTheLastAStopAndTheLastOfAStopAtStep) {
  const CheckpointPolicy straight(spec(3, 1, false), table_);
  std::vector<int64_t> due;
  for (int64_t step = 1; step <= 10; ++step)
    if (straight.due(step, false)) due.push_back(step);
  EXPECT_EQ(due, (std::vector<int64_t>{3, 6, 9}));  // step 10 writes final/ instead
  EXPECT_TRUE(straight.due(5, true));
  EXPECT_TRUE(straight.due(10, true));

  const CheckpointPolicy stop_at_7(spec(3, 1, false, 7), table_);
  due.clear();
  for (int64_t step = 1; step <= 7; ++step)
    if (stop_at_7.due(step, false)) due.push_back(step);
  EXPECT_EQ(due, (std::vector<int64_t>{3, 6, 7}));

  const CheckpointPolicy none(spec(0, 1, false, 4), table_);
  due.clear();
  for (int64_t step = 1; step <= 4; ++step)
    if (none.due(step, false)) due.push_back(step);
  EXPECT_EQ(due, (std::vector<int64_t>{4}));
}

TEST_F(CheckpointPolicyTest, KeepBestKeepsTheLowestEvalOfACheckpointedStep) {
  CheckpointPolicy policy(spec(1, 1, true), table_);
  after(policy, 1, EvalMetrics{1, 3.0, 96, 0});
  after(policy, 2, EvalMetrics{2, 2.0, 96, 0});
  after(policy, 3, EvalMetrics{3, 2.5, 96, 0});
  // Step 4 ran no evaluation: step 2's stays the best, though step 3's record is handed in lower.
  after(policy, 4, EvalMetrics{3, 1.0, 96, 0});
  policy.wait();
  EXPECT_EQ(kept_steps(dir_), (std::vector<int64_t>{2, 4}));

  // Without keep_best only the newest stays.
  fs::remove_all(dir_);
  CheckpointPolicy plain(spec(1, 1, false), table_);
  after(plain, 1, EvalMetrics{1, 3.0, 96, 0});
  after(plain, 2, EvalMetrics{2, 2.0, 96, 0});
  after(plain, 3, EvalMetrics{3, 2.5, 96, 0});
  plain.wait();
  EXPECT_EQ(kept_steps(dir_), (std::vector<int64_t>{3}));
}

TEST_F(CheckpointPolicyTest, AnEvalAtAStepWithoutACheckpointIsNotTheBest) {
  CheckpointPolicy policy(spec(2, 1, true), table_);
  after(policy, 1, EvalMetrics{1, 1.0, 96, 0});  // not due: no checkpoint of it to keep
  after(policy, 2, EvalMetrics{2, 2.0, 96, 0});
  after(policy, 3, EvalMetrics{3, 1.5, 96, 0});
  after(policy, 4, EvalMetrics{4, 3.0, 96, 0});
  policy.wait();
  EXPECT_EQ(kept_steps(dir_), (std::vector<int64_t>{2, 4}));
}

// An evaluation over no targets (eval_loss NaN, null in metrics.jsonl; once 0.0) ranks
// nothing: step 2's real loss stays the best, live and after a resume from the records.
TEST_F(CheckpointPolicyTest, KeepBestSkipsAnEvalOverNoTargets) {
  const double none = std::numeric_limits<double>::quiet_NaN();
  CheckpointPolicy policy(spec(1, 1, true), table_);
  after(policy, 1, EvalMetrics{1, none, 0, 0});
  after(policy, 2, EvalMetrics{2, 2.0, 96, 0});
  after(policy, 3, EvalMetrics{3, 0.0, 0, 0});
  policy.wait();
  EXPECT_EQ(kept_steps(dir_), (std::vector<int64_t>{2, 3}));

  const std::string metrics = (dir_ / "metrics.jsonl").string();
  std::ofstream(metrics) << eval_metrics_to_json(EvalMetrics{2, 2.0, 96, 0}) << "\n"
                         << eval_metrics_to_json(EvalMetrics{3, none, 0, 0}) << "\n";
  EXPECT_EQ(eval_metrics_to_json(EvalMetrics{3, none, 0, 0}),
            R"({"eval_loss":null,"eval_tokens":0,"step":3})");
  CheckpointPolicy resumed(spec(1, 1, true), table_);
  resumed.resume(metrics);
  after(resumed, 4, EvalMetrics{4, 0.0, 0, 0});
  resumed.wait();
  EXPECT_EQ(kept_steps(dir_), (std::vector<int64_t>{2, 4}));
}

TEST_F(CheckpointPolicyTest, AResumeRecoversTheBestAmongTheKeptCheckpoints) {
  {
    CheckpointPolicy first(spec(2, 10, false), table_);
    for (int64_t step = 1; step <= 6; ++step) after(first, step, std::nullopt);
    first.wait();
  }
  ASSERT_EQ(kept_steps(dir_), (std::vector<int64_t>{2, 4, 6}));
  // Step 0's and step 3's evals are the lowest but have no checkpoint; step 4's is the best of
  // those that have one.
  const fs::path metrics = dir_ / "metrics.jsonl";
  std::ofstream(metrics) << eval_metrics_to_json({0, 1.0, 96, 0}) << "\n"
                         << eval_metrics_to_json({2, 2.5, 96, 0}) << "\n"
                         << eval_metrics_to_json({3, 1.5, 96, 0}) << "\n"
                         << eval_metrics_to_json({4, 2.0, 96, 0}) << "\n"
                         << eval_metrics_to_json({6, 2.25, 96, 0}) << "\n";
  CheckpointPolicy resumed(spec(2, 1, true), table_);
  resumed.resume(metrics.string());
  // The next checkpoint (a stop at step 7, its eval above step 4's) prunes all but itself and
  // the recovered best.
  after(resumed, 7, EvalMetrics{7, 2.1, 96, 0}, true);
  resumed.wait();
  EXPECT_EQ(kept_steps(dir_), (std::vector<int64_t>{4, 7}));
}

}  // namespace
}  // namespace loom
