// The launcher: which rank this process is, and `--nproc N` local spawning.
//
// A World comes from the environment the job was started with (docs/interface.md), first match:
//   torchrun     RANK, WORLD_SIZE, LOCAL_RANK (LOCAL_WORLD_SIZE), MASTER_ADDR, MASTER_PORT
//   Slurm        SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (srun; MASTER_ADDR/MASTER_PORT
//                must be exported by the batch script, as for torchrun under Slurm)
//   Open MPI     OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//                (OMPI_COMM_WORLD_LOCAL_SIZE), MASTER_ADDR/MASTER_PORT as for Slurm
//   none         a world of one
// A world of more than one rank needs MASTER_ADDR and MASTER_PORT: rank 0 listens there
// for the rendezvous (rendezvous.h).
//
// spawn_local starts N copies of this binary as ranks of one host, torchrun-style, waits
// for them, and when one fails stops the others.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;       // ranks on this host, where the launcher says (else 1)
  std::string master_addr;  // empty for a world of one
  int master_port = 0;
  std::string source = "single";  // "torchrun" | "slurm" | "openmpi" | "single"
  // A listening socket bound to master_port that rank 0 inherited from spawn_local
  // (LOOM_RENDEZVOUS_FD), or -1: then rank 0 binds MASTER_PORT itself.
  int rendezvous_fd = -1;
};

// Looks a variable up; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The World the variables describe. Throws InputError naming the variable when one is not
// an integer, a rank is outside [0, size), or MASTER_ADDR/MASTER_PORT are missing for a
// world of more than one rank.
World world_from_env(const EnvLookup& env);
World world_from_process_env();  // getenv

struct SpawnOptions {
  // The binary each rank runs; empty: this process's own (/proc/self/exe).
  std::string executable;
  // After the first failure, the others get SIGTERM, then SIGKILL once this has passed.
  std::chrono::milliseconds kill_grace{3000};
};

// Starts `nproc` ranks, each running `argv` (argv[0] is passed as is) with the parent's
// environment plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1
// and MASTER_PORT (a free port: the parent binds port 0 and hands the listening socket to
// rank 0, so no other process can take it in between). Children die with the parent
// (PR_SET_PDEATHSIG). Returns once all have ended: 0 when every rank exited 0; otherwise
// the first failure decides, its exit code or 3 when a signal ended it, unless a rank exits 2
// (bad input) while the others are stopped: their exit 3 only says that it gave up. The
// others are stopped at once and a line on stderr names the rank. SIGINT/SIGTERM to the parent are
// passed on to the ranks.
int spawn_local(int nproc, const std::vector<std::string>& argv, const SpawnOptions& options = {});

// argv without "--nproc N" / "--nproc=N" (what each spawned rank runs).
std::vector<std::string> strip_nproc_option(const std::vector<std::string>& argv);

}  // namespace loom
