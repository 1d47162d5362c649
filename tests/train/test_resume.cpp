// Exact resume and the faults around checkpoints (issue 9), on the CPU engine: N steps
// straight against stop at K, resume, finish — bitwise-identical per-step losses, grad
// norms and final weights, with checkpoints copied to host memory or streamed; an incomplete
// checkpoint is never resumed from; a checkpoint of another run is refused with the
// difference named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/sha256.h"
#include "io/checkpoint.h"
#include "io/init.h"
#include "model/config.h"
#include "recipe/recipe.h"
#include "train/cuda_device.h"
#include "train/engine.h"
#include "train/engine_inspect.h"
#include "train/metrics.h"
#include "train/resume.h"
#include "train/rows.h"
#include "train/train_step.h"
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

// Where the host cannot hold a copy of the state (LOOM_TEST_HOST_AVAILABLE_BYTES stands in for
// MemAvailable), the checkpoints are written streamed from the engine and the resume reads
// the state file a range at a time: still bitwise the straight run, and the streamed
// checkpoint of step 4 is byte for byte the straight run's background one.
TEST(Resume, StreamedSaveAndResumeIsBitwiseTheStraightRun) {
  const fs::path straight = scratch_dir("straight-full"), resumed = scratch_dir("resumed-streamed");
  train(straight, 0);
  ::setenv("LOOM_TEST_HOST_AVAILABLE_BYTES", "1000", 1);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(train(resumed, 3).steps_run, 3);  // checkpoints of steps 2 and 3, both streamed
  const std::string said = ::testing::internal::GetCapturedStderr();
  train(resumed, 0);
  ::unsetenv("LOOM_TEST_HOST_AVAILABLE_BYTES");
  const std::string line = "loom: checkpoints are written streamed";
  ASSERT_NE(said.find(line), std::string::npos) << said;
  EXPECT_EQ(said.find(line, said.find(line) + 1), std::string::npos) << "said once: " << said;
  EXPECT_NE(said.find("12 B a parameter"), std::string::npos) << said;

  std::vector<StepMetrics> a = metrics_read_jsonl((straight / "metrics.jsonl").string());
  std::vector<StepMetrics> b = metrics_read_jsonl((resumed / "metrics.jsonl").string());
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].loss, b[i].loss) << "step " << a[i].step;  // bitwise, not near
    EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << a[i].step;
  }
  EXPECT_EQ(file_bytes(straight / "final" / "model.safetensors"),
            file_bytes(resumed / "final" / "model.safetensors"));
  const fs::path step4 = fs::path("checkpoints") / "step-00000004";
  for (const char* name : {"state.safetensors", "meta.json"})
    EXPECT_TRUE(file_bytes(straight / step4 / name) == file_bytes(resumed / step4 / name)) << name;
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

// A LoRA run's identity holds the sha256 of each safetensors file of its base, hashed on a
// thread of its own (the checkpoint-writing rank) or at the first get() (the others): the
// same text either way, and a run that never asks for it does not wait for the hash.
TEST(Resume, TheLoraBaseHashIsEverySafetensorsFilesSha256) {
  const fs::path base = scratch_dir("lora-base");
  fs::create_directories(base);
  std::ofstream(base / "model-00001-of-00002.safetensors") << "the first shard";
  std::ofstream(base / "model-00002-of-00002.safetensors") << std::string(3 << 20, 'x');  // several reads
  std::ofstream(base / "config.json") << "{}";                                            // not hashed
  Recipe recipe = recipe_load(kRecipe, {"train.lora.rank=4", "train.lora.alpha=8"});
  recipe.train.init_hf_checkpoint = base.string();
  const RowSet data;
  const std::string expected =
      nlohmann::ordered_json{{"model-00001-of-00002.safetensors",
                              sha256_file((base / "model-00001-of-00002.safetensors").string())},
                             {"model-00002-of-00002.safetensors",
                              sha256_file((base / "model-00002-of-00002.safetensors").string())}}
          .dump();
  for (const bool background : {true, false}) {
    RunIdentity identity(recipe, data, background);
    EXPECT_EQ(identity.get().at("numerics").at("train.lora.base_sha256"), expected) << background;
    EXPECT_EQ(identity.get().at("numerics").at("train.lora.base_sha256"), expected) << "asked twice";
  }
  { RunIdentity unused(recipe, data, true); }  // stops its hash, whether done or not
  recipe.train.init_hf_checkpoint.clear();
  RunIdentity random_base(recipe, data, true);
  EXPECT_EQ(random_base.get().at("numerics").at("train.lora.base_sha256"), "(random init)");
  fs::remove_all(base);
}

