// `loom train` with several CPU ranks, through the loom binary: --nproc N starting ranks
// that connect a SocketComm, a layout that does not cover the ranks (exit 2), a rank killed
// while the others are in a collective (every rank ends non-zero, naming it, no hang), a
// rank that hangs (every rank ends within train.comm_timeout_s), ranks given different
// recipes, and a TP2 × PP2 layout trained by four processes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "parallel/rendezvous.h"

extern char** environ;

namespace loom {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string file_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class Nproc : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loom-nproc-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
            "-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // The golden tiny model on rows of 16 tokens, data parallel over two ranks.
    std::ofstream rows(dir_ / "rows.jsonl");
    for (int r = 0; r < 4; ++r) {
      rows << "{\"tokens\": [";
      for (int t = 0; t < 16; ++t) rows << (t ? ", " : "") << (r * 7 + t * 3) % 100;
      rows << "], \"loss_mask\": [0";
      for (int t = 1; t < 16; ++t) rows << ", 1";
      rows << "]}\n";
    }
    std::ofstream(dir_ / "recipe.yaml")
        << "schema_version: 1\nmodel: golden-tiny-untied\nstatus: draft\n"
        << "workload: {row_tokens: 16, global_batch: 2, precision: fp32}\n"
        << "layout: {tp: 1, pp: 1, cp: 1, dp: 2, sequence_parallel: false, max_tokens_per_gpu: 16}\n"
        << "train:\n  device: cpu\n  seed: 1\n  init: {hf_checkpoint: "
        << (fs::path(LOOM_SOURCE_DIR) / "tests/golden/tiny_untied/model").string() << "}\n"
        << "  data: {path: rows.jsonl}\n  steps: 2\n"
        << "  optimizer: {lr: 1.0e-3, min_lr: 1.0e-4, decay: cosine, warmup_fraction: 0.2}\n"
        << "  output_dir: run\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts `loom train recipe.yaml ARGS...` with `env` added, stderr into log-NAME.
  pid_t spawn(const std::string& name, const std::vector<std::string>& args,
              const std::map<std::string, std::string>& env = {}, int inherit_fd = -1) {
    std::vector<std::string> argv_text{LOOM_BINARY, "train", (dir_ / "recipe.yaml").string()};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<std::string> env_text;
    for (char** e = environ; *e; ++e) env_text.push_back(*e);
    for (const auto& [k, v] : env) env_text.push_back(k + "=" + v);
    std::vector<char*> argv, envp;
    for (std::string& a : argv_text) argv.push_back(a.data());
    for (std::string& e : env_text) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    const std::string log = (dir_ / ("log-" + name)).string();
    const pid_t pid = ::fork();
    if (pid == 0) {
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    return pid;
  }
  // The exit code, 128 + the signal, or -1 when it had not ended within `limit` (then killed).
  static int wait_exit(pid_t pid, std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > end) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        return -1;
      }
      std::this_thread::sleep_for(10ms);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string log(const std::string& name) const { return file_text(dir_ / ("log-" + name)); }

  // Two ranks started as torchrun would, each with `args[r]` and `env`.
  std::vector<pid_t> start_ranks(const std::vector<std::vector<std::string>>& args,
                                 const std::map<std::string, std::string>& env) {
    int port = 0;
    const int fd = rendezvous_listen("127.0.0.1", 0, &port);
    std::vector<pid_t> pids;
    for (size_t r = 0; r < args.size(); ++r) {
      std::map<std::string, std::string> e = env;
      e["RANK"] = std::to_string(r);
      e["WORLD_SIZE"] = std::to_string(args.size());
      e["MASTER_ADDR"] = "127.0.0.1";
      e["MASTER_PORT"] = std::to_string(port);
      if (r == 0) e["LOOM_RENDEZVOUS_FD"] = std::to_string(fd);
      pids.push_back(spawn("rank" + std::to_string(r), args[r], e, r == 0 ? fd : -1));
    }
    ::close(fd);
    return pids;
  }

  fs::path dir_;
};

