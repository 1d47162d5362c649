// Exact resume and the faults around checkpoints (issue 9), on the CPU engine: N steps
// straight against stop at K, resume, finish — bitwise-identical per-step losses, grad
// norms and final weights; an incomplete checkpoint is never resumed from; a checkpoint of
// another run is refused with the difference named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "recipe/recipe.h"
#include "train/metrics.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kRecipe = std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/qwen3-tiny-cpu.yaml";

fs::path scratch_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("loom-resume-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

TrainSummary train(const fs::path& out, int64_t stop_at, std::vector<std::string> sets = {}) {
  sets.push_back("train.output_dir=" + out.string());
  sets.push_back("train.steps=6");
  sets.push_back("result.window=[2, 6]");
  sets.push_back("train.checkpoint={every: 2, keep: 2}");
  TrainOptions options;
  options.progress = false;
  options.stop_at_step = stop_at;
  return train_run(recipe_load(kRecipe, sets), options);
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(Resume, StopAndResumeIsBitwiseTheStraightRun) {
  const fs::path straight = scratch_dir("straight"), resumed = scratch_dir("resumed");
  train(straight, 0);
  EXPECT_EQ(train(resumed, 3).steps_run, 3);
  EXPECT_FALSE(fs::exists(resumed / "final")) << "a stopped run has no final/ yet";
  // Step 3 is not a multiple of every = 2: the stop itself wrote the checkpoint.
  ASSERT_TRUE(checkpoint_latest(resumed.string()).has_value());
  EXPECT_EQ(checkpoint_latest(resumed.string())->step, 3);
  train(resumed, 0);

  std::vector<StepMetrics> a = metrics_read_jsonl((straight / "metrics.jsonl").string());
  std::vector<StepMetrics> b = metrics_read_jsonl((resumed / "metrics.jsonl").string());
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].step, b[i].step);
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << a[i].step;  // bitwise, not near
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << a[i].step;
  }
  EXPECT_EQ(file_bytes(straight / "final" / "model.safetensors"),
            file_bytes(resumed / "final" / "model.safetensors"));
  // keep: 2 — of the checkpoints at 2, 3 and 4, only the newest two remain.
  std::vector<CheckpointRef> kept = checkpoint_list(resumed.string());
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[0].step, 3);
  EXPECT_EQ(kept[1].step, 4);
  fs::remove_all(straight);
  fs::remove_all(resumed);
}

TEST(Resume, AnUncommittedCheckpointIsIgnored) {
  const fs::path out = scratch_dir("uncommitted");
  train(out, 2);
  // A save killed before its COMMIT: a later folder without the marker, and a .tmp one.
  fs::create_directories(out / "checkpoints" / "step-00000004");
  std::ofstream(out / "checkpoints" / "step-00000004" / "state.safetensors") << "half written";
  fs::create_directories(out / "checkpoints" / "step-00000005.tmp");
  ASSERT_EQ(checkpoint_latest(out.string())->step, 2);
  EXPECT_EQ(train(out, 0).steps_run, 6);
  EXPECT_EQ(metrics_read_jsonl((out / "metrics.jsonl").string()).size(), 6u);
  fs::remove_all(out);
}

TEST(Resume, ACheckpointOfAnotherRunIsRefusedNamingTheDifference) {
  const fs::path out = scratch_dir("other");
  train(out, 2);
  try {
    train(out, 0, {"train.optimizer.lr=0.01"});
    FAIL() << "resumed with a different learning rate";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train.optimizer.lr: 0.003 (checkpoint) vs 0.01 (now)"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(out);
}

}  // namespace
}  // namespace loom
