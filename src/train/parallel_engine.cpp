// The parallel CPU engine: one rank of a TP × PP × DP layout (docs/parallel.md), fp32.
//
// Each rank holds its shard of the model (Qwen3Model under a ModelShard, its tensors laid
// out by a local ParamTable) and, for the distributed optimizer, the masters' and Adam
// moments' slice of that shard that it owns among its DP ranks. A step:
//   1. the 1F1B schedule over this DP rank's micro-batches (pipeline_run_1f1b over the PP
//      group; with pp = 1 forward, backward, forward, ...), main grads accumulating;
//   2. the grads of replicated tensors that each rank only has part of are all-reduced:
//      over TP the q/k norms (each rank normalises its own heads) and, under sequence
//      parallel, the other norms (each rank its tokens); over the ranks sharing a KV head
//      its k/v rows when kv_heads < tp; over the embedding group the tied embedding of the
//      first and the last stage;
//   3. fp32 reduce-scatter of the shard's grads over DP: each DP rank gets the sum for its
//      slice (Megatron's distributed optimizer);
//   4. scale, the grad norm (squares of the slice, each element of the model counted once:
//      replicas only on their first holder, summed over the world), AdamW on the slice (the
//      same adamw_step as CpuEngine) and the all-gather of the updated weights over DP.
#include <algorithm>
#include <memory>

#include "core/allocator.h"
#include "core/error.h"
#include "model/qwen3.h"
#include "ops/cpu/cpu_ops.h"
#include "optim/grad_clip.h"
#include "parallel/comm_tp_collectives.h"
#include "train/engine.h"
#include "train/nonfinite.h"
#include "train/rank_shard.h"
#include "train/stage_pipeline.h"

namespace loom {
namespace {

// Each micro-batch's activations in a host arena of its own, freed once its input gradient
// has been sent.
class HostMicroBatchArenas final : public MicroBatchArenas {
 public:
  explicit HostMicroBatchArenas(int count) : arenas_(static_cast<size_t>(count)) {}
  TensorAllocator& of(int mb) override {
    std::unique_ptr<HostArena>& a = arenas_[static_cast<size_t>(mb)];
    if (!a) a = std::make_unique<HostArena>();
    track_peak();
    return *a;
  }
  void release(int mb) override {
    track_peak();
    arenas_[static_cast<size_t>(mb)].reset();
  }
  // The most bytes the live arenas held together (each one's own peak counted with the
  // others' current use; an upper bound as good as the arenas report).
  int64_t peak() const { return peak_; }

 private:
  void track_peak() {
    int64_t in_use = 0;
    for (const auto& a : arenas_)
      if (a) in_use += a->bytes_in_use();
    for (const auto& a : arenas_)
      if (a) peak_ = std::max(peak_, in_use - a->bytes_in_use() + a->peak_bytes());
  }
  std::vector<std::unique_ptr<HostArena>> arenas_;
  int64_t peak_ = 0;
};

class ParallelCpuEngine final : public TrainEngine {
 public:
  ParallelCpuEngine(const Qwen3Config& config, const ParamTable& table, const std::vector<float>& params,
                    const EngineOptions& options, Groups& groups)
      : config_(config),
        timeout_(options.comm_timeout),
        groups_(groups),
        sharded_(config, table, options, groups, groups),
        params_(static_cast<size_t>(sharded_.padded())),
        grads_(params_.size()),
        grad_slice_(static_cast<size_t>(sharded_.slice())),
        adam_m_(grad_slice_.size()),
        adam_v_(grad_slice_.size()),
        ranges_(sharded_.slice_ranges()),
        tp_collectives_(*groups.tp, timeout_),
        model_(config, sharded_.shard().table, ops_, options.recompute, sharded_.shard().model,
               &tp_collectives_),
        tensors_{param_views(sharded_.shard().table, params_.data()),
                 param_views(sharded_.shard().table, grads_.data())} {
    LOOM_ASSERT(static_cast<int64_t>(params.size()) == table.total_numel, "initial weights of another model");
    full_to_local(sharded_.shard(), table, params.data(), params_.data());
  }

  void zero_grads() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }

  double micro_batch(const MicroBatchData&) override {
    LOOM_ASSERT(false, "the parallel engine runs a step's micro-batches together (micro_batches)");
    return 0;
  }

  double micro_batches(const std::vector<MicroBatchData>& batches) override {
    std::vector<MicroBatchData> data = batches;
    HostMicroBatchArenas arenas(static_cast<int>(data.size()));
    StagePipelineRun run;
    run.model = &model_;
    run.tensors = &tensors_;
    for (const MicroBatchData& d : data) run.tokens.push_back(static_cast<int64_t>(d.ids.size()));
    run.batch = [&](int mb, TensorAllocator&) { return data[static_cast<size_t>(mb)].view(); };
    run.arenas = &arenas;
    run.activation_dtype = DType::f32;
    run.hidden = config_.hidden_size;
    const double nll = stage_pipeline_run(run, *groups_.pp, timeout_);
    activation_peak_ = std::max(activation_peak_, arenas.peak());
    reduce_grads();
    // Σ nll of the step: the last stages hold it, the same on each TP rank.
    double total = groups_.is_last_stage() && groups_.coords.tp == 0 ? nll : 0.0;
    groups_.world->all_reduce_sum(&total, 1, DType::f64, timeout_);
    return total;
  }

