#include "parallel/launcher.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "core/error.h"
#include "parallel/rendezvous.h"

extern char** environ;

namespace loom {

namespace {

std::optional<int> int_var(const EnvLookup& env, const std::string& name) {
  std::optional<std::string> value = env(name);
  if (!value) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value->c_str(), &end, 10);
  if (value->empty() || *end != '\0' || errno != 0 || v < INT_MIN || v > INT_MAX)
    throw_input_error("environment variable " + name, "expected an integer, found '" + *value + "'");
  return static_cast<int>(v);
}

// The rank, size and local rank variable names of one launcher.
struct Scheme {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr Scheme kSchemes[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
};

volatile sig_atomic_t g_forward_signal = 0;
extern "C" void remember_signal(int sig) {
  g_forward_signal = sig;
}

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
           ")";
  return "ended with status " + std::to_string(status);
}

}  // namespace

World world_from_env(const EnvLookup& env) {
  World world;
  for (const Scheme& scheme : kSchemes) {
    std::optional<int> rank = int_var(env, scheme.rank);
    std::optional<int> size = int_var(env, scheme.size);
    if (!rank && !size) continue;
    if (!rank || !size)
      throw_input_error(std::string("environment variable ") + (rank ? scheme.size : scheme.rank),
                        std::string("unset, but ") + (rank ? scheme.rank : scheme.size) + " is set (" +
                            scheme.source + "): both are needed");
    world.source = scheme.source;
    world.rank = *rank;
    world.size = *size;
    // SLURM_NTASKS_PER_NODE may read "4(x2)"; then the local size stays unknown (1).
    std::optional<std::string> local_size = env(scheme.local_size);
    if (local_size && local_size->find_first_not_of("0123456789") == std::string::npos)
      world.local_size = int_var(env, scheme.local_size).value_or(1);
    world.local_rank = int_var(env, scheme.local_rank).value_or(0);
    if (world.size < 1)
      throw_input_error(std::string("environment variable ") + scheme.size,
                        "expected at least 1, found " + std::to_string(world.size));
    if (world.rank < 0 || world.rank >= world.size)
      throw_input_error(
          std::string("environment variable ") + scheme.rank,
          "expected a rank in [0, " + std::to_string(world.size) + "), found " + std::to_string(world.rank));
    if (world.local_rank < 0)
      throw_input_error(std::string("environment variable ") + scheme.local_rank,
                        "expected a non-negative local rank, found " + std::to_string(world.local_rank));
    break;
  }
  if (world.size == 1) return world;

  std::optional<std::string> addr = env("MASTER_ADDR");
  if (!addr || addr->empty())
    throw_input_error("environment variable MASTER_ADDR",
                      "unset; a world of " + std::to_string(world.size) + " ranks (" + world.source +
                          ") needs the host of rank 0 for the rendezvous");
  std::optional<int> port = int_var(env, "MASTER_PORT");
  if (!port)
    throw_input_error("environment variable MASTER_PORT",
                      "unset; a world of " + std::to_string(world.size) + " ranks needs the rendezvous port");
  if (*port < 1 || *port > 65535)
    throw_input_error("environment variable MASTER_PORT",
                      "expected a port in [1, 65535], found " + std::to_string(*port));
  world.master_addr = *addr;
  world.master_port = *port;
  if (world.rank == 0) {
    std::optional<int> fd = int_var(env, "LOOM_RENDEZVOUS_FD");
    if (fd && *fd < 0)
      throw_input_error("environment variable LOOM_RENDEZVOUS_FD", "expected a file descriptor");
    world.rendezvous_fd = fd.value_or(-1);
  }
  return world;
}

World world_from_process_env() {
  return world_from_env([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  });
}

std::vector<std::string> strip_nproc_option(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--nproc") {
      ++i;  // and its value
      continue;
    }
    if (argv[i].rfind("--nproc=", 0) == 0) continue;
    out.push_back(argv[i]);
  }
  return out;
}

