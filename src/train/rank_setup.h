// The ranks of one `loom train`: starting them (--nproc N), and in each rank its world
// Comm and its Groups (parallel/), before the step loop.
//
//   loom train R --nproc N   parent: loads R, checks its layout covers N ranks, and starts
//                            N copies of its own command line without --nproc
//                            (spawn_local); it does no training itself
//   each rank                World from the environment (launcher.h) → world_comm_create →
//                            groups_create → a startup check that every rank runs the same
//                            recipe (an all_gather of its fingerprint)
//
// Test hook: rank_setup's `kill_rank` R (`loom train` passes LOOM_TEST_KILL_RANK=R, trainer.h
// TrainFaults) makes rank R SIGKILL itself after its groups are made, just before the startup
// check, so that tests see the other ranks blocked in a collective with a dead peer.
#pragma once

#include <memory>
#include <string>

#include "parallel/comm.h"
#include "parallel/groups.h"
#include "parallel/launcher.h"
#include "parallel/rendezvous.h"
#include "recipe/recipe.h"

namespace loom {

// train.comm_timeout_s (seconds, validated in (0, 86400]) as a Comm timeout, rounded up to
// whole milliseconds: how long a rank waits for the others to start (the rendezvous: ranks of
// a multi-node job start seconds apart) and for a peer in every collective of the run.
CommTimeout recipe_comm_timeout(const Recipe& recipe);

struct WorldComm {
  std::unique_ptr<Rendezvous> rendezvous;  // nullptr in a world of one
  std::unique_ptr<Comm> comm;              // "world"
};

// This process's host world Comm. A world of one: an InProcessComm of one rank (no sockets,
// every collective a copy), so that groups_create and the trainer need no special case. More
// ranks join the rendezvous and connect a SocketComm (CPU ranks train over it; GPU ranks use
// it for scalars and host gathers beside their device world).
WorldComm world_comm_create(const World& world, CommTimeout timeout);

// A world of one rank and its groups, each of that rank: what a run of one rank without the
// launcher takes part in (train_run without groups, an engine made without groups). Held by
// pointer: the groups point at the world.
struct SingleRankGroups {
  std::unique_ptr<Comm> world;
  Groups groups;
};
std::unique_ptr<SingleRankGroups> single_rank_groups(CommTimeout timeout);

// The device world of GPU ranks, over the host world `host` (collective over it): NcclComm on
// the current device (rank 0 makes NCCL's unique id and broadcasts it over `host`), or with
// LOOM_TEST_STAGED_DEVICE_COMM=1 in the environment a HostStagedComm over `host` itself, for
// ranks that share one GPU (NCCL refuses two ranks on one device; tests run the GPU parallel
// engine that way). Throws RuntimeFailure where neither is built.
std::unique_ptr<Comm> device_world_create(Comm& host, CommTimeout timeout);

// What every rank of a world of `world_size` would refuse, as an InputError: a layout whose
// tp·cp·dp·pp is not world_size (naming the recipe, its layout fields and `ranks_from`, e.g.
// "--nproc 3").
void world_check(const Recipe& recipe, int world_size, const std::string& ranks_from);

// GPU ranks (train.device cuda, more than one rank) need a visible GPU each on their host
// (NCCL takes one device a rank), unless LOOM_TEST_STAGED_DEVICE_COMM=1 lets them share
// one: an InputError naming train.device, the ranks and the GPUs otherwise. `local_ranks`:
// this host's ranks (--nproc N, or the launcher's local size).
void gpu_ranks_check(const Recipe& recipe, int world_size, int local_ranks);

struct RankSetup {
  World world;
  std::unique_ptr<Rendezvous> rendezvous;  // nullptr in a world of one
  std::unique_ptr<Comm> world_comm;
  Groups groups;
  // GPU ranks of a world of more than one (train.device cuda): the same layout's groups over
  // the device world (device_world_create), which carry the engine's GPU tensors.
  std::unique_ptr<Comm> device_world_comm;
  Groups device_groups;
  // Output files (metrics.jsonl, checkpoints, final/, result.yaml) come from rank 0 only.
  bool writes_outputs() const { return world.rank == 0; }
};

// Everything above for this rank of `world`: world_check, the world Comm, the groups,
// the startup check (InputError when a rank's recipe differs from rank 0's). `kill_rank`: the
// test hook above; -1, none.
RankSetup rank_setup(const Recipe& recipe, const World& world, CommTimeout timeout, int kill_rank = -1);

// `loom train ... --nproc N`: starts N ranks running this process's command line without
// --nproc (spawn_local) and returns its exit code.
int train_spawn_ranks(int nproc);

}  // namespace loom
