// InProcessComm: ranks are threads of one process, buffers are host memory. It runs the
// TP/PP/DP code on CPU ranks in tests, with the results NCCL would give up to rounding.
//
// Reductions are deterministic: every rank computes its own result, adding the ranks'
// values in rank order (rank_order_sum.h: f32 in f32, f64 in f64, bf16 accumulated in f32
// and rounded once, i32 wrapping). Every rank gets the same bits, on every run, whatever
// the thread timing, and the same as SocketComm's.
//
// Sends are synchronous, as NCCL's are: a send returns once the matching recv has copied
// the data. A communication pattern that would deadlock on NCCL deadlocks here too, and
// then times out with a message instead of hanging.
//
// Failure: the first call that times out or finds mismatched arguments, or abort(), marks
// the whole world failed (every group split from it); blocked and later calls on any rank
// of any of its groups then throw RuntimeFailure carrying that first message.
// Messages number a group's collectives from 1 ("all_reduce #3").
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace loom {

namespace detail {
struct InProcessGroup;
}

class InProcessComm final : public Comm {
 public:
  // A world of `size` ranks named "world": element r is rank r's Comm, to be used by one
  // thread at a time.
  static std::vector<std::unique_ptr<InProcessComm>> create_world(int size);

  // Marks the world failed with `reason` (prefixed with this rank's description).
  void abort(const std::string& reason);

  void all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) override;
  void reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                          CommTimeout timeout) override;
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype, CommTimeout timeout) override;
  void broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) override;
  void barrier(CommTimeout timeout) override;
  void exchange(std::span<const P2POp> ops, CommTimeout timeout) override;
  std::unique_ptr<Comm> split(const std::vector<int>& members, const std::string& name,
                              CommTimeout timeout) override;

  ~InProcessComm() override;

 private:
  InProcessComm(std::shared_ptr<detail::InProcessGroup> group, int rank);
  struct Collective;
  // Runs one collective: publish `op`, wait for every rank (timeout), compute this rank's
  // result, wait until every rank has read the others' inputs, then write the result.
  void run_collective(Collective& op, CommTimeout timeout);

  std::shared_ptr<detail::InProcessGroup> group_;
};

// Runs body(world) for ranks 0..size-1, each on its own thread, and returns when all have
// finished. When a rank throws, the world is aborted, so that the other ranks' blocked
// calls throw too, and the first rank's exception is rethrown here once all have ended.
void run_in_process(int size, const std::function<void(Comm& world)>& body);

}  // namespace loom
