#include "train/rank_setup.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "parallel/in_process_comm.h"
#include "parallel/socket_comm.h"

namespace loom {

namespace {

// 64-bit FNV-1a: a fingerprint that is the same in every rank's binary (std::hash need not be).
uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// This process's command line, from /proc/self/cmdline (NUL-separated).
std::vector<std::string> process_argv() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.empty()) throw_runtime_failure("--nproc", "cannot read /proc/self/cmdline");
  std::vector<std::string> argv;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    argv.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  return argv;
}

std::string device_refusal(const std::string& device, int world_size) {
  return "train.device: " + device + " with " + std::to_string(world_size) +
         " ranks: GPU ranks need NcclComm, which the trainer does not use yet (expected one rank, or "
         "train.device: cpu)";
}

}  // namespace

CommTimeout recipe_comm_timeout(const Recipe& recipe) {
  return std::chrono::ceil<CommTimeout>(std::chrono::duration<double>(recipe.train.comm_timeout_s));
}

WorldComm world_comm_create(const World& world, const std::string& device, CommTimeout timeout) {
  WorldComm out;
  if (world.size == 1) {
    out.comm = std::move(InProcessComm::create_world(1).front());
    return out;
  }
  if (device != "cpu") throw InputError(device_refusal(device, world.size));
  SocketWorld sockets = socket_world_join(world, timeout);
  out.rendezvous = std::move(sockets.rendezvous);
  out.comm = std::move(sockets.comm);
  return out;
}

void world_check(const Recipe& recipe, int world_size, const std::string& ranks_from) {
  const LayoutSpec& l = recipe.layout;
  if (l.world_size() == world_size) {
    if (world_size > 1 && recipe.train.device != "cpu")
      throw_input_error(recipe.path, device_refusal(recipe.train.device, world_size));
    return;
  }
  throw_input_error(recipe.path, "layout: tp·cp·dp·pp = " + std::to_string(l.tp) + "·" +
                                     std::to_string(l.cp) + "·" + std::to_string(l.dp) + "·" +
                                     std::to_string(l.pp) + " = " + std::to_string(l.world_size()) +
                                     " ranks, but " + ranks_from + " gives " + std::to_string(world_size) +
                                     " (expected the layout to cover every rank)");
}

RankSetup rank_setup(const Recipe& recipe, const World& world, CommTimeout timeout) {
  world_check(recipe, world.size,
              world.source == "single"
                  ? std::string("a single process")
                  : "the launcher (" + world.source + ": " + std::to_string(world.size) + " ranks)");
  RankSetup setup;
  setup.world = world;
  WorldComm wc = world_comm_create(world, recipe.train.device, timeout);
  setup.rendezvous = std::move(wc.rendezvous);
  setup.world_comm = std::move(wc.comm);
  try {
    const LayoutSpec& l = recipe.layout;
    setup.groups = groups_create(*setup.world_comm,
                                 ParallelLayout{static_cast<int>(l.tp), static_cast<int>(l.cp),
                                                static_cast<int>(l.dp), static_cast<int>(l.pp)},
                                 timeout);

    // Before the check: a rank that passes it and fails in the trainer may end this one at once.
    if (world.size > 1 && world.rank == 0)
      std::fprintf(
          stderr,
          "loom: %d ranks (%s) connected over TCP (SocketComm); layout tp %lld, cp %lld, dp %lld, pp %lld\n",
          world.size, world.source.c_str(), static_cast<long long>(l.tp), static_cast<long long>(l.cp),
          static_cast<long long>(l.dp), static_cast<long long>(l.pp));

    if (const char* kill = std::getenv("LOOM_TEST_KILL_RANK"); kill && std::atoi(kill) == world.rank)
      ::raise(SIGKILL);

    // Every rank must train the same recipe (same file, same --set): one that differs would
    // pass its collectives and silently compute something else.
    const uint64_t mine = fnv1a64(recipe_document_to_yaml(recipe.document));
    std::vector<uint64_t> all(static_cast<size_t>(world.size));
    setup.world_comm->all_gather(&mine, all.data(), 2, DType::i32, timeout);
    for (int r = 0; r < world.size; ++r)
      if (all[static_cast<size_t>(r)] != all[0])
        throw_input_error(recipe.path, "rank " + std::to_string(r) +
                                           " loaded a different recipe (file or --set) than rank 0; every "
                                           "rank must run the same one");
  } catch (const std::exception& e) {
    // The other ranks end at once, naming this one, instead of waiting out their timeouts.
    if (setup.rendezvous) setup.rendezvous->report_failure(e.what());
    throw;
  }
  return setup;
}

int train_spawn_ranks(int nproc) {
  return spawn_local(nproc, strip_nproc_option(process_argv()));
}

}  // namespace loom
