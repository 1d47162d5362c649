#include "ops/cuda/activation_offload.h"

#include <map>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device_arena.h"

namespace loom {
namespace {

class CudaActivationOffload final : public ActivationOffload {
 public:
  explicit CudaActivationOffload(cudaStream_t compute) : compute_(compute) {
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
    // Never recorded, a slot's event is complete: waiting on it is a no-op.
    for (cudaEvent_t& e : copied_) LOOM_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }

  // Waits for the copies (an error surfaces elsewhere: no throwing from here).
  ~CudaActivationOffload() override {
    cudaStreamSynchronize(copy_);
    for (auto& [index, in] : inputs_) cudaFreeHost(in.host);
    for (cudaEvent_t e : copied_) cudaEventDestroy(e);
    cudaEventDestroy(compute_mark_);
    cudaStreamDestroy(copy_);
  }

  Tensor slot(size_t index, Shape shape, DType dtype) override {
    Tensor t{nullptr, shape, dtype, Device::cuda};
    const auto bytes = static_cast<int64_t>(t.nbytes());
    if (bytes > slot_bytes_) grow_slots(bytes);
    const size_t s = index % kSlots;
    // The slot's previous chunk has gone to the host (or, in a backward, come back and been used).
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_[s], 0));
    t.data = slots_[s];
    Input& in = inputs_[index];
    in.tensor = t;
    return t;
  }

  void to_host(size_t index) override {
    Input& in = input(index);
    const auto bytes = static_cast<int64_t>(in.tensor.nbytes());
    if (bytes > in.host_bytes) {
      LOOM_CUDA_CHECK(cudaStreamSynchronize(copy_));  // no copy may still use the old buffer
      if (in.host) LOOM_CUDA_CHECK(cudaFreeHost(in.host));
      in.host = nullptr;
      LOOM_CUDA_CHECK(cudaHostAlloc(&in.host, static_cast<size_t>(bytes), cudaHostAllocDefault));
      host_bytes_ += bytes - in.host_bytes;
      in.host_bytes = bytes;
    }
    start_after_compute();
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(in.host, in.tensor.data, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, copy_));
    LOOM_CUDA_CHECK(cudaEventRecord(copied_[index % kSlots], copy_));
    in.fetching = false;
  }

  Tensor from_host(size_t index, size_t prefetch) override {
    Input& in = input(index);
    if (!in.fetching) fetch(index);
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(compute_, copied_[index % kSlots], 0));
    in.fetching = false;
    if (prefetch != kNone) fetch(prefetch);
    return in.tensor;
  }

  int64_t host_bytes() const override { return host_bytes_; }
  int64_t device_bytes() const override { return kSlots * slot_bytes_; }

 private:
  struct Input {
    Tensor tensor;  // its slot, shape and dtype
    void* host = nullptr;
    int64_t host_bytes = 0;
    bool fetching = false;  // a prefetch has started its copy back
  };

  Input& input(size_t index) {
    auto found = inputs_.find(index);
    LOOM_ASSERT(found != inputs_.end() && found->second.tensor.data, "a chunk input that never had a slot");
    return found->second;
  }

  // The copy stream's next work after the compute stream's work queued so far.
  void start_after_compute() {
    LOOM_CUDA_CHECK(cudaEventRecord(compute_mark_, compute_));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(copy_, compute_mark_, 0));
  }

  // Chunk index's input into its slot on the copy stream, once the compute stream is done
  // with the slot's previous chunk.
  void fetch(size_t index) {
    Input& in = input(index);
    LOOM_ASSERT(in.host, "a chunk input fetched before it went to the host");
    in.tensor.data = slots_[index % kSlots];
    start_after_compute();
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(in.tensor.data, in.host, in.tensor.nbytes(), cudaMemcpyHostToDevice, copy_));
    LOOM_CUDA_CHECK(cudaEventRecord(copied_[index % kSlots], copy_));
    in.fetching = true;
  }

  // Larger slots (a longer micro-batch): made once both streams are idle. In an arena of
  // their own, so that the run's peak (max_mem_gib) counts them.
  void grow_slots(int64_t bytes) {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(compute_));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(copy_));
    slot_arena_.release_all();
    for (void*& s : slots_) s = slot_arena_.allocate_bytes(bytes, "activation offload slot (a chunk input)");
    slot_bytes_ = bytes;
  }

  cudaStream_t compute_;
  cudaStream_t copy_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;
  cudaEvent_t copied_[kSlots] = {};  // each slot's last copy (to or from the host)
  DeviceArena slot_arena_{"activation offload slots"};
  void* slots_[kSlots] = {};
  int64_t slot_bytes_ = 0;
  int64_t host_bytes_ = 0;
  std::map<size_t, Input> inputs_;
};

}  // namespace

std::unique_ptr<ActivationOffload> cuda_activation_offload(cudaStream_t compute) {
  return std::make_unique<CudaActivationOffload>(compute);
}

}  // namespace loom