TEST_F(Nproc, LayoutMustCoverTheRanks) {
  EXPECT_EQ(wait_exit(spawn("parent", {"--nproc", "3"}), 30s), 2);
  EXPECT_NE(log("parent").find("layout: tp·cp·dp·pp = 1·1·2·1 = 2 ranks, but --nproc 3 gives 3 (expected "
                               "the layout to cover every rank)"),
            std::string::npos)
      << log("parent");
  EXPECT_EQ(log("parent").find("rank 0"), std::string::npos) << "no rank should have started";
  // GPU ranks need a GPU each (NCCL runs one rank a device): refused before any rank starts
  // where there is none (CI), or only one, or where the build has no CUDA backend at all
  // (-DLOOM_ENABLE_CUDA=OFF, or no nvcc).
  EXPECT_EQ(wait_exit(spawn("cuda", {"--nproc", "2", "--set", "train.device=cuda", "--set",
                                     "workload.precision=bf16", "--force"}),
                      30s),
            2);
  const std::string cuda = log("cuda");
  EXPECT_TRUE(cuda.find("train.device: cuda, but no CUDA device is visible") != std::string::npos ||
              cuda.find("train.device: cuda with 2 ranks on this host, but 1 GPU(s) are visible") !=
                  std::string::npos ||
              cuda.find("train.device: cuda, but this loom was built without the CUDA backend") !=
                  std::string::npos)
      << cuda;
  EXPECT_EQ(log("cuda").find("rank 0"), std::string::npos) << "no rank should have started";
  // What every rank's train_run would refuse is refused once, by the parent.
  EXPECT_EQ(wait_exit(spawn("precision", {"--nproc", "2", "--set", "workload.precision=bf16"}), 30s), 2);
  const std::string precision = log("precision");
  const std::string refusal =
      "workload.precision, train.device: found bf16 on train.device cpu, expected fp32";
  EXPECT_NE(precision.find(refusal), std::string::npos) << precision;
  EXPECT_EQ(precision.find(refusal), precision.rfind(refusal)) << "one message, not one a rank:\n"
                                                               << precision;
  EXPECT_EQ(precision.find("rank 0"), std::string::npos) << "no rank should have started";
  // A single process is a world of one.
  EXPECT_EQ(wait_exit(spawn("single", {}), 30s), 2);
  EXPECT_NE(log("single").find("= 2 ranks, but a single process gives 1"), std::string::npos)
      << log("single");
}

