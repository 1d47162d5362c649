// The CUDA engine: one GPU, bf16 weights with int16 remainders (the precision-aware
// master of SEMANTICS.md: master = bf16 high half + remainder low half, bit for bit), fp32
// main grads and Adam moments, activations in their own arena.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "model/qwen3.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/kernels.h"
#include "optim/precision_master.h"
#include "train/engine.h"

namespace loom {
namespace {

// Elements per Adam chunk: one block each; 64K elements keep a block busy for ~10 µs.
constexpr int64_t kAdamChunk = 1 << 16;

std::vector<Tensor> device_views(const ParamTable& table, void* flat, DType dtype) {
  std::vector<Tensor> views;
  auto* base = static_cast<uint8_t*>(flat);
  for (const ParamSpec& p : table.params)
    views.push_back(
        Tensor{base + p.offset * static_cast<int64_t>(dtype_size(dtype)), p.shape, dtype, Device::cuda});
  return views;
}

class CudaEngine final : public TrainEngine {
 public:
  CudaEngine(const Qwen3Config& config, const ParamTable& table, const std::vector<float>& params,
             const EngineOptions& options)
      : table_(table), n_(table.total_numel), model_(config, table_, ops_, options.recompute) {
    const auto bytes = [&](size_t elem) { return n_ * static_cast<int64_t>(elem); };
    param_bits_ = static_cast<uint16_t*>(weights_.allocate_bytes(bytes(2), "bf16 weights"));
    remainders_ = static_cast<int16_t*>(optimizer_.allocate_bytes(bytes(2), "master remainders"));
    grads_ = static_cast<float*>(grads_arena_.allocate_bytes(bytes(4), "fp32 main grads"));
    adam_m_ = static_cast<float*>(optimizer_.allocate_bytes(bytes(4), "Adam first moment"));
    adam_v_ = static_cast<float*>(optimizer_.allocate_bytes(bytes(4), "Adam second moment"));
    std::vector<uint16_t> bits(params.size());
    std::vector<int16_t> rem(params.size());
    master_split_array(params.data(), n_, bits.data(), rem.data());
    LOOM_CUDA_CHECK(cudaMemcpy(param_bits_, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(remainders_, rem.data(), rem.size() * 2, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemset(adam_m_, 0, static_cast<size_t>(bytes(4))));
    LOOM_CUDA_CHECK(cudaMemset(adam_v_, 0, static_cast<size_t>(bytes(4))));

    std::vector<cuda::AdamChunk> chunks;
    for (const ParamSpec& p : table.params)
      for (int64_t begin = 0; begin < p.numel(); begin += kAdamChunk)
        chunks.push_back({p.offset + begin, std::min(kAdamChunk, p.numel() - begin), p.decay() ? 1 : 0});
    chunk_count_ = static_cast<int64_t>(chunks.size());
    chunks_ = static_cast<cuda::AdamChunk*>(optimizer_.allocate_bytes(
        chunk_count_ * static_cast<int64_t>(sizeof(cuda::AdamChunk)), "Adam chunk table"));
    LOOM_CUDA_CHECK(
        cudaMemcpy(chunks_, chunks.data(), chunks.size() * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
    tensors_ = {device_views(table_, param_bits_, DType::bf16), device_views(table_, grads_, DType::f32)};
  }

  void zero_grads() override {
    LOOM_CUDA_CHECK(cudaMemsetAsync(grads_, 0, static_cast<size_t>(n_) * 4, ops_.stream()));
  }

  double micro_batch(const MicroBatchData& batch) override {
    const int64_t t = static_cast<int64_t>(batch.ids.size());
    activations_.release_all();
    Tensor ids = activations_.allocate({t}, DType::i32, "token ids");
    Tensor targets = activations_.allocate({t}, DType::i32, "targets");
    LOOM_CUDA_CHECK(cudaMemcpyAsync(ids.data, batch.ids.data(), static_cast<size_t>(t) * 4,
                                    cudaMemcpyHostToDevice, ops_.stream()));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(targets.data, batch.targets.data(), static_cast<size_t>(t) * 4,
                                    cudaMemcpyHostToDevice, ops_.stream()));
    const double nll =
        model_.forward_backward(tensors_, MicroBatch{ids, targets, batch.rows}, activations_, 1.0f);
    return nll;  // forward_backward's sum waited for the stream, so the host copies are done
  }

  void scale_grads(float scale) override { cuda::scale_inplace(grads_, n_, scale, ops_.stream()); }
  double grad_sum_squares() override { return ops_.sum_squares(grads_, n_); }

  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    const cuda::AdamScalars s{adam.beta1,
                              1.0f - adam.beta1,
                              adam.beta2,
                              1.0f - adam.beta2,
                              adamw_bias_correction(adam.beta1, step),
                              adamw_bias_correction(adam.beta2, step),
                              adam.eps,
                              lr,
                              adam.weight_decay};
    cuda::adamw_bf16_remainder(param_bits_, remainders_, grads_, adam_m_, adam_v_, chunks_, chunk_count_, s,
                               ops_.stream());
  }

  std::vector<float> master_params() override {
    std::vector<float> master(static_cast<size_t>(n_));
    masters_to_host(master.data());
    return master;
  }
  DType export_dtype() const override { return DType::bf16; }
  void state_to_host(TrainState& out) override {
    out.master.resize(static_cast<size_t>(n_));
    out.adam_m.resize(static_cast<size_t>(n_));
    out.adam_v.resize(static_cast<size_t>(n_));
    masters_to_host(out.master.data());
    LOOM_CUDA_CHECK(cudaMemcpy(out.adam_m.data(), adam_m_, out.adam_m.size() * 4, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(out.adam_v.data(), adam_v_, out.adam_v.size() * 4, cudaMemcpyDeviceToHost));
  }
  // The split of a rebuilt master gives back the weight and remainder it came from for all
  // 2³² bit patterns (optim/precision_master.h), so a save and load round-trips bit for bit.
  void state_from_host(const TrainState& in) override {
    LOOM_ASSERT(static_cast<int64_t>(in.master.size()) == n_, "state of another model");
    std::vector<uint16_t> bits(static_cast<size_t>(n_));
    std::vector<int16_t> rem(static_cast<size_t>(n_));
    master_split_array(in.master.data(), n_, bits.data(), rem.data());
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_.stream()));
    LOOM_CUDA_CHECK(cudaMemcpy(param_bits_, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(remainders_, rem.data(), rem.size() * 2, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(adam_m_, in.adam_m.data(), in.adam_m.size() * 4, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(adam_v_, in.adam_v.data(), in.adam_v.size() * 4, cudaMemcpyHostToDevice));
  }
  std::vector<float> grads_to_host() override {
    std::vector<float> grads(static_cast<size_t>(n_));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_.stream()));
    LOOM_CUDA_CHECK(cudaMemcpy(grads.data(), grads_, grads.size() * 4, cudaMemcpyDeviceToHost));
    return grads;
  }
  int64_t peak_bytes() const override { return device_arenas_peak_reserved_bytes(); }

 private:
  // fp32 masters rebuilt from the bf16 weights and int16 remainders, after the stream's work.
  void masters_to_host(float* master) {
    std::vector<uint16_t> bits(static_cast<size_t>(n_));
    std::vector<int16_t> rem(static_cast<size_t>(n_));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_.stream()));
    LOOM_CUDA_CHECK(cudaMemcpy(bits.data(), param_bits_, bits.size() * 2, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(rem.data(), remainders_, rem.size() * 2, cudaMemcpyDeviceToHost));
    master_rebuild_array(bits.data(), rem.data(), n_, master);
  }

  ParamTable table_;
  int64_t n_;
  CudaOps ops_;
  DeviceArena weights_{"weights"}, grads_arena_{"main grads"}, optimizer_{"optimizer state"},
      activations_{"activations"};
  uint16_t* param_bits_ = nullptr;
  int16_t* remainders_ = nullptr;
  float *grads_ = nullptr, *adam_m_ = nullptr, *adam_v_ = nullptr;
  cuda::AdamChunk* chunks_ = nullptr;
  int64_t chunk_count_ = 0;
  Qwen3Model model_;
  ModelTensors tensors_;
};

}  // namespace

std::unique_ptr<TrainEngine> cuda_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                const std::vector<float>& params,
                                                const EngineOptions& options) {
  return std::make_unique<CudaEngine>(config, table, params, options);
}

bool cuda_engine_available(std::string* why) {
  if (cuda_device_count() > 0) return true;
  if (why) *why = "no CUDA device is visible";
  return false;
}

}  // namespace loom
