// The TP hook (tp_collectives.h) of a GPU rank whose TP Comm can be stream-ordered
// (NcclComm: Comm::on_stream). The plain collectives are queued on the compute stream behind
// the ops that produce their tensors, without a host wait; the started ones
// (TpCollectives::start_*) on a communication stream of their own, so that the compute
// stream runs the GEMMs they do not feed meanwhile: the backward's re-gather of a norm output
// beside the input-gradient GEMM, the input gradient's reduction beside the weight-gradient
// GEMM (Megatron's bulk overlap).
//
// Events order the two streams. A started collective runs after everything queued on the
// compute stream before it: its inputs, and the last readers of the buffer it writes (the
// shared re-gather buffer was read by the previous layer's weight-gradient GEMM). wait()
// makes the compute stream's next ops wait for it. Both streams' collectives go through the
// one TP communicator, which NCCL runs in the order they are issued, so every rank runs them
// in the model's program order. The communication stream has the highest priority, so that
// a collective's blocks are scheduled ahead of a GEMM's that is already filling the GPU.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "parallel/comm.h"
#include "parallel/comm_tp_collectives.h"
#include "parallel/tp_collectives.h"

namespace loom {

class OverlappedTpCollectives final : public TpCollectives {
 public:
  // `on_compute` and `on_side` are the TP Comm queued on `compute` and on `side`
  // (Comm::on_stream), `side` a stream this object owns from now on.
  OverlappedTpCollectives(std::unique_ptr<Comm> on_compute, std::unique_ptr<Comm> on_side,
                          cudaStream_t compute, cudaStream_t side, CommTimeout timeout);
  ~OverlappedTpCollectives() override;
  OverlappedTpCollectives(const OverlappedTpCollectives&) = delete;
  OverlappedTpCollectives& operator=(const OverlappedTpCollectives&) = delete;

  // The TP Comm queued on the compute stream. Its synchronize is the engine's bounded host
  // wait: it covers the collectives of both streams (they share the communicator).
  Comm& on_compute() { return *on_compute_; }
  // The communication stream (tests hold it up to see what waits for it).
  cudaStream_t side_stream() const { return side_; }

  void all_reduce(Tensor x) override { plain_.all_reduce(x); }
  void all_gather(Tensor full, Tensor part) override { plain_.all_gather(full, part); }
  void reduce_scatter(Tensor part, Tensor full) override { plain_.reduce_scatter(part, full); }
  TpPending start_all_reduce(Tensor x) override;
  TpPending start_all_gather(Tensor full, Tensor part) override;
  TpPending start_reduce_scatter(Tensor part, Tensor full) override;
  void wait(TpPending pending) override;

 private:
  // Orders the side stream after the compute stream's work so far, queues `call` on it (a
  // TpCollectives call over the side Comm) and records its end.
  template <typename Call>
  TpPending start(Call call);

  std::unique_ptr<Comm> on_compute_, on_side_;
  cudaStream_t compute_, side_;
  CommTpCollectives plain_, started_;   // over on_compute_, on_side_: no host waits
  cudaEvent_t compute_mark_ = nullptr;  // re-recorded for each start
  std::vector<cudaEvent_t> ends_;       // a started collective's end, by slot
  std::vector<int> free_slots_;
};

// The overlapped hook over `tp` for ops running on `compute`, with a new communication
// stream; nullptr when `tp` has no stream-ordered form (HostStagedComm).
std::unique_ptr<OverlappedTpCollectives> overlapped_tp_collectives_create(Comm& tp, cudaStream_t compute,
                                                                          CommTimeout timeout);

}  // namespace loom
