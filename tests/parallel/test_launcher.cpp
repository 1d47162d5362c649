// The launcher: World from the launchers' variables, the TCP rendezvous (threads and
// processes on localhost, ports chosen by the kernel), a missing or dying rank ending every
// rank with a message naming it, and --nproc stopping the other ranks when one fails.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "parallel/launcher.h"
#include "parallel/rendezvous.h"

extern char** environ;

namespace loom {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string input_error_of(std::map<std::string, std::string> vars) {
  try {
    world_from_env(env_of(std::move(vars)));
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(World, FromEachLauncher) {
  World single = world_from_env(env_of({}));
  EXPECT_EQ(single.size, 1);
  EXPECT_EQ(single.source, "single");

  World t = world_from_env(env_of({{"RANK", "3"},
                                   {"WORLD_SIZE", "8"},
                                   {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "2"},
                                   {"MASTER_ADDR", "node0"},
                                   {"MASTER_PORT", "29500"}}));
  EXPECT_EQ(t.source, "torchrun");
  EXPECT_EQ(t.rank, 3);
  EXPECT_EQ(t.size, 8);
  EXPECT_EQ(t.local_rank, 1);
  EXPECT_EQ(t.local_size, 2);
  EXPECT_EQ(t.master_addr, "node0");
  EXPECT_EQ(t.master_port, 29500);
  EXPECT_EQ(t.rendezvous_fd, -1);

  World s = world_from_env(env_of({{"SLURM_PROCID", "5"},
                                   {"SLURM_NTASKS", "16"},
                                   {"SLURM_LOCALID", "5"},
                                   {"SLURM_NTASKS_PER_NODE", "8(x2)"},
                                   {"MASTER_ADDR", "10.0.0.1"},
                                   {"MASTER_PORT", "1234"}}));
  EXPECT_EQ(s.source, "slurm");
  EXPECT_EQ(s.rank, 5);
  EXPECT_EQ(s.size, 16);
  EXPECT_EQ(s.local_rank, 5);
  EXPECT_EQ(s.local_size, 1);  // "8(x2)" is not a plain count

  World o = world_from_env(env_of({{"OMPI_COMM_WORLD_RANK", "0"},
                                   {"OMPI_COMM_WORLD_SIZE", "2"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                   {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                   {"MASTER_ADDR", "h"},
                                   {"MASTER_PORT", "9"},
                                   {"LOOM_RENDEZVOUS_FD", "5"}}));
  EXPECT_EQ(o.source, "openmpi");
  EXPECT_EQ(o.size, 2);
  EXPECT_EQ(o.local_size, 2);
  EXPECT_EQ(o.rendezvous_fd, 5);

  // torchrun's variables win over Slurm's (torchrun inside an allocation).
  World both = world_from_env(
      env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}}));
  EXPECT_EQ(both.source, "torchrun");
  EXPECT_EQ(both.size, 1);
}

TEST(World, BadVariablesNameThemselves) {
  EXPECT_NE(input_error_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})
                .find("environment variable RANK: expected an integer, found 'x'"),
            std::string::npos);
  EXPECT_NE(input_error_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("expected a rank in [0, 2), found 2"),
            std::string::npos);
  EXPECT_NE(input_error_of({{"RANK", "0"}}).find("environment variable WORLD_SIZE: unset, but RANK is set"),
            std::string::npos);
  EXPECT_NE(input_error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}})
                .find("environment variable MASTER_ADDR: unset"),
            std::string::npos);
  EXPECT_NE(
      input_error_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT: expected a port in [1, 65535], found 70000"),
      std::string::npos);
}

TEST(World, StripNproc) {
  EXPECT_EQ(strip_nproc_option({"loom", "train", "r.yaml", "--nproc", "4", "--set", "a=b"}),
            (std::vector<std::string>{"loom", "train", "r.yaml", "--set", "a=b"}));
  EXPECT_EQ(strip_nproc_option({"loom", "--nproc=2", "train"}), (std::vector<std::string>{"loom", "train"}));
}