// The FP8 scaling is numerics (check/config_check.h): a checkpoint of a block-scaled run does
// not resume tensor-scaled.
TEST(Resume, AResumeAcrossFp8ScalingIsRefused) {
  const fs::path out = scratch_dir("fp8-scaling");
  EXPECT_EQ(train(out, 2, {"workload.precision=fp8", "workload.fp8={scaling: block}"}).steps_run, 2);
  try {
    train(out, 0, {"workload.precision=fp8", "workload.fp8={scaling: tensor}"});
    FAIL() << "resumed a block-scaled FP8 checkpoint tensor-scaled";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("workload.fp8.scaling: block (checkpoint) vs tensor (now)"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(out);
}

// FP8 statistics (train.fp8_stats_every) at step 1 and every second step, in fp8_stats.jsonl:
// counting changes no result (the metrics and final weights of a run that counts none, bit for
// bit, times and memory aside), a stopped and resumed run writes the straight run's file byte for byte (the
// records past the checkpoint cut, as metrics.jsonl's), and a bf16 run writes none.
TEST(Resume, Fp8StatisticsChangeNothingAndResumeWithTheRun) {
  const fs::path straight = scratch_dir("fp8-stats"), resumed = scratch_dir("fp8-stats-resumed"),
                 silent = scratch_dir("fp8-stats-off"), bf16 = scratch_dir("fp8-stats-bf16");
  const std::vector<std::string> fp8 = {"workload.precision=fp8", "train.fp8_stats_every=2"};
  train(straight, 0, fp8);
  EXPECT_EQ(train(resumed, 5, fp8).steps_run, 5);
  train(resumed, 0, fp8);
  train(silent, 0, {"workload.precision=fp8", "train.fp8_stats_every=0"});
  train(bf16, 0, {"train.fp8_stats_every=2"});

  std::ifstream in(straight / "fp8_stats.jsonl");
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    steps.push_back(j.at("step").get<int64_t>());
    ASSERT_TRUE(j.contains("gate_up.output_grad")) << line;
    const nlohmann::json& g = j.at("gate_up.output_grad");
    EXPECT_GT(g.at("values").get<int64_t>(), 0);
    EXPECT_GT(g.at("amax").get<double>(), 0.0);
    EXPECT_EQ(g.at("clamped").get<int64_t>(), 0);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 4, 6}));
  EXPECT_EQ(file_bytes(straight / "fp8_stats.jsonl"), file_bytes(resumed / "fp8_stats.jsonl"));
  const std::vector<StepMetrics> counted = metrics_read_jsonl((straight / "metrics.jsonl").string()),
                                 uncounted = metrics_read_jsonl((silent / "metrics.jsonl").string());
  ASSERT_EQ(counted.size(), uncounted.size());
  for (size_t i = 0; i < counted.size(); ++i) {
    EXPECT_EQ(counted[i].loss, uncounted[i].loss) << "step " << counted[i].step;
    EXPECT_EQ(counted[i].grad_norm, uncounted[i].grad_norm) << "step " << counted[i].step;
  }
  EXPECT_EQ(file_bytes(straight / "final" / "model.safetensors"),
            file_bytes(silent / "final" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(silent / "fp8_stats.jsonl"));
  EXPECT_FALSE(fs::exists(bf16 / "fp8_stats.jsonl"));
  for (const fs::path& dir : {straight, resumed, silent, bf16}) fs::remove_all(dir);
}

