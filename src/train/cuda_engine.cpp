// The CUDA engine: one GPU, bf16 weights with int16 remainders (the precision-aware
// master of SEMANTICS.md: master = bf16 high half + remainder low half, bit for bit), fp32
// main grads and Adam moments, activations in their own arena.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "io/safetensors.h"
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
    std::vector<uint16_t> bits(static_cast<size_t>(n_));
    std::vector<int16_t> rem(static_cast<size_t>(n_));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_.stream()));
    LOOM_CUDA_CHECK(cudaMemcpy(bits.data(), param_bits_, bits.size() * 2, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(rem.data(), remainders_, rem.size() * 2, cudaMemcpyDeviceToHost));
    std::vector<float> master(static_cast<size_t>(n_));
    master_rebuild_array(bits.data(), rem.data(), n_, master.data());
    return master;
  }
  DType export_dtype() const override { return DType::bf16; }
  void state_save(const std::string& path) override {
    std::vector<uint16_t> bits(static_cast<size_t>(n_));
    std::vector<int16_t> rem(static_cast<size_t>(n_));
    std::vector<float> m(static_cast<size_t>(n_)), v(static_cast<size_t>(n_));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_.stream()));
    LOOM_CUDA_CHECK(cudaMemcpy(bits.data(), param_bits_, bits.size() * 2, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(rem.data(), remainders_, rem.size() * 2, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(m.data(), adam_m_, m.size() * 4, cudaMemcpyDeviceToHost));
    LOOM_CUDA_CHECK(cudaMemcpy(v.data(), adam_v_, v.size() * 4, cudaMemcpyDeviceToHost));
    const Shape shape{n_};
    safetensors_write(path,
                      {{"adam_m", DType::f32, shape, m.data(), DType::f32},
                       {"adam_v", DType::f32, shape, v.data(), DType::f32},
                       {"param_bf16", DType::bf16, shape, bits.data(), DType::bf16},
                       {"param_remainder", DType::i16, shape, rem.data(), DType::i16}},
                      {{"engine", "cuda"}});
  }
  void state_load(const std::string& path) override {
    SafetensorsFile file = SafetensorsFile::open(path);
    std::vector<uint16_t> bits(static_cast<size_t>(n_));
    std::vector<int16_t> rem(static_cast<size_t>(n_));
    std::vector<float> m(static_cast<size_t>(n_)), v(static_cast<size_t>(n_));
    state_read(file, "param_bf16", DType::bf16, bits.data(), bits.size());
    state_read(file, "param_remainder", DType::i16, rem.data(), rem.size());
    state_read(file, "adam_m", DType::f32, m.data(), m.size());
    state_read(file, "adam_v", DType::f32, v.data(), v.size());
    LOOM_CUDA_CHECK(cudaMemcpy(param_bits_, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(remainders_, rem.data(), rem.size() * 2, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(adam_m_, m.data(), m.size() * 4, cudaMemcpyHostToDevice));
    LOOM_CUDA_CHECK(cudaMemcpy(adam_v_, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  }
  int64_t peak_bytes() const override { return device_arenas_peak_reserved_bytes(); }

 private:
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
