// The faults of issue 9, each through the loom binary in a child process, as a user or a
// scheduler meets them: SIGTERM and SIGINT; kill -9 in the middle of a checkpoint write; a
// full disk during a save (RLIMIT_FSIZE with SIGXFSZ ignored: write() fails with EFBIG, no
// hook needed); a NaN loss, with and without train.on_nonfinite: skip_step; a resume whose
// recipe, data or tokenizer changed, and one on another layout.
//
// The runs use the golden tiny_untied model (tests/golden) on rows of 16 tokens, a few ms
// a step. A NaN is planted in the embedding row of one token (kNanToken, which the model's
// untied lm_head does not share), so the steps whose rows hold that token, and only those,
// have a NaN loss.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "train/metrics.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr int kRowTokens = 16;
constexpr int kGlobalBatch = 2;
constexpr int kNanToken = 127;  // the golden model's vocabulary is 128

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Options {
  std::vector<std::string> env;            // extra "NAME=value"
  rlim_t file_size_limit = RLIM_INFINITY;  // RLIMIT_FSIZE of the child
};

// A scratch folder with model/ (the golden model, its kNanToken embedding row NaN when
// asked), rows.jsonl (kGlobalBatch rows per step; kNanToken in the rows of `nan_steps`) and
// recipe.yaml writing into run/.
class Faults : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom-faults-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            "-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void make_run(int steps, const std::set<int>& nan_steps = {}) {
    const fs::path golden = fs::path(LOOM_SOURCE_DIR) / "tests/golden/tiny_untied/model";
    fs::create_directories(dir_ / "model");
    fs::copy_file(golden / "config.json", dir_ / "model" / "config.json");
    {
      // Copy every tensor, the embedding with its kNanToken row NaN when the run has NaN steps.
      SafetensorsFile file = SafetensorsFile::open((golden / "model.safetensors").string());
      std::vector<std::vector<float>> values;
      std::vector<SafetensorsTensor> tensors;
      for (const SafetensorsEntry& e : file.entries()) {
        ASSERT_EQ(e.dtype, DType::f32);
        values.emplace_back(static_cast<size_t>(e.numel()));
        std::memcpy(values.back().data(), file.bytes(e), e.nbytes());
        if (e.name == "model.embed_tokens.weight" && !nan_steps.empty()) {
          const int64_t hidden = e.shape[1];
          for (int64_t i = 0; i < hidden; ++i) values.back()[kNanToken * hidden + i] = NAN;
        }
      }
      for (size_t i = 0; i < file.entries().size(); ++i) {
        const SafetensorsEntry& e = file.entries()[i];
        tensors.push_back({e.name, DType::f32, Shape(e.shape), values[i].data(), DType::f32});
      }
      safetensors_write((dir_ / "model" / "model.safetensors").string(), tensors);
    }
    std::ofstream rows(dir_ / "rows.jsonl");
    for (int step = 1; step <= steps; ++step)
      for (int r = 0; r < kGlobalBatch; ++r) {
        nlohmann::json tokens = nlohmann::json::array(), mask = nlohmann::json::array();
        for (int t = 0; t < kRowTokens; ++t) {
          tokens.push_back((step * 37 + r * 11 + t * 5) % 100);
          mask.push_back(t == 0 ? 0 : 1);
        }
        if (nan_steps.count(step)) tokens[kRowTokens / 2] = kNanToken;
        rows << nlohmann::json{{"tokens", tokens}, {"loss_mask", mask}}.dump() << "\n";
      }
    rows.close();
    std::ofstream(dir_ / "recipe.yaml")
        << "schema_version: 1\nmodel: golden-tiny-untied\nstatus: draft\n"
        << "workload: {row_tokens: " << kRowTokens << ", global_batch: " << kGlobalBatch
        << ", precision: fp32}\n"
        << "layout: {tp: 1, pp: 1, cp: 1, dp: 1, sequence_parallel: false, max_tokens_per_gpu: "
        << kGlobalBatch * kRowTokens << "}\n"
        << "result: {window: [1, " << steps << "]}\n"
        << "train:\n  device: cpu\n  seed: 1\n  init: {hf_checkpoint: model}\n  data: {path: rows.jsonl}\n"
        << "  steps: " << steps << "\n"
        << "  optimizer: {lr: 1.0e-3, min_lr: 1.0e-4, decay: cosine, warmup_fraction: 0.2}\n"
        << "  checkpoint: {every: 2, keep: 2}\n  output_dir: run\n";
  }

  // Starts `loom train recipe.yaml ARGS...` with stdout and stderr into log.
  pid_t spawn(const std::vector<std::string>& args, const Options& options = {}) {
    std::vector<std::string> argv_text{LOOM_EXE, "train", (dir_ / "recipe.yaml").string()};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<std::string> env_text;
    for (char** e = environ; *e; ++e) env_text.push_back(*e);
    env_text.insert(env_text.end(), options.env.begin(), options.env.end());
    std::vector<char*> argv, envp;
    for (std::string& a : argv_text) argv.push_back(a.data());
    for (std::string& e : env_text) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    const std::string log = (dir_ / "log").string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (options.file_size_limit != RLIM_INFINITY) {
        // Ignored, SIGXFSZ stays ignored across exec and a write past the limit fails with EFBIG.
        ::signal(SIGXFSZ, SIG_IGN);
        const rlimit limit{options.file_size_limit, options.file_size_limit};
        ::setrlimit(RLIMIT_FSIZE, &limit);
      }
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    return pid;
  }

  // The exit code, or 128 + the signal that ended it.
  static int wait_for(pid_t pid) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  int loom(const std::vector<std::string>& args, const Options& options = {}) {
    return wait_for(spawn(args, options));
  }
  std::string log() const { return file_bytes(dir_ / "log"); }
  fs::path run() const { return dir_ / "run"; }
  std::vector<StepMetrics> metrics() const { return metrics_read_jsonl((run() / "metrics.jsonl").string()); }
  // A save of step 4 that failed on a full disk: exit 3's log names the file and the error,
  // step 2's checkpoint (its state file `before`) is the latest and unchanged, and nothing of
  // the failed save is left.
  void expect_the_failed_save_left_step_2(const std::string& before) const {
    EXPECT_NE(log().find("step-00000004.tmp/state.safetensors"), std::string::npos) << log();
    EXPECT_NE(log().find(std::strerror(EFBIG)), std::string::npos) << log();
    ASSERT_EQ(checkpoint_latest(run().string())->step, 2);
    EXPECT_TRUE(file_bytes(run() / "checkpoints" / "step-00000002" / "state.safetensors") == before)
        << "the previous checkpoint changed";
    for (const fs::directory_entry& e : fs::directory_iterator(run() / "checkpoints"))
      EXPECT_EQ(e.path().filename(), "step-00000002") << "the failed save left " << e.path();
  }
  // The run's metrics (`steps` of them) and final weights are the straight run's, bit for bit.
  void expect_the_straight_run(size_t steps) const {
    const std::vector<StepMetrics> a = metrics_read_jsonl((dir_ / "straight" / "metrics.jsonl").string()),
                                   b = metrics();
    ASSERT_EQ(a.size(), steps);
    ASSERT_EQ(b.size(), steps);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].loss, b[i].loss) << "step " << a[i].step;  // bitwise
      EXPECT_EQ(a[i].grad_norm, b[i].grad_norm) << "step " << a[i].step;
    }
    EXPECT_TRUE(file_bytes(dir_ / "straight" / "final" / "model.safetensors") ==
                file_bytes(run() / "final" / "model.safetensors"))
        << "the final weights differ";
  }

  fs::path dir_;
};

