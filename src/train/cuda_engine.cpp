// The CUDA engine: one GPU, bf16 weights with int16 remainders (the precision-aware
// master of SEMANTICS.md: master = bf16 high half + remainder low half, bit for bit), fp32
// main grads and Adam moments, activations in their own arena. The optimizer is CudaAdamW
// (optim/cuda_adamw.h): the remainders and moments of layout.offload's share of the
// parameters live in pinned host memory and are stepped on the CPU, the same bits as on the GPU.
//
// The step's scale factors cost no pass of their own over the fp32 grads (8.1 GB at 1.7B):
// scale_grads(s) only records s, and the next pass applies it bit for bit as a pass
// x[i] *= s would have (the product rounded to fp32 before use). grad_sum_squares scales and
// sums in one kernel (the 1/Σn: a read pass saved), optimizer_step multiplies inside the
// AdamW update on both shares (the clip: a read + write pass saved); any other reader or
// writer of the grads applies the pending factor first.
//
// Zeroing the grads (a memset of 8.1 GB at 1.7B) runs on a stream of its own, beside the
// first micro-batch's forward, which reads no grad; its backward, and anything else that
// touches the grads, waits for it first (join_zeroing).
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>

#include "core/error.h"
#include "model/qwen3.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/kernels.h"
#include "optim/cuda_adamw.h"
#include "train/device_micro_batch.h"
#include "train/engine.h"

namespace loom {
namespace {

// The masters straight from the optimizer, a range at a time.
class MasterSource final : public ParamSource {
 public:
  explicit MasterSource(CudaAdamW& optimizer) : optimizer_(optimizer) {}
  void read(int64_t begin, int64_t count, float* dst) override { optimizer_.save_masters(begin, count, dst); }

 private:
  CudaAdamW& optimizer_;
};

// The state straight from the optimizer, a range at a time: masters rebuilt from the GPU's
// weights and remainders or the pinned offloaded share, moments from either.
class StateReader final : public StateSource {
 public:
  StateReader(CudaAdamW& optimizer, int64_t numel) : optimizer_(optimizer), numel_(numel) {}
  int64_t numel() const override { return numel_; }
  void read(StateGroup group, int64_t begin, int64_t count, float* dst) override {
    if (group == StateGroup::master)
      optimizer_.save_masters(begin, count, dst);
    else
      optimizer_.save_moments(begin, count, group == StateGroup::adam_m ? dst : nullptr,
                              group == StateGroup::adam_v ? dst : nullptr);
  }

 private:
  CudaAdamW& optimizer_;
  int64_t numel_;
};

class CudaEngine final : public TrainEngine {
 public:
  CudaEngine(const Qwen3Config& config, const ParamTable& table, ParamSource& params,
             const EngineOptions& options)
      : table_(table), n_(table.total_numel), model_(config, table_, ops_, options.recompute) {
    ops_.set_attention_backward_by_row(options.attention_backward_by_row);
    const auto bytes = [&](size_t elem) { return n_ * static_cast<int64_t>(elem); };
    param_bits_ = static_cast<uint16_t*>(weights_.allocate_bytes(bytes(2), "bf16 weights"));
    grads_ = static_cast<float*>(grads_arena_.allocate_bytes(bytes(4), "fp32 main grads"));
    std::vector<ParamRange> ranges;
    for (const ParamSpec& p : table.params) ranges.push_back({p.offset, p.numel(), p.decay()});
    std::sort(ranges.begin(), ranges.end(),
              [](const ParamRange& a, const ParamRange& b) { return a.offset < b.offset; });
    CudaAdamWOptions adam;
    adam.offload_fraction = options.offload.fraction;
    adam.overlap = options.offload.overlap;
    optimizer_ = std::make_unique<CudaAdamW>(ranges, n_, param_bits_, grads_, ops_.stream(), adam);
    optimizer_->load_masters(
        [&](int64_t begin, int64_t count, float* dst) { params.read(begin, count, dst); });
    tensors_ = {param_views(table_, param_bits_, DType::bf16, Device::cuda),
                param_views(table_, grads_, DType::f32, Device::cuda)};
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&zero_stream_, cudaStreamNonBlocking));
    for (cudaEvent_t* e : {&grads_free_, &grads_zeroed_})
      LOOM_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  ~CudaEngine() override {
    // No throwing from a destructor: an error of the memset surfaces elsewhere. The arenas
    // that hold the grads are freed after this, once the memset is done.
    if (zero_stream_) cudaStreamSynchronize(zero_stream_);
    for (cudaEvent_t e : {grads_free_, grads_zeroed_})
      if (e) cudaEventDestroy(e);
    if (zero_stream_) cudaStreamDestroy(zero_stream_);
  }
  CudaEngine(const CudaEngine&) = delete;
  CudaEngine& operator=(const CudaEngine&) = delete;

