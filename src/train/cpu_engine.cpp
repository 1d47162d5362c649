// The fp32 CPU engine: the reference trainer's state in host memory.
#include <algorithm>
#include <cstring>

#include "core/allocator.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/qwen3.h"
#include "ops/cpu/cpu_ops.h"
#include "optim/grad_clip.h"
#include "train/engine.h"

namespace loom {
namespace {

std::vector<ParamRange> optimizer_ranges(const ParamTable& table) {
  std::vector<ParamRange> ranges;
  for (const ParamSpec& p : table.params) ranges.push_back({p.offset, p.numel(), p.decay()});
  return ranges;
}

class CpuEngine final : public TrainEngine {
 public:
  CpuEngine(const Qwen3Config& config, const ParamTable& table, std::vector<float> params,
            const EngineOptions& options)
      : table_(table),
        ranges_(optimizer_ranges(table)),
        params_(std::move(params)),
        grads_(params_.size()),
        adam_m_(params_.size()),
        adam_v_(params_.size()),
        model_(config, table_, ops_, options.recompute),
        tensors_{param_views(table_, params_.data()), param_views(table_, grads_.data())} {}

  void zero_grads() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }
  double micro_batch(const MicroBatchData& batch) override {
    MicroBatchData copy = batch;
    const double nll = model_.forward_backward(tensors_, copy.view(), scratch_, 1.0f);
    scratch_.release_all();
    return nll;
  }
  void scale_grads(float scale) override {
    grad_scale(grads_.data(), static_cast<int64_t>(grads_.size()), scale);
  }
  double grad_sum_squares() override {
    return loom::grad_sum_squares(grads_.data(), static_cast<int64_t>(grads_.size()));
  }
  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    adamw_step(adam, lr, step, ranges_, params_.data(), grads_.data(), adam_m_.data(), adam_v_.data());
  }
  std::vector<float> master_params() override { return params_; }
  DType export_dtype() const override { return DType::f32; }
  void state_save(const std::string& path) override {
    const Shape shape{static_cast<int64_t>(params_.size())};
    safetensors_write(path,
                      {{"master", DType::f32, shape, params_.data(), DType::f32},
                       {"adam_m", DType::f32, shape, adam_m_.data(), DType::f32},
                       {"adam_v", DType::f32, shape, adam_v_.data(), DType::f32}},
                      {{"engine", "cpu"}});
  }
  void state_load(const std::string& path) override {
    SafetensorsFile file = SafetensorsFile::open(path);
    state_read(file, "master", DType::f32, params_.data(), params_.size());
    state_read(file, "adam_m", DType::f32, adam_m_.data(), adam_m_.size());
    state_read(file, "adam_v", DType::f32, adam_v_.data(), adam_v_.size());
  }
  int64_t peak_bytes() const override {
    return static_cast<int64_t>(4 * params_.size() * sizeof(float)) + scratch_.peak_bytes();
  }

 private:
  ParamTable table_;
  std::vector<ParamRange> ranges_;
  std::vector<float> params_, grads_, adam_m_, adam_v_;
  CpuOps ops_;
  Qwen3Model model_;
  ModelTensors tensors_;
  HostArena scratch_;
};

}  // namespace

std::unique_ptr<TrainEngine> cpu_engine_create(const Qwen3Config& config, const ParamTable& table,
                                               std::vector<float> params, const EngineOptions& options) {
  return std::make_unique<CpuEngine>(config, table, std::move(params), options);
}

}  // namespace loom

namespace loom {

void state_read(const SafetensorsFile& file, const std::string& name, DType dtype, void* out, size_t count) {
  const SafetensorsEntry* entry = file.find(name);
  if (!entry)
    throw_input_error(file.path(), "the checkpoint state has no tensor \"" + name +
                                       "\" (a checkpoint of another "
                                       "engine or loom version?)");
  if (entry->dtype != dtype || entry->numel() != static_cast<int64_t>(count))
    throw_input_error(file.path(), "tensor \"" + name + "\" is " + dtype_name(entry->dtype) + " " +
                                       entry->shape_str() + ", expected " + dtype_name(dtype) + " [" +
                                       std::to_string(count) + "] (a checkpoint of another model?)");
  std::memcpy(out, file.bytes(*entry), count * dtype_size(dtype));
}

}  // namespace loom