// An engine's state_to_host / state_from_host round-trips its whole state: a second engine
// (from other weights) loaded with the first one's state saves the same bits, and the next
// step leaves both with the same weights. Streamed, the same: the state file written from
// state_source is the full copy's bytes, and a third engine loaded from it a range at a time
// (state_load) holds the same bits. The CUDA engine's case runs on a GPU (label gpu: it
// skips where none is visible); the lead runs it on the device.
class EngineState : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineState, RoundTripsTheWholeStateBitwise) {
  const ModelConfig config = model_config_load(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/config.json");
  const ParamTable table = param_table_build(config);
  std::string why;
  if (GetParam() == "cuda" && !cuda_engine_available(&why)) GTEST_SKIP() << "no CUDA engine here: " << why;
  auto create = [&](uint64_t seed) {
    RandomInitSource init(config, table, seed);
    return engine_create(config, table, init, GetParam() == "cuda" ? EngineDevice::cuda : EngineDevice::cpu);
  };
  const RowSet data = rows_load_jsonl(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/rows.jsonl", 64, 256);
  StepSpec spec;
  spec.global_batch = 4;
  spec.max_tokens_per_gpu = 4 * data.row_tokens;
  spec.adam = AdamWConfig{0.9f, 0.98f, 1e-8f, 0.1f};
  auto step = [&](TrainEngine& engine, int64_t n) {
    train_step(engine, data, n, 1e-3f, spec, nullptr, table);
  };
  std::unique_ptr<TrainEngine> a = create(1), b = create(2);
  step(*a, 1);
  step(*a, 2);  // non-zero Adam moments and, on the GPU, non-zero remainders
  TrainState saved, reloaded;
  a->state_to_host(saved);
  b->state_from_host(saved);
  b->state_to_host(reloaded);
  for (auto [x, y] : {std::pair{&saved.master, &reloaded.master}, std::pair{&saved.adam_m, &reloaded.adam_m},
                      std::pair{&saved.adam_v, &reloaded.adam_v}}) {
    ASSERT_EQ(x->size(), static_cast<size_t>(table.total_numel));
    ASSERT_EQ(y->size(), x->size());
    EXPECT_EQ(std::memcmp(x->data(), y->data(), x->size() * sizeof(float)), 0);
  }

  const fs::path dir = scratch_dir("engine-state-" + GetParam());
  fs::create_directories(dir);
  checkpoint_state_write((dir / "whole.safetensors").string(), table, saved);
  checkpoint_state_write((dir / "streamed.safetensors").string(), table, *a->state_source());
  EXPECT_TRUE(file_bytes(dir / "whole.safetensors") == file_bytes(dir / "streamed.safetensors"))
      << "the streamed state file differs from the full copy's";
  std::unique_ptr<TrainEngine> c = create(3);
  CheckpointStateFile file((dir / "streamed.safetensors").string(), table);
  c->state_load(file);
  TrainState streamed;
  c->state_to_host(streamed);
  EXPECT_EQ(std::memcmp(streamed.master.data(), saved.master.data(), saved.master.size() * 4), 0);
  EXPECT_EQ(std::memcmp(streamed.adam_m.data(), saved.adam_m.data(), saved.adam_m.size() * 4), 0);
  EXPECT_EQ(std::memcmp(streamed.adam_v.data(), saved.adam_v.data(), saved.adam_v.size() * 4), 0);
  fs::remove_all(dir);

  step(*a, 3);
  step(*b, 3);
  step(*c, 3);
  const std::vector<float> wa = engine_masters(*a), wb = engine_masters(*b), wc = engine_masters(*c);
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * sizeof(float)), 0)
      << "step 3 from the reloaded state";
  EXPECT_EQ(std::memcmp(wa.data(), wc.data(), wa.size() * sizeof(float)), 0)
      << "step 3 from the state loaded streamed";
}

// Named by the engine: CTest labels the cuda cases gpu (tests/train/CMakeLists.txt).
INSTANTIATE_TEST_SUITE_P(Engines, EngineState, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& engine) { return engine.param; });

}  // namespace
}  // namespace loom