// Waits up to `seconds` for `ready`; false on the timeout.
template <typename Ready>
bool wait_until(Ready ready, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Where the host cannot hold a copy of the state (12 B a parameter; an offloaded optimizer's
// pinned state takes as much again), a single-rank run writes its checkpoints streamed, tensor
// by tensor, saying so once with the sizes, and resumes from the state file a range at a time:
// the run ends bitwise the straight one. A parallel layout (two processes over sockets) never
// gathers its state on one rank: it always checkpoints streamed from the ranks' shards, says
// so once, and resumes from that checkpoint bitwise on its layout, or on one rank.
TEST_F(Faults, AStateTheHostCannotHoldIsCheckpointedStreamedAndResumes) {
  make_run(4);
  const Options short_of_memory{{"LOOM_TEST_HOST_AVAILABLE_BYTES=1000"}, RLIM_INFINITY};
  ASSERT_EQ(loom({"--set", "train.output_dir=straight"}), 0) << log();
  ASSERT_EQ(loom({"--stop-at-step", "3"}, short_of_memory), 0) << log();
  const std::string said = log();
  const std::string line = "loom: checkpoints are written streamed, tensor by tensor, and the step waits";
  ASSERT_NE(said.find(line), std::string::npos) << said;
  EXPECT_EQ(said.find(line, said.find(line) + 1), std::string::npos) << "said once: " << said;
  EXPECT_NE(said.find("12 B a parameter"), std::string::npos) << said;
  ASSERT_EQ(checkpoint_latest(run().string())->step, 3);
  ASSERT_EQ(loom({}, short_of_memory), 0) << log();
  EXPECT_NE(log().find("resuming from " + (run() / "checkpoints" / "step-00000003").string()),
            std::string::npos)
      << log();
  expect_the_straight_run(4);
  EXPECT_TRUE(file_bytes(dir_ / "straight" / "checkpoints" / "step-00000002" / "state.safetensors") ==
              file_bytes(run() / "checkpoints" / "step-00000002" / "state.safetensors"))
      << "the streamed state file differs from the full copy's";

  fs::remove_all(run());
  fs::remove_all(dir_ / "straight");
  const std::vector<std::string> dp2{"--nproc", "2", "--set", "layout.dp=2"};
  const std::string parallel_line =
      "loom: checkpoints are written streamed, tensor by tensor from each rank's shard, and the step waits";
  std::vector<std::string> straight = dp2;
  straight.insert(straight.end(), {"--set", "train.output_dir=straight"});
  ASSERT_EQ(loom(straight), 0) << log();
  EXPECT_NE(log().find(parallel_line), std::string::npos) << "with the memory to spare too: " << log();
  std::vector<std::string> stop = dp2;
  stop.insert(stop.end(), {"--stop-at-step", "3"});
  ASSERT_EQ(loom(stop, short_of_memory), 0) << log();
  const std::string parallel_said = log();
  ASSERT_NE(parallel_said.find(parallel_line), std::string::npos) << parallel_said;
  EXPECT_EQ(parallel_said.find(parallel_line, parallel_said.find(parallel_line) + 1), std::string::npos)
      << "said once: " << parallel_said;
  ASSERT_EQ(checkpoint_latest(run().string())->step, 3);
  fs::copy(run(), dir_ / "one", fs::copy_options::recursive);
  ASSERT_EQ(loom(dp2, short_of_memory), 0) << log();
  EXPECT_NE(log().find("resuming from " + (run() / "checkpoints" / "step-00000003").string()),
            std::string::npos)
      << log();
  expect_the_straight_run(4);
  EXPECT_TRUE(file_bytes(dir_ / "straight" / "checkpoints" / "step-00000002" / "state.safetensors") ==
              file_bytes(run() / "checkpoints" / "step-00000002" / "state.safetensors"))
      << "the streamed state files of one layout differ";
  ASSERT_EQ(loom({"--set", "train.output_dir=one"}, short_of_memory), 0) << log();
  EXPECT_NE(log().find("resuming on another layout"), std::string::npos) << log();
  EXPECT_EQ(metrics_read_jsonl((dir_ / "one" / "metrics.jsonl").string()).size(), 4u);
}

class FaultsSignal : public Faults, public ::testing::WithParamInterface<int> {};

TEST_P(FaultsSignal, FinishesTheStepCheckpointsAndExitsZero) {
  const int signal = GetParam();
  make_run(1000);
  const pid_t pid = spawn({});
  ASSERT_TRUE(wait_until([&] { return fs::exists(run() / "metrics.jsonl") && !metrics().empty(); }, 120))
      << log();
  ::kill(pid, signal);
  EXPECT_EQ(wait_for(pid), 0) << log();
  const std::vector<StepMetrics> done = metrics();
  ASSERT_FALSE(done.empty());
  EXPECT_LT(done.back().step, 1000) << "the run ended before the signal";
  ASSERT_TRUE(checkpoint_latest(run().string()).has_value()) << log();
  EXPECT_EQ(checkpoint_latest(run().string())->step, done.back().step)
      << "the checkpoint is of the last step run";
  EXPECT_NE(
      log().find("stopped after step " + std::to_string(done.back().step) + " of 1000 with a checkpoint"),
      std::string::npos)
      << log();
  EXPECT_FALSE(fs::exists(run() / "final"));
}

// The checkpoint of a signal's stop is written streamed too where the host cannot hold a copy.
TEST_F(Faults, ASignalsCheckpointIsStreamedWhereTheHostCannotHoldTheState) {
  make_run(1000);
  const pid_t pid = spawn({}, {{"LOOM_TEST_HOST_AVAILABLE_BYTES=1000"}, RLIM_INFINITY});
  ASSERT_TRUE(wait_until([&] { return fs::exists(run() / "metrics.jsonl") && !metrics().empty(); }, 120))
      << log();
  ::kill(pid, SIGTERM);
  EXPECT_EQ(wait_for(pid), 0) << log();
  const std::vector<StepMetrics> done = metrics();
  ASSERT_FALSE(done.empty());
  ASSERT_TRUE(checkpoint_latest(run().string()).has_value()) << log();
  EXPECT_EQ(checkpoint_latest(run().string())->step, done.back().step);
  EXPECT_NE(log().find("loom: checkpoints are written streamed"), std::string::npos) << log();
}

INSTANTIATE_TEST_SUITE_P(TermAndInt, FaultsSignal, ::testing::Values(SIGTERM, SIGINT),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return std::string(p.param == SIGTERM ? "SIGTERM" : "SIGINT");
                         });

TEST_F(Faults, KillNineDuringASaveResumesFromThePreviousCheckpointBitwise) {
  make_run(6);
  ASSERT_EQ(loom({"--set", "train.output_dir=straight"}), 0) << log();
  // Each save pauses 1.5 s between state.safetensors and its commit; the kill comes when
  // the step-4 save has written its state and not committed.
  const pid_t pid = spawn({}, {{"LOOM_TEST_CHECKPOINT_DELAY_MS=1500"}, RLIM_INFINITY});
  const fs::path tmp_state = run() / "checkpoints" / "step-00000004.tmp" / "state.safetensors";
  ASSERT_TRUE(wait_until([&] { return fs::exists(tmp_state); }, 120)) << log();
  ::kill(pid, SIGKILL);
  ASSERT_EQ(wait_for(pid), 128 + SIGKILL);
  ASSERT_TRUE(fs::exists(run() / "checkpoints" / "step-00000004.tmp")) << "killed after the commit";
  ASSERT_EQ(checkpoint_latest(run().string())->step, 2);

  ASSERT_EQ(loom({}), 0) << log();
  EXPECT_NE(
      log().find("resuming from " + (run() / "checkpoints" / "step-00000002").string() + " (step 2 of 6)"),
      std::string::npos)
      << log();
  expect_the_straight_run(6);
  // The killed save's leftovers went with the next commit.
  for (const fs::directory_entry& e : fs::directory_iterator(run() / "checkpoints"))
    EXPECT_TRUE(fs::exists(e.path() / "COMMIT")) << e.path();
}

TEST_F(Faults, AFullDiskDuringASaveLeavesThePreviousCheckpointIntact) {
  make_run(6);
  ASSERT_EQ(loom({"--stop-at-step", "2"}), 0) << log();
  const fs::path state = run() / "checkpoints" / "step-00000002" / "state.safetensors";
  const std::string before = file_bytes(state);
  ASSERT_FALSE(before.empty());
  // Room for the logs and meta.json, not for another state file.
  const int code = loom({}, {{}, static_cast<rlim_t>(before.size() / 2)});
  EXPECT_EQ(code, 3) << log();
  expect_the_failed_save_left_step_2(before);

  ASSERT_EQ(loom({}), 0) << log();
  EXPECT_NE(log().find("(step 2 of 6)"), std::string::npos) << log();
  EXPECT_EQ(metrics().size(), 6u);
}

// The same on a parallel layout, whose save streams from both ranks' shards: rank 0's failed
// write ends the run with exit 3 naming the file (the rank serving its reads is let go and
// ends too), the previous checkpoint untouched, nothing half written left.
TEST_F(Faults, AFullDiskDuringAParallelSaveLeavesThePreviousCheckpointIntact) {
  make_run(6);
  const std::vector<std::string> dp2{"--nproc", "2", "--set", "layout.dp=2"};
  std::vector<std::string> stop = dp2;
  stop.insert(stop.end(), {"--stop-at-step", "2"});
  ASSERT_EQ(loom(stop), 0) << log();
  const fs::path state = run() / "checkpoints" / "step-00000002" / "state.safetensors";
  const std::string before = file_bytes(state);
  ASSERT_FALSE(before.empty());
  EXPECT_EQ(loom(dp2, {{}, static_cast<rlim_t>(before.size() / 2)}), 3) << log();
  expect_the_failed_save_left_step_2(before);
  ASSERT_EQ(loom(dp2), 0) << log();
  EXPECT_NE(log().find("(step 2 of 6)"), std::string::npos) << log();
  EXPECT_EQ(metrics().size(), 6u);
}

TEST_F(Faults, ANanLossStopsTheRunNamingStepRankAndTensors) {
  make_run(4, {3});
  EXPECT_EQ(loom({}), 3) << log();
  EXPECT_NE(log().find("step 3, rank 0: loss nan, grad norm nan (not finite); non-finite grads in "),
            std::string::npos)
      << log();
  EXPECT_NE(log().find(" embedding ("), std::string::npos) << log();
  EXPECT_NE(log().find("train.on_nonfinite: stop"), std::string::npos) << log();
  EXPECT_EQ(metrics().size(), 2u) << "steps 1 and 2 ran";
}

// On a parallel layout each rank counts the non-finite values of its own slice of the grads
// and the counts are summed over the world (no rank gathers the grads): the report names the
// tensors and counts that the one-rank run's names, whichever rank's failure the launcher
// shows (each rank's names them); under skip_step every rank skips the step and world rank 0
// alone says so.
TEST_F(Faults, ANanLossOnAParallelLayoutNamesTheTensorsOfTheOneRankRun) {
  make_run(4, {3});
  // The first report, after its "step 3, rank N: " head.
  const auto report = [](const std::string& text) {
    const size_t head = text.find("step 3, rank ");
    if (head == std::string::npos) return std::string();
    const size_t from = text.find(": ", head) + 2;
    return text.substr(from, text.find("; the run stops", from) - from);
  };
  ASSERT_EQ(loom({}), 3) << log();
  const std::string one_rank = report(log());
  ASSERT_NE(one_rank.find("non-finite grads in "), std::string::npos) << log();
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--nproc", "4", "--set", "layout.tp=2", "--set", "layout.dp=2", "--set",
                                 "layout.sequence_parallel=true"},
        std::vector<std::string>{"--nproc", "2", "--set", "layout.pp=2"}}) {
    SCOPED_TRACE(layout[1] + " ranks, " + layout[3]);
    fs::remove_all(run());  // a fresh run, not a resume of the last one's checkpoint
    EXPECT_EQ(loom(layout), 3) << log();
    EXPECT_EQ(report(log()), one_rank) << log();
    EXPECT_EQ(metrics().size(), 2u) << "steps 1 and 2 ran";
  }
  fs::remove_all(run());
  ASSERT_EQ(loom({"--nproc", "2", "--set", "layout.pp=2", "--set", "train.on_nonfinite=skip_step"}), 0)
      << log();
  const std::string said = log();
  const size_t skipping = said.find("skipping the optimizer update");
  ASSERT_NE(skipping, std::string::npos) << said;
  EXPECT_EQ(said.find("skipping the optimizer update", skipping + 1), std::string::npos)
      << "said once: " << said;
  EXPECT_NE(said.find("step 3, rank 0: loss nan, grad norm nan (not finite); non-finite grads in "),
            std::string::npos)
      << said;
  const std::vector<StepMetrics> m = metrics();
  ASSERT_EQ(m.size(), 4u);
  for (const StepMetrics& s : m) EXPECT_EQ(s.skipped, s.step == 3) << "step " << s.step;
}