// Worlds of threads: rank 0 gets a socket bound to a free port, the others its number.
std::vector<World> thread_worlds(int size) {
  int port = 0;
  int fd = rendezvous_listen("127.0.0.1", 0, &port);
  std::vector<World> worlds(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    World& w = worlds[static_cast<size_t>(r)];
    w.rank = r;
    w.size = size;
    w.master_addr = "127.0.0.1";
    w.master_port = port;
    w.source = "torchrun";
    if (r == 0) w.rendezvous_fd = fd;
  }
  return worlds;
}

// Collects the watch's failure messages of each rank.
struct Failures {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::string> by_rank;
  Rendezvous::FailureHandler handler(int rank) {
    return [this, rank](const std::string& message) {
      std::lock_guard<std::mutex> lock(mu);
      by_rank[rank] = message;
      cv.notify_all();
    };
  }
  bool wait_for(size_t count, std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] { return by_rank.size() >= count; });
  }
};

std::vector<uint8_t> pattern() {
  std::vector<uint8_t> p(128);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(255 - i);
  return p;
}

// Joins all ranks of `worlds` on threads; returns their Rendezvous.
std::vector<std::unique_ptr<Rendezvous>> join_all(const std::vector<World>& worlds, Failures& failures) {
  std::vector<std::unique_ptr<Rendezvous>> out(worlds.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < worlds.size(); ++r)
    threads.emplace_back([&, r] {
      out[r] = Rendezvous::join(worlds[r], r == 0 ? pattern() : std::vector<uint8_t>{}, 5000ms,
                                failures.handler(static_cast<int>(r)));
    });
  for (auto& t : threads) t.join();
  return out;
}

TEST(Rendezvous, ThreadsGetRankZerosPayloadAndFinish) {
  Failures failures;
  auto rendezvous = join_all(thread_worlds(4), failures);
  for (auto& r : rendezvous) EXPECT_EQ(r->payload(), pattern());
  std::vector<std::thread> threads;
  for (auto& r : rendezvous) threads.emplace_back([&r] { r->finish(5000ms); });
  for (auto& t : threads) t.join();
  rendezvous.clear();
  EXPECT_TRUE(failures.by_rank.empty());
}

// Every rank learns every rank's contribution and address (what SocketComm connects by).
TEST(Rendezvous, EveryRankGetsTheRankTable) {
  std::vector<World> worlds = thread_worlds(3);
  Failures failures;
  std::vector<std::unique_ptr<Rendezvous>> out(worlds.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < worlds.size(); ++r)
    threads.emplace_back([&, r] {
      const std::vector<uint8_t> contribution(r + 1, static_cast<uint8_t>(10 + r));
      out[r] = Rendezvous::join(worlds[r], r == 0 ? pattern() : std::vector<uint8_t>{}, 5000ms,
                                failures.handler(static_cast<int>(r)), contribution);
    });
  for (auto& t : threads) t.join();
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_EQ(out[r]->payload(), pattern());
    ASSERT_EQ(out[r]->ranks().size(), 3u);
    for (size_t j = 0; j < 3; ++j) {
      EXPECT_EQ(out[r]->ranks()[j].address, "127.0.0.1") << r << " " << j;
      EXPECT_EQ(out[r]->ranks()[j].contribution, std::vector<uint8_t>(j + 1, static_cast<uint8_t>(10 + j)));
    }
  }
  threads.clear();
  for (auto& r : out) threads.emplace_back([&r] { r->finish(5000ms); });
  for (auto& t : threads) t.join();
}