  void zero_grads() override {
    if (++steps_begun_ == 2) ops_.profile_discard();
    pending_scale_ = 1.0f;
    // After the stream's work so far: the last step's update and copies down (offload_step
    // waited for every one of those before it returned) are the last readers of the grads.
    LOOM_CUDA_CHECK(cudaEventRecord(grads_free_, ops_.stream()));
    LOOM_CUDA_CHECK(cudaStreamWaitEvent(zero_stream_, grads_free_, 0));
    LOOM_CUDA_CHECK(cudaMemsetAsync(grads_, 0, static_cast<size_t>(n_) * 4, zero_stream_));
    LOOM_CUDA_CHECK(cudaEventRecord(grads_zeroed_, zero_stream_));
    zeroing_ = true;
  }

  double micro_batch(const MicroBatchData& batch) override {
    apply_pending_scale();  // the backward adds to the scaled grads
    activations_.release_all();
    // forward_backward's two halves, with the zeroing joined between: the forward reads no grad.
    const MicroBatch micro = micro_batch_to_device(batch, activations_, ops_.stream());
    Qwen3Model::Activations a = model_.stage_forward(tensors_, micro, Tensor{}, activations_);
    join_zeroing();
    const double nll = model_.stage_backward(tensors_, micro, a, Tensor{}, activations_, 1.0f, nullptr);
    return nll;  // stage_backward's sum waited for the stream, so the host copies are done
  }

  // Two factors are two roundings: a pending one is applied before the next is recorded.
  void scale_grads(float scale) override {
    join_zeroing();
    apply_pending_scale();
    pending_scale_ = scale;
  }
  double grad_sum_squares() override {
    join_zeroing();
    if (pending_scale_ == 1.0f) return ops_.sum_squares(grads_, n_);
    return ops_.scale_sum_squares(grads_, n_, std::exchange(pending_scale_, 1.0f));
  }

  // The update reads grad · pending_scale_; the grads in memory stay as they are, so the
  // factor stays pending for a later reader (grads_to_host, nonfinite_grad_counts) until zero_grads.
  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    join_zeroing();
    optimizer_->step(adam, lr, step, pending_scale_);
  }