// The ranks rendezvous, connect a SocketComm, split the groups, agree on the recipe and
// train TP2 + SP × PP2 as processes: rank 0 alone writes the outputs, and the losses are
// the single process's up to fp32 rounding (tests/train/test_parallel_train.cpp has the
// layouts against one rank in detail).
TEST_F(Nproc, RanksTrainAParallelLayoutAsOneProcessDoes) {
  EXPECT_EQ(wait_exit(spawn("one", {"--set", "layout.dp=1", "--set", "train.output_dir=one"}), 60s), 0)
      << log("one");
  EXPECT_EQ(wait_exit(spawn("parent", {"--nproc", "4", "--set", "layout.tp=2", "--set", "layout.pp=2",
                                       "--set", "layout.dp=1", "--set", "layout.sequence_parallel=true"}),
                      120s),
            0)
      << log("parent");
  EXPECT_NE(log("parent").find("loom: 4 ranks (torchrun) connected over TCP (SocketComm); layout tp 2, cp 1, "
                               "dp 1, pp 2"),
            std::string::npos)
      << log("parent");
  auto losses = [&](const std::string& run) {
    std::vector<double> out;
    std::ifstream in(dir_ / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss"));
    return out;
  };
  const std::vector<double> one = losses("one"), ranks = losses("run");
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(ranks.size(), 2u);  // one line per step: only rank 0 writes
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(ranks[i], one[i], 2e-6 * one[i]) << "step " << i + 1;
  EXPECT_TRUE(fs::exists(dir_ / "run" / "final" / "config.json"));
}

// Context parallelism through the binary: CP2 × PP2 as four processes over SocketComm (the
// K/V all-gather and reduce-scatter over TCP) gives the single process's losses.
TEST_F(Nproc, RanksTrainContextParallelAsOneProcessDoes) {
  EXPECT_EQ(wait_exit(spawn("one", {"--set", "layout.dp=1", "--set", "train.output_dir=one"}), 60s), 0)
      << log("one");
  EXPECT_EQ(wait_exit(spawn("parent", {"--nproc", "4", "--set", "layout.cp=2", "--set", "layout.pp=2",
                                       "--set", "layout.dp=1"}),
                      120s),
            0)
      << log("parent");
  EXPECT_NE(log("parent").find("layout tp 1, cp 2, dp 1, pp 2"), std::string::npos) << log("parent");
  auto losses = [&](const std::string& run) {
    std::vector<double> out;
    std::ifstream in(dir_ / run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss"));
    return out;
  };
  const std::vector<double> one = losses("one"), ranks = losses("run");
  ASSERT_EQ(one.size(), 2u);
  ASSERT_EQ(ranks.size(), 2u);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(ranks[i], one[i], 2e-6 * one[i]) << "step " << i + 1;
}

TEST_F(Nproc, KilledRankEndsEveryRankNamingIt) {
  const auto start = Clock::now();
  EXPECT_EQ(wait_exit(spawn("parent", {"--nproc", "2"}, {{"LOOM_TEST_KILL_RANK", "1"}}), 60s), 3)
      << log("parent");
  EXPECT_LT(Clock::now() - start, 30s);
  // The ranks' stderr is the parent's: its line ("rank 1 (pid N) was killed by signal 9"),
  // or rank 0's if rank 0 ended first, names rank 1.
  const std::string parent = log("parent");
  EXPECT_TRUE(parent.find("loom: rank 1 (pid") != std::string::npos ||
              parent.find("rank 1 (world rank 1) is gone") != std::string::npos)
      << parent;
}

// Without a parent, rank 0 ends on its own: the watch or SocketComm finds rank 1 gone
// while rank 0 waits for it in the startup all_gather.
TEST_F(Nproc, KilledRankEndsTheOtherWithoutAParent) {
  const auto start = Clock::now();
  std::vector<pid_t> pids = start_ranks({{}, {}}, {{"LOOM_TEST_KILL_RANK", "1"}});
  EXPECT_EQ(wait_exit(pids[1], 60s), 128 + SIGKILL) << log("rank1");
  EXPECT_EQ(wait_exit(pids[0], 30s), 3) << log("rank0");
  EXPECT_LT(Clock::now() - start, 30s);
  const std::string rank0 = log("rank0");
  const bool watch =
      rank0.find("loom: rank 1 (pid") != std::string::npos && rank0.find("died") != std::string::npos;
  const bool comm = rank0.find("rank 0: all_gather #") != std::string::npos &&
                    rank0.find("rank 1 (world rank 1) is gone") != std::string::npos;
  EXPECT_TRUE(watch || comm) << rank0;
}

// A rank that stops taking part (alive, its connections open) ends every rank within
// train.comm_timeout_s: rank 0 times out in a collective of step 2 naming rank 1 and the
// timeout, and passes it on to rank 1.
TEST_F(Nproc, HungRankEndsEveryRankWithinTheCommTimeout) {
  const std::vector<std::string> timeout{"--set", "train.comm_timeout_s=2"};
  const auto start = Clock::now();
  std::vector<pid_t> pids = start_ranks({timeout, timeout}, {{"LOOM_TEST_HANG_RANK", "1"}});
  EXPECT_EQ(wait_exit(pids[0], 60s), 3) << log("rank0");
  EXPECT_GE(Clock::now() - start, 2s) << "rank 0 should have waited out the timeout";
  EXPECT_EQ(wait_exit(pids[1], 10s), 3) << log("rank1");
  EXPECT_LT(Clock::now() - start, 20s);
  // Step 2's first collective is the DP grad reduce-scatter.
  const std::string rank0 = log("rank0");
  EXPECT_NE(rank0.find("loom: group 'dp' (world ranks [0, 1]) rank 0: reduce_scatter #"), std::string::npos)
      << rank0;
  EXPECT_NE(rank0.find(" timed out after 2000 ms waiting for rank 1 (world rank 1)"), std::string::npos)
      << rank0;
  EXPECT_NE(log("rank1").find("loom: rank 0 failed: "), std::string::npos) << log("rank1");

  // Through --nproc: the parent ends too, with the first failing rank's code.
  const auto parent_start = Clock::now();
  EXPECT_EQ(wait_exit(spawn("parent", {"--nproc", "2", "--set", "train.comm_timeout_s=2"},
                            {{"LOOM_TEST_HANG_RANK", "1"}}),
                      60s),
            3)
      << log("parent");
  EXPECT_LT(Clock::now() - parent_start, 20s);
  EXPECT_NE(log("parent").find(" timed out after 2000 ms waiting for rank 1 (world rank 1)"),
            std::string::npos)
      << log("parent");
}

TEST_F(Nproc, RanksWithDifferentRecipesAreRefused) {
  std::vector<pid_t> pids = start_ranks({{"--set", "train.seed=1"}, {"--set", "train.seed=2"}}, {});
  // Both ranks find it: each exits 2 with it, or 3 with the other's report of it, whichever
  // comes first ("loom: rank 1 failed: ...").
  const int rank0 = wait_exit(pids[0], 60s), rank1 = wait_exit(pids[1], 30s);
  EXPECT_TRUE(rank0 == 2 || rank0 == 3) << rank0 << log("rank0");
  EXPECT_TRUE(rank1 == 2 || rank1 == 3) << rank1 << log("rank1");
  EXPECT_NE(log("rank0").find("rank 1 loaded a different recipe (file or --set) than rank 0"),
            std::string::npos)
      << log("rank0");
}

}  // namespace
}  // namespace loom