TEST_F(Faults, SkipStepSkipsTheUpdateLogsItAndResumesBitwise) {
  make_run(4, {3});
  const std::vector<std::string> skip{"--set", "train.on_nonfinite=skip_step"};
  std::vector<std::string> straight = skip;
  straight.insert(straight.end(), {"--set", "train.output_dir=straight"});
  ASSERT_EQ(loom(straight), 0) << log();
  EXPECT_NE(log().find("step 3, rank 0: loss nan"), std::string::npos) << log();
  EXPECT_NE(log().find("skipping the optimizer update"), std::string::npos) << log();
  const std::vector<StepMetrics> a = metrics_read_jsonl((dir_ / "straight" / "metrics.jsonl").string());
  ASSERT_EQ(a.size(), 4u);
  for (const StepMetrics& m : a) {
    EXPECT_EQ(m.skipped, m.step == 3) << "step " << m.step;
    EXPECT_EQ(std::isfinite(m.loss), m.step != 3) << "step " << m.step;
  }
  // Stopped right after the skipped step, the checkpoint carries the skip count: the
  // resumed step 4 is bitwise the straight run's (Adam's step count is 4 − 1 skipped).
  std::vector<std::string> first = skip;
  first.insert(first.end(), {"--stop-at-step", "3"});
  ASSERT_EQ(loom(first), 0) << log();
  ASSERT_EQ(loom(skip), 0) << log();
  const std::vector<StepMetrics> b = metrics();
  ASSERT_EQ(b.size(), 4u);
  EXPECT_TRUE(b[2].skipped);
  EXPECT_EQ(a[3].loss, b[3].loss);
  EXPECT_EQ(a[3].grad_norm, b[3].grad_norm);
  EXPECT_TRUE(file_bytes(dir_ / "straight" / "final" / "model.safetensors") ==
              file_bytes(run() / "final" / "model.safetensors"))
      << "the final weights differ";
}

