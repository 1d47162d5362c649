// The TP hook of DecoderModel (model/decoder.h): the collectives of a tensor-parallel shard over
// its TP group, as an interface of its own so that the model calls them without knowing the
// Comm under them and parallel/'s implementations (comm_tp_collectives.h,
// overlapped_tp_collectives.h) need nothing of the model.
#pragma once

#include "core/error.h"
#include "core/tensor.h"

namespace loom {

// A collective begun by TpCollectives::start_*, to be waited for (TpCollectives::wait).
struct TpPending {
  int slot = -1;  // the implementation's; -1: it has finished already
};

// The collectives of a tp > 1 shard over its TP group, in place on the tensors' memory.
// Along the sequence (SP), rank r's part is rows [r·n, (r+1)·n) of the full tensor.
class TpCollectives {
 public:
  virtual ~TpCollectives() = default;
  // x = Σ over the TP ranks of x.
  virtual void all_reduce(Tensor x) = 0;
  // full [tp·n, ...] = the ranks' parts [n, ...] in rank order.
  virtual void all_gather(Tensor full, Tensor part) = 0;
  // part [n, ...] = Σ over the TP ranks of their full [tp·n, ...] rows of this rank.
  virtual void reduce_scatter(Tensor part, Tensor full) = 0;

  // The same collectives begun without holding up the ops queued after them, so that work
  // independent of them (the backward's GEMMs) runs while they move data: each reads what
  // the ops queued before it wrote; until wait(pending), the ops queued after it must neither
  // read its output nor write its tensors; after wait, they see its result, the plain call's
  // bits. Every rank must start and call the collectives in the same order. The defaults run
  // the plain call at once (CPU ranks; device Comms that cannot overlap).
  virtual TpPending start_all_reduce(Tensor x) {
    all_reduce(x);
    return {};
  }
  virtual TpPending start_all_gather(Tensor full, Tensor part) {
    all_gather(full, part);
    return {};
  }
  virtual TpPending start_reduce_scatter(Tensor part, Tensor full) {
    reduce_scatter(part, full);
    return {};
  }
  virtual void wait(TpPending pending) { (void)pending; }

  // Context parallelism's ring form (model/decoder.h set_context_ring), on the CP hook only:
  // recv = the send of the previous rank of the group, each rank sending to the next (rank + 1,
  // the last to the first); recv and send the same shape, distinct memory. start_shift begins
  // it as the start_* above do, so that the attention of the block already held runs while the
  // next one moves. The TP hooks have no ring: the default refuses.
  virtual void shift(Tensor recv, Tensor send) {
    (void)recv;
    (void)send;
    throw_runtime_failure("layout.cp_comm",
                          "this group's collectives have no ring of point-to-point transfers");
  }
  virtual TpPending start_shift(Tensor recv, Tensor send) {
    shift(recv, send);
    return {};
  }
};

}  // namespace loom
