// DecoderModel's EP hook (ep_collectives.h) over an EP group's Comms: the counts over the host
// one, the rows over the one of the tensors' memory (the same Comm on CPU ranks). The all-to-all is one
// Comm::exchange of a send and a recv a peer (NCCL: one ncclGroupStart/End of ncclSend/ncclRecv, the
// all-to-all-v of Megatron's dispatcher), the rank's own rows copied by `copy_local` (host memcpy unless
// given: a device copy on GPU ranks), since not every Comm sends to itself.
#pragma once

#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "core/error.h"
#include "parallel/comm.h"
#include "parallel/ep_collectives.h"

namespace loom {

class CommEpCollectives final : public EpCollectives {
 public:
  using Copy = std::function<void(void* dst, const void* src, size_t bytes)>;
  // `ready` (may be empty) runs before each call: what produced the tensors must have finished
  // before a Comm reads them (as CommTpCollectives).
  CommEpCollectives(Comm& ep, Comm& host_ep, CommTimeout timeout, std::function<void()> ready = {},
                    Copy copy_local = {})
      : ep_(ep),
        host_ep_(host_ep),
        timeout_(timeout),
        ready_(std::move(ready)),
        copy_local_(std::move(copy_local)) {
    if (!copy_local_)
      copy_local_ = [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); };
  }

  std::vector<int32_t> all_gather_counts(const std::vector<int32_t>& counts) override {
    std::vector<int32_t> all(counts.size() * static_cast<size_t>(host_ep_.size()));
    host_ep_.all_gather(counts.data(), all.data(), counts.size(), DType::i32, timeout_);
    return all;
  }

  void all_to_all(Tensor recv, const std::vector<int64_t>& recv_rows, Tensor send,
                  const std::vector<int64_t>& send_rows) override {
    const auto ranks = static_cast<size_t>(ep_.size());
    LOOM_ASSERT(recv_rows.size() == ranks && send_rows.size() == ranks && recv.dtype == send.dtype &&
                    recv.shape[1] == send.shape[1],
                "EP all_to_all sizes");
    if (ready_) ready_();
    const int64_t width = send.shape[1];
    const size_t row_bytes = static_cast<size_t>(width) * dtype_size(send.dtype);
    auto* to = static_cast<uint8_t*>(recv.data);
    const auto* from = static_cast<const uint8_t*>(send.data);
    std::vector<P2POp> ops;
    int64_t sent = 0, received = 0;
    for (size_t r = 0; r < ranks; ++r) {
      const int peer = static_cast<int>(r);
      if (peer == ep_.rank()) {
        LOOM_ASSERT(send_rows[r] == recv_rows[r], "EP all_to_all: a rank's rows to itself differ");
        copy_local_(to + received * row_bytes, from + sent * row_bytes,
                    static_cast<size_t>(send_rows[r]) * row_bytes);
      } else {
        if (send_rows[r] > 0)
          ops.push_back({P2POp::Kind::send, const_cast<uint8_t*>(from + sent * row_bytes),
                         static_cast<size_t>(send_rows[r] * width), send.dtype, peer});
        if (recv_rows[r] > 0)
          ops.push_back({P2POp::Kind::recv, to + received * row_bytes,
                         static_cast<size_t>(recv_rows[r] * width), recv.dtype, peer});
      }
      sent += send_rows[r];
      received += recv_rows[r];
    }
    LOOM_ASSERT(sent <= send.shape[0] && received <= recv.shape[0], "EP all_to_all rows past the tensors");
    if (!ops.empty()) ep_.exchange(ops, timeout_);
  }

 private:
  Comm& ep_;
  Comm& host_ep_;
  CommTimeout timeout_;
  std::function<void()> ready_;
  Copy copy_local_;
};

}  // namespace loom
