#include "parallel/overlapped_tp_collectives.h"

#include <utility>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace loom {

OverlappedTpCollectives::OverlappedTpCollectives(std::unique_ptr<Comm> on_compute,
                                                 std::unique_ptr<Comm> on_side, cudaStream_t compute,
                                                 cudaStream_t side, CommTimeout timeout)
    : on_compute_(std::move(on_compute)),
      on_side_(std::move(on_side)),
      compute_(compute),
      side_(side),
      plain_(*on_compute_, timeout),
      started_(*on_side_, timeout) {
  LOOM_ASSERT(on_compute_->stream_ordered() && on_side_->stream_ordered(),
              "the overlapped TP collectives need stream-ordered Comms");
  LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
}

OverlappedTpCollectives::~OverlappedTpCollectives() {
  // Events and a stream may be destroyed with work pending: CUDA releases them once it ran.
  for (cudaEvent_t e : ends_) cudaEventDestroy(e);
  cudaEventDestroy(compute_mark_);
  cudaStreamDestroy(side_);
}

template <typename Call>
TpPending OverlappedTpCollectives::start(Call call) {
  LOOM_CUDA_CHECK(cudaEventRecord(compute_mark_, compute_));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(side_, compute_mark_));
  call(started_);
  if (free_slots_.empty()) {
    cudaEvent_t e = nullptr;
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ends_.push_back(e);
    free_slots_.push_back(static_cast<int>(ends_.size()) - 1);
  }
  const int slot = free_slots_.back();
  free_slots_.pop_back();
  LOOM_CUDA_CHECK(cudaEventRecord(ends_[static_cast<size_t>(slot)], side_));
  return {slot};
}

TpPending OverlappedTpCollectives::start_all_reduce(Tensor x) {
  return start([&](TpCollectives& side) { side.all_reduce(x); });
}

TpPending OverlappedTpCollectives::start_all_gather(Tensor full, Tensor part) {
  return start([&](TpCollectives& side) { side.all_gather(full, part); });
}

TpPending OverlappedTpCollectives::start_reduce_scatter(Tensor part, Tensor full) {
  return start([&](TpCollectives& side) { side.reduce_scatter(part, full); });
}

void OverlappedTpCollectives::wait(TpPending pending) {
  if (pending.slot < 0) return;
  // The wait takes the event's record as it is now, so the slot can be recorded again.
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute_, ends_[static_cast<size_t>(pending.slot)]));
  free_slots_.push_back(pending.slot);
}

std::unique_ptr<OverlappedTpCollectives> overlapped_tp_collectives_create(Comm& tp, cudaStream_t compute,
                                                                          CommTimeout timeout) {
  std::unique_ptr<Comm> on_compute = tp.on_stream(compute);
  if (!on_compute) return nullptr;
  int least = 0, greatest = 0;
  LOOM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t side = nullptr;
  LOOM_CUDA_CHECK(cudaStreamCreateWithPriority(&side, cudaStreamNonBlocking, greatest));
  std::unique_ptr<Comm> on_side = tp.on_stream(side);
  return std::make_unique<OverlappedTpCollectives>(std::move(on_compute), std::move(on_side), compute, side,
                                                   timeout);
}

}  // namespace loom
