// DecoderModel's TP hook (tp_collectives.h) over a TP group's Comm, in the tensors'
// own dtype (fp32 on CPU ranks; bf16 activations and fp32 loss statistics on GPU ranks).
#pragma once

#include <functional>
#include <utility>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/tp_collectives.h"

namespace loom {

class CommTpCollectives final : public TpCollectives {
 public:
  // `ready` (may be empty) runs before each call unless `tp` is stream-ordered: what produced
  // the tensors must have finished before a device Comm reads them on a stream of its own
  // (HostStagedComm copies them to the host). A stream-ordered Comm (Comm::on_stream) is
  // queued behind their producers on the same stream, so the host does not wait.
  CommTpCollectives(Comm& tp, CommTimeout timeout, std::function<void()> ready = {})
      : tp_(tp), timeout_(timeout), ready_(std::move(ready)) {}
  void all_reduce(Tensor x) override {
    wait();
    tp_.all_reduce_sum(x.data, static_cast<size_t>(x.numel()), x.dtype, timeout_);
  }
  void all_gather(Tensor full, Tensor part) override {
    LOOM_ASSERT(full.numel() == part.numel() * tp_.size() && full.dtype == part.dtype, "all_gather sizes");
    wait();
    tp_.all_gather(part.data, full.data, static_cast<size_t>(part.numel()), part.dtype, timeout_);
  }
  void reduce_scatter(Tensor part, Tensor full) override {
    LOOM_ASSERT(full.numel() == part.numel() * tp_.size() && full.dtype == part.dtype,
                "reduce_scatter sizes");
    wait();
    tp_.reduce_scatter_sum(full.data, part.data, static_cast<size_t>(part.numel()), part.dtype, timeout_);
  }
  void shift(Tensor recv, Tensor send) override {
    LOOM_ASSERT(recv.numel() == send.numel() && recv.dtype == send.dtype && recv.data != send.data,
                "shift sizes");
    wait();
    const int size = tp_.size(), rank = tp_.rank();
    const auto count = static_cast<size_t>(send.numel());
    const P2POp legs[2] = {{P2POp::Kind::send, send.data, count, send.dtype, (rank + 1) % size},
                           {P2POp::Kind::recv, recv.data, count, recv.dtype, (rank + size - 1) % size}};
    tp_.exchange(legs, timeout_);
  }

 private:
  void wait() {
    if (ready_ && !tp_.stream_ordered()) ready_();
  }
  Comm& tp_;
  CommTimeout timeout_;
  std::function<void()> ready_;
};

}  // namespace loom