  void scale_grads(float scale) override {
    grad_scale(grad_slice_.data(), static_cast<int64_t>(grad_slice_.size()), scale);
  }

  double grad_sum_squares() override {
    return sharded_.counted_sum([&](int64_t offset, int64_t count) {
      return loom::grad_sum_squares(grad_slice_.data() + offset, count);
    });
  }

  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    float* slice = params_.data() + sharded_.slice_begin();
    adamw_step(adam, lr, step, ranges_, slice, grad_slice_.data(), adam_m_.data(), adam_v_.data());
    groups_.dp->all_gather(slice, params_.data(), static_cast<size_t>(sharded_.slice()), DType::f32,
                           timeout_);
  }

  std::vector<float> master_params() override { return sharded_.gather_full(params_); }
  DType export_dtype() const override { return DType::f32; }

  void state_to_host(TrainState& out) override {
    out.master = sharded_.gather_full(params_);
    out.adam_m = sharded_.gather_full(sharded_.gather_slices(adam_m_.data()));
    out.adam_v = sharded_.gather_full(sharded_.gather_slices(adam_v_.data()));
  }

  // Checkpoints and final/ stream from every rank's slice to world rank 0 (rank_shard.h
  // ShardedModel::state_source): no rank holds the full state.
  std::unique_ptr<StateSource> state_source() override { return sharded_.state_source(slice_read()); }
  std::unique_ptr<ParamSource> master_source() override { return sharded_.master_source(slice_read()); }
  void state_serve() override { sharded_.state_serve(slice_read()); }
  bool state_gathers() const override { return true; }

  // The model's tensor views point into params_, so in place.
  void state_from_host(const TrainState& in) override {
    TrainStateView view(in);
    state_load(view);
  }

  // A resume reads this rank's shard of the masters and its slice of the moments from the
  // checkpoint, never the full tensors (12 B a parameter on every rank).
  void state_load(StateSource& in) override {
    LOOM_ASSERT(in.numel() == sharded_.full().total_numel, "state of another model");
    sharded_.read_state(in, StateGroup::master, 0, sharded_.padded(), params_.data());
    sharded_.read_state(in, StateGroup::adam_m, sharded_.slice_begin(), sharded_.slice(), adam_m_.data());
    sharded_.read_state(in, StateGroup::adam_v, sharded_.slice_begin(), sharded_.slice(), adam_v_.data());
  }

  // Each rank counts its own slice (after the reduce-scatter: the step's sums), then the
  // counts are summed over the world; the grads stay where they are.
  std::vector<int64_t> nonfinite_grad_counts() override {
    std::vector<int64_t> counts(sharded_.full().params.size());
    nonfinite_count(grad_slice_.data(), sharded_.counted_tensor_ranges(), counts.data());
    sharded_.sum_over_world(counts);
    return counts;
  }

  std::vector<float> grads_to_host() override {
    return sharded_.gather_full(sharded_.gather_slices(grad_slice_.data()));
  }

  int64_t peak_bytes() const override {
    return static_cast<int64_t>((2 * params_.size() + 3 * grad_slice_.size()) * sizeof(float)) +
           activation_peak_;
  }

 private:
  // This DP rank's slice of the state: the masters of every DP rank are in params_ (all-gathered
  // after each step), a streamed read takes each element from the rank whose slice holds it.
  SliceRead slice_read() {
    return [this](StateGroup group, int64_t offset, int64_t count, float* dst) {
      const float* slice = group == StateGroup::master   ? params_.data() + sharded_.slice_begin()
                           : group == StateGroup::adam_m ? adam_m_.data()
                                                         : adam_v_.data();
      std::copy_n(slice + offset, count, dst);
    };
  }

  // Steps 2 and 3 of the header: the partial sums of replicated tensors, then DP.
  void reduce_grads() {
    for (const PartialGrad& p : sharded_.shard().partials)
      sharded_.partial_comm(p.group).all_reduce_sum(grads_.data() + p.offset, static_cast<size_t>(p.numel),
                                                    DType::f32, timeout_);
    groups_.dp->reduce_scatter_sum(grads_.data(), grad_slice_.data(), static_cast<size_t>(sharded_.slice()),
                                   DType::f32, timeout_);
  }

  Qwen3Config config_;
  CommTimeout timeout_;
  Groups& groups_;
  ShardedModel sharded_;
  std::vector<float> params_, grads_, grad_slice_, adam_m_, adam_v_;
  std::vector<ParamRange> ranges_;
  CpuOps ops_;
  CommTpCollectives tp_collectives_;
  Qwen3Model model_;
  ModelTensors tensors_;
  int64_t activation_peak_ = 0;
};

}  // namespace

std::unique_ptr<TrainEngine> parallel_cpu_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                        const std::vector<float>& params,
                                                        const EngineOptions& options, Groups& groups) {
  return std::make_unique<ParallelCpuEngine>(config, table, params, options, groups);
}

}  // namespace loom