int spawn_local(int nproc, const std::vector<std::string>& argv, const SpawnOptions& options) {
  LOOM_ASSERT(nproc >= 1 && !argv.empty(), "spawn_local needs ranks and a command");
  std::string exe = options.executable;
  if (exe.empty()) {
    char path[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (n <= 0)
      throw_runtime_failure("--nproc", std::string("cannot find this binary: ") + std::strerror(errno));
    exe.assign(path, static_cast<size_t>(n));
  }
  int port = 0;
  const int listen_fd = rendezvous_listen("127.0.0.1", 0, &port);

  // Everything the children need is built before fork: between fork and exec only
  // async-signal-safe calls are allowed.
  const std::set<std::string> overridden = {
      "RANK",        "WORLD_SIZE",  "LOCAL_RANK",        "LOCAL_WORLD_SIZE",
      "MASTER_ADDR", "MASTER_PORT", "LOOM_RENDEZVOUS_FD"};
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    if (!overridden.count(entry.substr(0, entry.find('=')))) base_env.push_back(entry);
  }
  std::vector<std::vector<std::string>> envs(static_cast<size_t>(nproc), base_env);
  for (int r = 0; r < nproc; ++r) {
    auto& env = envs[static_cast<size_t>(r)];
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(nproc));
    env.push_back("LOCAL_RANK=" + std::to_string(r));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    if (r == 0) env.push_back("LOOM_RENDEZVOUS_FD=" + std::to_string(listen_fd));
  }
  auto pointers = [](std::vector<std::string>& strings) {
    std::vector<char*> out;
    for (auto& s : strings) out.push_back(s.data());
    out.push_back(nullptr);
    return out;
  };
  std::vector<std::string> args = argv;
  std::vector<char*> arg_ptrs = pointers(args);

  struct sigaction forward {
  }, old_int{}, old_term{};
  forward.sa_handler = remember_signal;
  sigemptyset(&forward.sa_mask);
  g_forward_signal = 0;
  ::sigaction(SIGINT, &forward, &old_int);
  ::sigaction(SIGTERM, &forward, &old_term);

  const pid_t parent = ::getpid();
  std::vector<pid_t> pids;
  std::vector<bool> alive;
  for (int r = 0; r < nproc; ++r) {
    std::vector<char*> env_ptrs = pointers(envs[static_cast<size_t>(r)]);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(3);       // the parent died before prctl
      if (r == 0) ::fcntl(listen_fd, F_SETFD, 0);  // rank 0 keeps the listening socket
      ::execve(exe.c_str(), arg_ptrs.data(), env_ptrs.data());
      const char message[] = "loom: --nproc: exec of the rank binary failed\n";
      [[maybe_unused]] ssize_t n = ::write(2, message, sizeof(message) - 1);
      ::_exit(127);
    }
    if (pid < 0) {
      std::string why = std::strerror(errno);
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      ::close(listen_fd);
      ::sigaction(SIGINT, &old_int, nullptr);
      ::sigaction(SIGTERM, &old_term, nullptr);
      throw_runtime_failure("--nproc", "fork: " + why);
    }
    pids.push_back(pid);
    alive.push_back(true);
  }
  ::close(listen_fd);

  using Clock = std::chrono::steady_clock;
  int result = 0;
  bool stopping = false, killed = false;
  Clock::time_point kill_at{};
  int running = nproc;
  while (running > 0) {
    if (int sig = g_forward_signal) {
      g_forward_signal = 0;
      for (size_t i = 0; i < pids.size(); ++i)
        if (alive[i]) ::kill(pids[i], sig);
    }
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!alive[i]) continue;
      int status = 0;
      pid_t r = ::waitpid(pids[i], &status, WNOHANG);
      if (r != pids[i]) continue;
      alive[i] = false;
      --running;
      bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : static_cast<int>(ExitCode::runtime_failure);
      // A rank that refused bad input (exit 2) is why the others failed, even when they ended
      // first: they exit 3 as soon as the rendezvous tells them a peer gave up.
      if (stopping && code == static_cast<int>(ExitCode::bad_input)) result = code;
      if (ok || stopping) continue;
      // The first failure decides the result (but for a later exit 2); the others are stopped.
      result = code;
      stopping = true;
      kill_at = Clock::now() + options.kill_grace;
      std::fprintf(stderr, "loom: rank %zu (pid %d) %s; stopping the other %d rank(s)\n", i, pids[i],
                   describe_exit(status).c_str(), running);
      std::fflush(stderr);
      for (size_t j = 0; j < pids.size(); ++j)
        if (alive[j]) ::kill(pids[j], SIGTERM);
    }
    if (stopping && !killed && Clock::now() >= kill_at) {
      killed = true;
      for (size_t j = 0; j < pids.size(); ++j)
        if (alive[j]) ::kill(pids[j], SIGKILL);
    }
    if (running > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  ::sigaction(SIGTERM, &old_term, nullptr);
  return result;
}

}  // namespace loom