TEST_F(Faults, SkipStepStopsAfterMaxConsecutiveSkips) {
  make_run(4, {2, 3});
  EXPECT_EQ(loom({"--set", "train.on_nonfinite=skip_step", "--set", "train.max_consecutive_skips=1"}), 3)
      << log();
  EXPECT_NE(log().find("step 2, rank 0: loss nan"), std::string::npos) << log();
  EXPECT_NE(log().find("step 3, rank 0: loss nan"), std::string::npos) << log();
  EXPECT_NE(log().find("(train.max_consecutive_skips: 1)"), std::string::npos) << log();
  EXPECT_EQ(metrics().size(), 2u) << "steps 1 and 2 (skipped) were logged";
}

TEST_F(Faults, AResumeWithChangedRecipeDataOrTokenizerIsRefusedAndAnotherLayoutIsNot) {
  make_run(4);
  std::ofstream(dir_ / "model" / "tokenizer.json") << "{\"version\": \"1\"}";
  ASSERT_EQ(loom({"--stop-at-step", "2"}), 0) << log();

  EXPECT_EQ(loom({"--set", "workload.global_batch=1"}), 2) << log();
  EXPECT_NE(log().find("workload.global_batch: 2 (checkpoint) vs 1 (now)"), std::string::npos) << log();

  const std::string rows = file_bytes(dir_ / "rows.jsonl");
  std::string changed = rows;
  changed[changed.find("\"tokens\":[") + 10] = changed[changed.find("\"tokens\":[") + 10] == '1' ? '2' : '1';
  std::ofstream(dir_ / "rows.jsonl", std::ios::binary) << changed;
  EXPECT_EQ(loom({}), 2) << log();
  EXPECT_NE(log().find("data.rows_sha256: "), std::string::npos) << log();
  std::ofstream(dir_ / "rows.jsonl", std::ios::binary) << rows;

  std::ofstream(dir_ / "model" / "tokenizer.json") << "{\"version\": \"2\"}";
  EXPECT_EQ(loom({}), 2) << log();
  EXPECT_NE(log().find("init.tokenizer_sha256: "), std::string::npos) << log();
  std::ofstream(dir_ / "model" / "tokenizer.json") << "{\"version\": \"1\"}";

  // A layout field (train.checkpoint is neither) may differ: resumed, and said.
  ASSERT_EQ(loom({"--set", "layout.max_tokens_per_gpu=16"}), 0) << log();
  EXPECT_NE(log().find("resuming on another layout: layout.max_tokens_per_gpu: 32 (checkpoint) vs 16 (now)"),
            std::string::npos)
      << log();
  EXPECT_EQ(metrics().size(), 4u);
}

}  // namespace
}  // namespace loom
