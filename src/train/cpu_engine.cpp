// The fp32 CPU engine: the reference trainer's state in host memory.
#include <algorithm>

#include "core/allocator.h"
#include "core/error.h"
#include "model/qwen3.h"
#include "ops/cpu/cpu_ops.h"
#include "optim/grad_clip.h"
#include "train/engine.h"
#include "train/nonfinite.h"

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
  void state_to_host(TrainState& out) override {
    out.master = params_;
    out.adam_m = adam_m_;
    out.adam_v = adam_v_;
  }
  // Copies into the buffers in place: the model's tensor views point into params_.
  void state_from_host(const TrainState& in) override {
    LOOM_ASSERT(in.master.size() == params_.size(), "state of another model");
    std::copy(in.master.begin(), in.master.end(), params_.begin());
    std::copy(in.adam_m.begin(), in.adam_m.end(), adam_m_.begin());
    std::copy(in.adam_v.begin(), in.adam_v.end(), adam_v_.begin());
  }
  // Ranges straight from and into the engine's own arrays: no copy of the state beside them.
  std::unique_ptr<StateSource> state_source() override { return std::make_unique<Source>(*this); }
  void state_load(StateSource& in) override {
    LOOM_ASSERT(in.numel() == static_cast<int64_t>(params_.size()), "state of another model");
    for (StateGroup group : {StateGroup::master, StateGroup::adam_m, StateGroup::adam_v})
      in.read(group, 0, in.numel(), group_data(group));
  }
  std::vector<int64_t> nonfinite_grad_counts() override {
    std::vector<int64_t> counts(table_.params.size());
    nonfinite_count(grads_.data(), param_table_ranges(table_), counts.data());
    return counts;
  }
  std::vector<float> grads_to_host() override { return grads_; }
  int64_t peak_bytes() const override {
    return static_cast<int64_t>(4 * params_.size() * sizeof(float)) + scratch_.peak_bytes();
  }

 private:
  class Source final : public StateSource {
   public:
    explicit Source(CpuEngine& engine) : engine_(engine) {}
    int64_t numel() const override { return static_cast<int64_t>(engine_.params_.size()); }
    void read(StateGroup group, int64_t begin, int64_t count, float* dst) override {
      LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= numel(), "state range past the end");
      std::copy_n(engine_.group_data(group) + begin, count, dst);
    }

   private:
    CpuEngine& engine_;
  };

  float* group_data(StateGroup group) {
    return group == StateGroup::master   ? params_.data()
           : group == StateGroup::adam_m ? adam_m_.data()
                                         : adam_v_.data();
  }

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
