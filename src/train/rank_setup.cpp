#include "train/rank_setup.h"

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "core/env.h"
#include "core/error.h"
#include "parallel/in_process_comm.h"
#include "parallel/socket_comm.h"
#include "train/cuda_device.h"
#include "train/engine.h"
#if LOOM_HAVE_CUDA
#include "parallel/host_staged_comm.h"
#endif
#if LOOM_HAVE_NCCL
#include "ops/cuda/stream.h"
#include "parallel/nccl_comm.h"
#endif

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

// LOOM_TEST_STAGED_DEVICE_COMM=1: GPU ranks share one GPU through HostStagedComm (tests).
bool staged_device_comm() {
  return env_flag("LOOM_TEST_STAGED_DEVICE_COMM");
}

}  // namespace

CommTimeout recipe_comm_timeout(const Recipe& recipe) {
  return std::chrono::ceil<CommTimeout>(std::chrono::duration<double>(recipe.train.comm_timeout_s));
}

WorldComm world_comm_create(const World& world, CommTimeout timeout) {
  WorldComm out;
  if (world.size == 1) {
    out.comm = std::move(InProcessComm::create_world(1).front());
    return out;
  }
  SocketWorld sockets = socket_world_join(world, timeout);
  out.rendezvous = std::move(sockets.rendezvous);
  out.comm = std::move(sockets.comm);
  return out;
}

std::unique_ptr<SingleRankGroups> single_rank_groups(CommTimeout timeout) {
  auto single = std::make_unique<SingleRankGroups>();
  single->world = world_comm_create(World{}, timeout).comm;
  single->groups = groups_create(*single->world, ParallelLayout{}, timeout);
  return single;
}

std::unique_ptr<Comm> device_world_create(Comm& host, CommTimeout timeout) {
  if (staged_device_comm()) {
#if LOOM_HAVE_CUDA
    return host_staged_comm_create(host);
#else
    throw_runtime_failure("LOOM_TEST_STAGED_DEVICE_COMM", "this loom was built without the CUDA backend");
#endif
  }
#if LOOM_HAVE_NCCL
  NcclUniqueId id{};
  if (host.rank() == 0) id = nccl_unique_id();
  host.broadcast(id.data(), id.size() / 4, DType::i32, 0, timeout);
  return nccl_comm_create(id, host.rank(), host.size(), cuda::current_device(), nullptr, timeout);
#else
  (void)host, (void)timeout;
  throw_runtime_failure("train.device cuda with several ranks", "this loom was built without NCCL");
#endif
}

void world_check(const Recipe& recipe, int world_size, const std::string& ranks_from) {
  const LayoutSpec& l = recipe.layout;
  if (l.world_size() == world_size) return;
  throw_input_error(recipe.path, "layout: tp·cp·dp·pp = " + std::to_string(l.tp) + "·" +
                                     std::to_string(l.cp) + "·" + std::to_string(l.dp) + "·" +
                                     std::to_string(l.pp) + " = " + std::to_string(l.world_size()) +
                                     " ranks, but " + ranks_from + " gives " + std::to_string(world_size) +
                                     " (expected the layout to cover every rank)");
}

void gpu_ranks_check(const Recipe& recipe, int world_size, int local_ranks) {
  if (recipe.train.device != "cuda" || world_size == 1) return;
  std::string why;
  if (!cuda_engine_available(&why))
    throw_input_error(recipe.path, "train.device: cuda, but " + why + " (expected train.device: cpu here)");
  if (staged_device_comm()) return;
  const int gpus = cuda_visible_devices();
  if (gpus < local_ranks)
    throw_input_error(recipe.path,
                      "train.device: cuda with " + std::to_string(local_ranks) + " ranks on this host, but " +
                          std::to_string(gpus) +
                          " GPU(s) are visible (expected one GPU a rank: NCCL runs one rank a device)");
}

RankSetup rank_setup(const Recipe& recipe, const World& world, CommTimeout timeout, int kill_rank) {
  world_check(recipe, world.size,
              world.source == "single"
                  ? std::string("a single process")
                  : "the launcher (" + world.source + ": " + std::to_string(world.size) + " ranks)");
  gpu_ranks_check(recipe, world.size, world.local_size);
  RankSetup setup;
  setup.world = world;
  WorldComm wc = world_comm_create(world, timeout);
  setup.rendezvous = std::move(wc.rendezvous);
  setup.world_comm = std::move(wc.comm);
  try {
    const LayoutSpec& l = recipe.layout;
    const ParallelLayout layout{static_cast<int>(l.tp), static_cast<int>(l.cp), static_cast<int>(l.dp),
                                static_cast<int>(l.pp), static_cast<int>(l.ep)};
    setup.groups = groups_create(*setup.world_comm, layout, timeout);
    if (world.size > 1 && recipe.train.device == "cuda") {
      cuda_select_device(world.local_rank);
      setup.device_world_comm = device_world_create(*setup.world_comm, timeout);
      setup.device_groups = groups_create(*setup.device_world_comm, layout, timeout);
    }

    // Before the check: a rank that passes it and fails in the trainer may end this one at once.
    if (world.size > 1 && world.rank == 0)
      std::fprintf(stderr,
                   "loom: %d ranks (%s) connected over TCP (SocketComm)%s; layout tp %lld, cp %lld, dp %lld, "
                   "pp %lld\n",
                   world.size, world.source.c_str(),
                   !setup.device_world_comm ? ""
                   : staged_device_comm()   ? ", GPU tensors staged through host memory"
                                            : ", GPU tensors over NCCL",
                   static_cast<long long>(l.tp), static_cast<long long>(l.cp), static_cast<long long>(l.dp),
                   static_cast<long long>(l.pp));

    if (kill_rank == world.rank) ::raise(SIGKILL);

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
