// A stand-in for `loom train` in the launcher tests: a rank that joins the rendezvous and
// then behaves as told.
//
//   loom_parallel_helper spawn N ARGS...       spawn_local(N, this binary ARGS...); exits
//                                              with its result
//   loom_parallel_helper rank BEHAVIOUR MS     a rank of the World in the environment,
//                                              rendezvous timeout MS; BEHAVIOUR:
//     finish    finish cleanly, exit 0
//     die=K     rank K SIGKILLs itself after the rendezvous; the others block (as in a
//               collective) until the watch ends them
//     fail=K    rank K reports a failure and exits 2; the others block
//     refuse=K  rank K reports a failure, waits for the others to have ended (their watch
//               exits 3), then exits 2; it ignores the parent's SIGTERM meanwhile, as
//               `loom train` does once its step loop's handler is installed
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/error.h"
#include "parallel/launcher.h"
#include "parallel/rendezvous.h"

namespace {

constexpr int kBlockedTooLong = 42;  // the watch did not end a blocked rank

std::vector<uint8_t> payload_pattern() {
  std::vector<uint8_t> p(128);
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<uint8_t>(7 * i + 1);
  return p;
}

int run_rank(const std::string& behaviour, int timeout_ms) {
  loom::World world = loom::world_from_process_env();
  const std::chrono::milliseconds timeout(timeout_ms);
  auto rendezvous =
      loom::Rendezvous::join(world, world.rank == 0 ? payload_pattern() : std::vector<uint8_t>{}, timeout);
  if (rendezvous->payload() != payload_pattern()) {
    std::fprintf(stderr, "rank %d: wrong payload\n", world.rank);
    return 4;
  }
  std::fprintf(stderr, "rank %d of %d joined\n", world.rank, world.size);
  if (behaviour == "finish") {
    rendezvous->finish(timeout);
    return 0;
  }
  const std::string target = behaviour.substr(behaviour.find('=') + 1);
  if (std::to_string(world.rank) == target) {
    if (behaviour.rfind("die=", 0) == 0) ::raise(SIGKILL);
    const bool refuse = behaviour.rfind("refuse=", 0) == 0;
    if (refuse) ::signal(SIGTERM, SIG_IGN);
    rendezvous->report_failure(refuse ? "simulated bad input" : "simulated NCCL timeout");
    // Under the parent's 500 ms kill grace: the others have ended by then.
    if (refuse) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return 2;
  }
  std::this_thread::sleep_for(std::chrono::seconds(30));
  return kBlockedTooLong;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  try {
    if (args.size() >= 3 && args[1] == "spawn") {
      std::vector<std::string> child(args.begin() + 3, args.end());
      child.insert(child.begin(), args[0]);
      loom::SpawnOptions options;
      options.kill_grace = std::chrono::milliseconds(500);
      return loom::spawn_local(std::stoi(args[2]), child, options);
    }
    if (args.size() == 4 && args[1] == "rank") return run_rank(args[2], std::stoi(args[3]));
  } catch (const loom::LoomError& e) {
    std::fprintf(stderr, "loom: %s\n", e.what());
    return static_cast<int>(e.code());
  }
  std::fprintf(stderr, "usage: %s spawn N ARGS... | rank BEHAVIOUR TIMEOUT_MS\n", argv[0]);
  return 2;
}
