// SocketComm: the Comm of CPU ranks that are separate processes (`loom train --nproc N`
// with train.device cpu, or ranks started by torchrun / srun / mpirun), over TCP.
//
// Bootstrap: every rank listens on a free port, joins the world's rendezvous (rendezvous.h)
// with that port as its contribution, and so learns every rank's address; then rank i
// connects to each rank j < i and accepts a connection from each j > i: one TCP
// connection per pair, shared by every group split from the world.
//
// Collectives are gather-to-all: each rank sends every other rank of the group what that
// rank needs of its input (all of it for all_reduce and all_gather, the receiver's slice for
// reduce_scatter, the root's data for broadcast, nothing for barrier) and computes its own
// result from the n inputs. That moves (n − 1) × the buffer per rank, not a ring's
// 2 (n − 1) / n, but it is what makes the sums InProcessComm's bit for bit: every rank adds
// the ranks' values in rank order with the same code (rank_order_sum.h), whatever the
// arrival order. For CPU test sizes (a few MB, a handful of ranks) that is milliseconds.
//
// Every rank also sends every other rank a header naming the call (kind, count, dtype,
// root), so mismatched collectives are found and named as InProcessComm names them.
//
// Point to point: a send is one framed message, received by the peer's reader thread into
// memory; the sender's exchange returns once the receiver has taken it (an acknowledgement
// comes back), so sends are synchronous as NCCL's and InProcessComm's are: a pattern that
// would deadlock on GPUs times out here too. exchange() writes all its sends before it
// waits for any recv, and a reader thread drains every socket all the time, so two ranks
// sending to each other in one exchange never block on full socket buffers.
//
// Failure: a peer that does not take part within the timeout, or whose connection closes
// (its process ended; a vanished host is found by TCP keep-alive), makes the call throw
// RuntimeFailure naming the group, this rank and the peer waited for. The first failure
// marks the process's transport failed: every group of it is unusable afterwards, and
// later calls throw carrying that first message. Messages number a group's collectives
// from 1 ("all_reduce #3"), as InProcessComm's do.
//
// Buffers travel in the host's byte order: the ranks of one job are one architecture.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"
#include "parallel/launcher.h"
#include "parallel/rendezvous.h"

namespace loom {

namespace detail {
struct SocketTransport;
}

class SocketComm final : public Comm {
 public:
  // A group over `transport` (socket_world_join makes the world; split the others).
  SocketComm(std::shared_ptr<detail::SocketTransport> transport, uint64_t id, std::string name, int rank,
             std::vector<int> world_ranks);

  void all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) override;
  void reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                          CommTimeout timeout) override;
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype, CommTimeout timeout) override;
  void broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) override;
  void barrier(CommTimeout timeout) override;
  void exchange(std::span<const P2POp> ops, CommTimeout timeout) override;
  std::unique_ptr<Comm> split(const std::vector<int>& members, const std::string& name,
                              CommTimeout timeout) override;

  ~SocketComm() override;

 private:
  struct Call;
  // Sends each peer its part of `call`, waits for every peer's, and returns them by group
  // rank (this rank's entry empty). Throws on a timeout, a closed peer, or a mismatch.
  std::vector<std::vector<uint8_t>> run_collective(Call& call, CommTimeout timeout);

  std::shared_ptr<detail::SocketTransport> transport_;
  uint64_t id_;                 // the same on every member: names the group in frames
  uint64_t collectives_ = 0;    // collectives called so far
  std::vector<uint64_t> sent_;  // p2p messages sent so far, by peer
};

// The world of this process: the rendezvous (whose watch ends this process when another
// rank dies, see rendezvous.h; on_failure replaces that) and the world SocketComm, named
// "world". Declared in this order so that the comm closes its connections first.
struct SocketWorld {
  std::unique_ptr<Rendezvous> rendezvous;
  std::unique_ptr<SocketComm> comm;
};

// Joins the rendezvous of `world` (size > 1) and connects every pair of ranks within
// `timeout`. Throws RuntimeFailure naming the ranks that did not connect.
SocketWorld socket_world_join(const World& world, CommTimeout timeout,
                              Rendezvous::FailureHandler on_failure = rendezvous_exit_on_failure);

}  // namespace loom