  std::vector<float> master_params() override {
    std::vector<float> master(static_cast<size_t>(n_));
    optimizer_->save(master.data(), nullptr, nullptr);
    return master;
  }
  std::unique_ptr<ParamSource> master_source() override {
    return std::make_unique<MasterSource>(*optimizer_);
  }
  DType export_dtype() const override { return DType::bf16; }
  void state_to_host(TrainState& out) override {
    out.master.resize(static_cast<size_t>(n_));
    out.adam_m.resize(static_cast<size_t>(n_));
    out.adam_v.resize(static_cast<size_t>(n_));
    optimizer_->save(out.master.data(), out.adam_m.data(), out.adam_v.data());
  }
  // The split of a rebuilt master gives back the weight and remainder it came from for all
  // 2³² bit patterns (optim/precision_master.h), so a save and load round-trips bit for bit.
  void state_from_host(const TrainState& in) override {
    LOOM_ASSERT(static_cast<int64_t>(in.master.size()) == n_ &&
                    static_cast<int64_t>(in.adam_m.size()) == n_ &&
                    static_cast<int64_t>(in.adam_v.size()) == n_,
                "state of another model");
    optimizer_->load(in.master.data(), in.adam_m.data(), in.adam_v.data());
  }
  std::unique_ptr<StateSource> state_source() override {
    return std::make_unique<StateReader>(*optimizer_, n_);
  }
  void state_load(StateSource& in) override {
    LOOM_ASSERT(in.numel() == n_, "state of another model");
    const auto group = [&](StateGroup g) -> CudaRangeRead {
      return [&in, g](int64_t begin, int64_t count, float* dst) { in.read(g, begin, count, dst); };
    };
    optimizer_->load_pieces(group(StateGroup::master), group(StateGroup::adam_m), group(StateGroup::adam_v));
  }
  // On the GPU: the grads are not copied (8.1 GB at 1.7B). The pending factor is applied
  // first, as grads_to_host does, so the counts are those of the grads as scaled so far.
  std::vector<int64_t> nonfinite_grad_counts() override {
    join_zeroing();
    apply_pending_scale();
    std::vector<cuda::CountRange> ranges;
    for (const TensorRange& r : param_table_ranges(table_)) ranges.push_back({r.offset, r.numel, r.param});
    return ops_.count_nonfinite(grads_, ranges, static_cast<int>(table_.params.size()));
  }
  std::vector<float> grads_to_host() override {
    join_zeroing();
    apply_pending_scale();
    std::vector<float> grads(static_cast<size_t>(n_));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_.stream()));
    LOOM_CUDA_CHECK(cudaMemcpy(grads.data(), grads_, grads.size() * 4, cudaMemcpyDeviceToHost));
    return grads;
  }
  int64_t peak_bytes() const override { return device_arenas_peak_reserved_bytes(); }

 private:
  // The engine's stream waits for zero_grads' memset: before anything that touches the grads.
  void join_zeroing() {
    if (zeroing_) LOOM_CUDA_CHECK(cudaStreamWaitEvent(ops_.stream(), grads_zeroed_, 0));
    zeroing_ = false;
  }
  // The pass scale_grads deferred, for a reader or writer that needs the grads as they are.
  // x · 1 is x for every value, so no factor needs no pass. A factor is pending only after a
  // scale_grads, which joined the zeroing.
  void apply_pending_scale() {
    if (pending_scale_ != 1.0f) cuda::scale_inplace(grads_, n_, pending_scale_, ops_.stream());
    pending_scale_ = 1.0f;
  }

  ParamTable table_;
  int64_t n_;
  CudaOps ops_;
  DeviceArena weights_{"weights"}, grads_arena_{"main grads"}, activations_{"activations"};
  uint16_t* param_bits_ = nullptr;
  float* grads_ = nullptr;
  // The grads are grads_[i] · pending_scale_, rounded to fp32 (scale_grads' deferred factor).
  float pending_scale_ = 1.0f;
  cudaStream_t zero_stream_ = nullptr;
  cudaEvent_t grads_free_ = nullptr, grads_zeroed_ = nullptr;
  bool zeroing_ = false;  // zero_grads' memset is not joined yet
  int64_t steps_begun_ = 0;
  std::unique_ptr<CudaAdamW> optimizer_;  // after the arenas: it holds pointers into them
  Qwen3Model model_;
  ModelTensors tensors_;
};

}  // namespace

std::unique_ptr<TrainEngine> cuda_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                ParamSource& params, const EngineOptions& options) {
  return std::make_unique<CudaEngine>(config, table, params, options);
}

int cuda_visible_devices() {
  return cuda_device_count();
}

void cuda_select_device(int local_rank) {
  const int count = cuda_device_count();
  if (count == 0) throw_runtime_failure("cuda_select_device", "no CUDA device is visible");
  LOOM_CUDA_CHECK(cudaSetDevice(local_rank % count));
}

bool cuda_engine_available(std::string* why) {
  if (cuda_device_count() > 0) return true;
  if (why) *why = "no CUDA device is visible";
  return false;
}

}  // namespace loom