TEST(Rendezvous, MissingRankTimesOutNamingIt) {
  std::vector<World> worlds = thread_worlds(3);
  std::string messages[2];
  auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)  // rank 2 never comes
    threads.emplace_back([&, r] {
      try {
        Rendezvous::join(worlds[static_cast<size_t>(r)], pattern(), 300ms);
      } catch (const RuntimeFailure& e) {
        messages[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_LT(Clock::now() - start, 300ms + kVerdictMargin);
  for (const std::string& m : messages)
    EXPECT_NE(m.find("rank 2 did not arrive within 300 ms (world of 3)"), std::string::npos) << m;
  EXPECT_NE(messages[0].find("rank 0: rendezvous at 127.0.0.1:"), std::string::npos) << messages[0];
}

TEST(Rendezvous, UnreachableRankZeroIsNamed) {
  int port = 0;
  ::close(rendezvous_listen("127.0.0.1", 0, &port));  // a port nobody listens on
  World w;
  w.rank = 1;
  w.size = 2;
  w.master_addr = "127.0.0.1";
  w.master_port = port;
  try {
    Rendezvous::join(w, {}, 100ms);
    FAIL() << "no error";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(std::string(e.what()).find("could not reach rank 0"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, DeadRankIsReportedToEveryone) {
  Failures failures;
  auto rendezvous = join_all(thread_worlds(3), failures);
  rendezvous[2].reset();  // rank 2 "dies": its connection closes without finish
  ASSERT_TRUE(failures.wait_for(2, 5000ms));
  for (int r : {0, 1})
    EXPECT_NE(failures.by_rank[r].find("rank 2 (pid"), std::string::npos) << failures.by_rank[r];
  EXPECT_NE(failures.by_rank[0].find("died"), std::string::npos) << failures.by_rank[0];
  EXPECT_EQ(failures.by_rank[1], failures.by_rank[0]);  // rank 0 passed its verdict on
}

TEST(Rendezvous, ReportedFailureReachesEveryone) {
  Failures failures;
  auto rendezvous = join_all(thread_worlds(3), failures);
  rendezvous[1]->report_failure("NCCL timed out");
  ASSERT_TRUE(failures.wait_for(2, 5000ms));
  EXPECT_EQ(failures.by_rank.count(1), 0u);  // the reporter's own handler does not run
  for (int r : {0, 2}) EXPECT_EQ(failures.by_rank[r], "rank 1 failed: NCCL timed out");
}

TEST(Rendezvous, DeadRankZeroIsNamed) {
  Failures failures;
  auto rendezvous = join_all(thread_worlds(2), failures);
  rendezvous[0].reset();
  ASSERT_TRUE(failures.wait_for(1, 5000ms));
  EXPECT_NE(failures.by_rank[1].find("rank 0 (127.0.0.1:"), std::string::npos) << failures.by_rank[1];
}

// Processes of the helper binary.
struct Child {
  pid_t pid = -1;
  std::string log;
};

Child start(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra_env,
            int inherit_fd = -1) {
  static int counter = 0;
  Child child;
  child.log = ::testing::TempDir() + "loom_parallel_child_" + std::to_string(::getpid()) + "_" +
              std::to_string(counter++);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.push_back(*e);
  for (const auto& [k, v] : extra_env) env.push_back(k + "=" + v);
  std::vector<char*> argp, envp;
  std::vector<std::string> argv = args;
  argv.insert(argv.begin(), LOOM_PARALLEL_HELPER);
  for (auto& a : argv) argp.push_back(a.data());
  argp.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  child.pid = ::fork();
  if (child.pid == 0) {
    int fd = ::open(child.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);
    ::execve(argp[0], argp.data(), envp.data());
    ::_exit(127);
  }
  return child;
}

// Waits for the child up to `limit` (then kills it and returns -1); returns its exit code,
// or 128 + signal.
int wait_exit(const Child& child, std::chrono::milliseconds limit) {
  auto end = Clock::now() + limit;
  int status = 0;
  while (::waitpid(child.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > end) {
      ::kill(child.pid, SIGKILL);
      ::waitpid(child.pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string log_of(const Child& child) {
  std::ifstream in(child.log);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Ranks started one by one with torchrun's variables, as torchrun or srun would.
std::vector<Child> start_ranks(int size, const std::vector<int>& ranks, const std::string& behaviour,
                               int timeout_ms) {
  int port = 0;
  int fd = rendezvous_listen("127.0.0.1", 0, &port);
  std::vector<Child> children;
  for (int r : ranks) {
    std::map<std::string, std::string> env = {{"RANK", std::to_string(r)},
                                              {"WORLD_SIZE", std::to_string(size)},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(port)}};
    if (r == 0) env["LOOM_RENDEZVOUS_FD"] = std::to_string(fd);
    children.push_back(start({"rank", behaviour, std::to_string(timeout_ms)}, env, r == 0 ? fd : -1));
  }
  ::close(fd);
  return children;
}

TEST(Launcher, ProcessesRendezvousAndFinish) {
  for (const Child& c : start_ranks(3, {0, 1, 2}, "finish", 5000))
    EXPECT_EQ(wait_exit(c, 10s), 0) << log_of(c);
}

TEST(Launcher, MissingProcessTimesOutNamingIt) {
  auto start_time = Clock::now();
  std::vector<Child> children = start_ranks(3, {0, 1}, "finish", 500);
  for (const Child& c : children) {
    EXPECT_EQ(wait_exit(c, 10s), 3);
    EXPECT_NE(log_of(c).find("rank 2 did not arrive within 500 ms"), std::string::npos) << log_of(c);
  }
  EXPECT_LT(Clock::now() - start_time, 500ms + kVerdictMargin + 2s);  // process start-up allowance
}

TEST(Launcher, KilledProcessEndsTheOthers) {
  // No parent to stop them: the watch alone ends the blocked ranks.
  std::vector<Child> children = start_ranks(3, {0, 1, 2}, "die=2", 5000);
  EXPECT_EQ(wait_exit(children[2], 10s), 128 + SIGKILL);
  for (int r : {0, 1}) {
    const Child& c = children[static_cast<size_t>(r)];
    EXPECT_EQ(wait_exit(c, 5s), 3) << log_of(c);
    EXPECT_NE(log_of(c).find("loom: rank 2 (pid"), std::string::npos) << log_of(c);
    EXPECT_NE(log_of(c).find("died"), std::string::npos) << log_of(c);
  }
}

TEST(Launcher, ReportedFailureEndsTheOthers) {
  std::vector<Child> children = start_ranks(3, {0, 1, 2}, "fail=1", 5000);
  EXPECT_EQ(wait_exit(children[1], 10s), 2) << log_of(children[1]);
  for (int r : {0, 2}) {
    const Child& c = children[static_cast<size_t>(r)];
    EXPECT_EQ(wait_exit(c, 5s), 3) << log_of(c);
    EXPECT_NE(log_of(c).find("loom: rank 1 failed: simulated NCCL timeout"), std::string::npos) << log_of(c);
  }
}

TEST(Launcher, NprocSpawnsRanks) {
  Child parent = start({"spawn", "3", "rank", "finish", "5000"}, {});
  EXPECT_EQ(wait_exit(parent, 15s), 0) << log_of(parent);
  std::string log = log_of(parent);
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(log.find("rank " + std::to_string(r) + " of 3 joined"), std::string::npos) << log;
}

TEST(Launcher, NprocStopsTheOthersWhenOneIsKilled) {
  auto start_time = Clock::now();
  Child parent = start({"spawn", "4", "rank", "die=1", "5000"}, {});
  EXPECT_EQ(wait_exit(parent, 15s), 3) << log_of(parent);
  EXPECT_LT(Clock::now() - start_time, 10s);
  std::string log = log_of(parent);
  // The parent's line, or (if the watch was faster) a rank's, names rank 1.
  EXPECT_TRUE(log.find("loom: rank 1 (pid") != std::string::npos) << log;
}

// A rank that refuses bad input and exits 2 after the others (told of it, they exit 3 at
// once) still decides the parent's exit code: 2, as one process would exit.
TEST(Launcher, NprocExitsTwoWhenARankRefusedBadInputLast) {
  Child parent = start({"spawn", "3", "rank", "refuse=0", "5000"}, {});
  EXPECT_EQ(wait_exit(parent, 15s), 2) << log_of(parent);
}

}  // namespace
}  // namespace loom
