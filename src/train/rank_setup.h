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
// Test hook: LOOM_TEST_KILL_RANK=R makes rank R SIGKILL itself after its groups are made,
// just before the startup check, so that tests see the other ranks blocked in a collective
// with a dead peer.
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

// This process's world Comm. A world of one: an InProcessComm of one rank (no sockets, every
// collective a copy), so that groups_create and the trainer need no special case. More
// ranks: `device` cpu joins the rendezvous and connects a SocketComm; cuda throws InputError
// (one NcclComm per GPU is the path, nccl_comm.h, not wired into the trainer yet).
WorldComm world_comm_create(const World& world, const std::string& device, CommTimeout timeout);

// What every rank of a world of `world_size` would refuse, as an InputError: a layout whose
// tp·cp·dp·pp is not world_size (naming the recipe, its layout fields and `ranks_from`, e.g.
// "--nproc 3"), or train.device cuda with more than one rank (see world_comm_create).
void world_check(const Recipe& recipe, int world_size, const std::string& ranks_from);

struct RankSetup {
  World world;
  std::unique_ptr<Rendezvous> rendezvous;  // nullptr in a world of one
  std::unique_ptr<Comm> world_comm;
  Groups groups;
  // Output files (metrics.jsonl, checkpoints, final/, result.yaml) come from rank 0 only.
  bool writes_outputs() const { return world.rank == 0; }
};

// Everything above for this rank of `world`: world_check, the world Comm, the groups,
// the startup check (InputError when a rank's recipe differs from rank 0's).
RankSetup rank_setup(const Recipe& recipe, const World& world, CommTimeout timeout);

// `loom train ... --nproc N`: starts N ranks running this process's command line without
// --nproc (spawn_local) and returns its exit code.
int train_spawn_ranks(int nproc);

}  // namespace loom
