// The GPU's arms of `loom check optimizer` (optimizer_arm.h): CudaAdamW as the CUDA engine
// runs it (with or without offload) under test, fp32-master AdamW on the GPU as the baseline.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "check/optimizer_arm.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/kernels.h"
#include "optim/cuda_adamw.h"

namespace loom {
namespace {

// A stream of the arm's own. cudaStreamCreate's streams synchronise with the legacy default
// stream that CudaAdamW's load and save copy on.
class ArmStream {
 public:
  ArmStream() { LOOM_CUDA_CHECK(cudaStreamCreate(&stream_)); }
  ~ArmStream() { cudaStreamDestroy(stream_); }
  ArmStream(const ArmStream&) = delete;
  ArmStream& operator=(const ArmStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// The grads come from pageable host memory: cudaMemcpyAsync has read them when it returns.
void upload_grads(float* device, const float* host, int64_t n, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaMemcpyAsync(device, host, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream));
}

// CudaAdamW over one tensor. The check gives decay with each step, so the optimizer (whose
// chunk table holds it) is made at the first step, from the masters init kept.
class CudaPrecisionAwareArm : public OptimizerArm {
 public:
  explicit CudaPrecisionAwareArm(const CudaAdamWOptions& options) : options_(options) {}

  void init(const float* master, int64_t n) override {
    n_ = n;
    initial_.assign(master, master + n);
    bits_ = static_cast<uint16_t*>(arena_.allocate_bytes(n * 2, "bf16 weights"));
    grads_ = static_cast<float*>(arena_.allocate_bytes(n * 4, "fp32 grads"));
  }
  void step(const AdamWConfig& cfg, float lr, int64_t t, bool decay, const float* grad) override {
    if (!adam_) {
      adam_ = std::make_unique<CudaAdamW>(std::vector<ParamRange>{{0, n_, decay}}, n_, bits_, grads_,
                                          stream_.get(), options_);
      adam_->load(initial_.data(), nullptr, nullptr);
      decay_ = decay;
    }
    LOOM_ASSERT(decay == decay_, "a tensor's weight decay cannot change between steps");
    upload_grads(grads_, grad, n_, stream_.get());
    adam_->step(cfg, lr, t);
  }
  void read_master(float* master) override {
    if (adam_)
      adam_->save(master, nullptr, nullptr);
    else
      std::copy(initial_.begin(), initial_.end(), master);
  }

 private:
  CudaAdamWOptions options_;
  ArmStream stream_;
  DeviceArena arena_{"optimizer check"};
  int64_t n_ = 0;
  std::vector<float> initial_;
  uint16_t* bits_ = nullptr;
  float* grads_ = nullptr;
  bool decay_ = true;
  std::unique_ptr<CudaAdamW> adam_;  // after the arena: it holds pointers into it
};

// Explicit fp32 masters on the GPU, the precision-aware kernel's update (adam.cu).
class CudaFp32MasterArm : public OptimizerArm {
 public:
  void init(const float* master, int64_t n) override {
    n_ = n;
    master_ = static_cast<float*>(arena_.allocate_bytes(n * 4, "fp32 masters"));
    grads_ = static_cast<float*>(arena_.allocate_bytes(n * 4, "fp32 grads"));
    m_ = static_cast<float*>(arena_.allocate_bytes(n * 4, "Adam first moment"));
    v_ = static_cast<float*>(arena_.allocate_bytes(n * 4, "Adam second moment"));
    LOOM_CUDA_CHECK(cudaMemcpy(master_, master, static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemset(m_, 0, static_cast<size_t>(n) * 4));
    LOOM_CUDA_CHECK(cudaMemset(v_, 0, static_cast<size_t>(n) * 4));
  }
  void step(const AdamWConfig& cfg, float lr, int64_t t, bool decay, const float* grad) override {
    if (!chunks_) {
      const std::vector<cuda::AdamChunk> chunks = cuda_adam_chunks({{0, n_, decay}});
      chunk_count_ = static_cast<int64_t>(chunks.size());
      chunks_ = static_cast<cuda::AdamChunk*>(arena_.allocate_bytes(
          chunk_count_ * static_cast<int64_t>(sizeof(cuda::AdamChunk)), "Adam chunk table"));
      LOOM_CUDA_CHECK(cudaMemcpy(chunks_, chunks.data(), chunks.size() * sizeof(cuda::AdamChunk),
                                 cudaMemcpyHostToDevice));
      decay_ = decay;
    }
    LOOM_ASSERT(decay == decay_, "a tensor's weight decay cannot change between steps");
    upload_grads(grads_, grad, n_, stream_.get());
    cuda::adamw_fp32(master_, grads_, m_, v_, chunks_, chunk_count_, cuda_adam_scalars(cfg, lr, t),
                     stream_.get());
  }
  void read_master(float* master) override {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
    LOOM_CUDA_CHECK(cudaMemcpy(master, master_, static_cast<size_t>(n_) * 4, cudaMemcpyDeviceToHost));
  }

 private:
  ArmStream stream_;
  DeviceArena arena_{"optimizer check"};
  int64_t n_ = 0;
  float *master_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  cuda::AdamChunk* chunks_ = nullptr;
  int64_t chunk_count_ = 0;
  bool decay_ = true;
};

}  // namespace

OptimizerArmSet optimizer_arms_cuda(bool offload) {
  if (cuda_device_count() == 0)
    throw_runtime_failure("--device cuda", "no CUDA device is visible, so the GPU arms cannot run");
  CudaAdamWOptions options;
  if (offload) {
    options.offload_fraction = 1.0;
    options.overlap = true;
  }
  OptimizerArmSet set;
  set.device = cuda_device_description(0);
  if (offload) set.device += ", optimizer offload 1.0 to the CPU, copies overlapped";
  set.is_cpu = false;
  size_t free_bytes = 0, total_bytes = 0;
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  set.device_free_bytes = static_cast<int64_t>(free_bytes);
  set.precision_aware_name =
      offload
          ? "precision-aware AdamW offloaded (CudaAdamW, fraction 1.0: CPU step, pinned state, overlapped "
            "copies)"
          : "precision-aware AdamW (CUDA kernel, bf16 + int16 remainder; CudaAdamW as the engine runs it)";
  set.precision_aware = [options] { return std::make_unique<CudaPrecisionAwareArm>(options); };
  set.fp32_master_name = "fp32-master AdamW (CUDA kernel)";
  set.fp32_master = [] { return std::make_unique<CudaFp32MasterArm>(); };
  return set;
}

}  // namespace loom
