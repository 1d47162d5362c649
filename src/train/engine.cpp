// The engine (engine.h): one rank of a TP × CP × PP × DP layout, on the device its parameter store
// runs on. Each rank holds its shard of the model (DecoderModel under a ModelShard, its tensors
// laid out by a local ParamTable) and, for the distributed optimizer, the masters' and Adam
// moments' slice of that shard that it owns among its DP ranks. A step:
//   1. the 1F1B schedule over this DP rank's micro-batches (pipeline_run_1f1b over the PP
//      group; with pp = 1 forward, backward, forward, ...), main grads accumulating;
//   2. the grads of replicated tensors that each rank only has part of are all-reduced:
//      over TP the q/k norms (each rank normalises its own heads) and, under sequence
//      parallel, the other norms (each rank its tokens); over the ranks sharing a KV head
//      its k/v rows when kv_heads < tp; over the embedding group the tied embedding of the
//      first and the last stage;
//   3. the reduce-scatter of the shard's fp32 grads over DP: each DP rank gets the sum for
//      its slice (Megatron's distributed optimizer); under context parallelism over dp_cp,
//      the CP ranks splitting the slices as DP ranks do;
//   4. scale, the grad norm (squares of the slice, each element of the model counted once:
//      replicas only on their first holder, summed over the world), AdamW on the slice and
//      the all-gather of the updated weights over DP.
// With one rank every group is of one rank and steps 2 and 3 and the gather are nothing.
//
// What crosses ranks goes through the `data` groups' Comms (the store's memory: host on CPU
// ranks; on GPU ranks NcclComm, whose TP collectives the CUDA store queues on its stream, or
// HostStagedComm for ranks sharing one GPU); scalars and the streamed reads of the state
// through the `host` groups. The pipeline transfers and the grad and weight collectives wait
// for the store's device work first and run synchronously: once a step, or one exchange a
// micro-batch against a layer's ten TP collectives.
#include "train/engine.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "model/decoder.h"
#include "parallel/comm_tp_collectives.h"
#include "train/engine_inspect.h"
#include "train/param_store.h"
#include "train/rank_setup.h"
#include "train/rank_shard.h"
#include "train/stage_pipeline.h"

namespace loom {
namespace {

// Fills of the slice [begin, begin + count) from a source of the full flat buffer: one rank's
// shard is the whole model, read straight through in the store's pieces; a shard of several
// ranks is read row piece by row piece (shard_read), padding past its tensors as 0.
SliceFill shard_fill(const DataParallelState& sharded, bool single_rank, ParamSource& source) {
  if (single_rank)
    return [&source](int64_t begin, int64_t count, float* dst) { source.read(begin, count, dst); };
  return [&sharded, &source](int64_t begin, int64_t count, float* dst) {
    std::fill_n(dst, count, 0.0f);
    sharded.slice_read(source, begin, count, dst);
  };
}

// The counted ranges of the slice (DataParallelState::counted_tensor_ranges) with adjacent ones
// joined: the grad norm sums each in one pass.
std::vector<std::pair<int64_t, int64_t>> joined(const std::vector<TensorRange>& ranges) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const TensorRange& r : ranges) {
    if (!out.empty() && out.back().first + out.back().second == r.offset)
      out.back().second += r.numel;
    else
      out.emplace_back(r.offset, r.numel);
  }
  return out;
}

class Engine final : public TrainEngine {
 public:
  Engine(const ModelConfig& config, const ParamTable& table, ParamSource& initial, EngineDevice device,
         const EngineOptions& options, Groups* host, Groups* data, const FrozenBase* frozen)
      : config_(config),
        timeout_(options.comm_timeout),
        single_(host ? nullptr : single_rank_groups(options.comm_timeout)),
        host_(host ? *host : single_->groups),
        data_(data ? *data : host_),
        dp_state_(config, table, options, host_, data_),
        counted_(dp_state_.counted_tensor_ranges()),
        counted_joined_(joined(counted_)),
        frozen_(frozen != nullptr),
        base_shard_(frozen ? rank_shard(config, *frozen->table, host_.layout, host_.coords, options)
                           : RankShard{}),
        store_(store_create(device, options)),
        tp_collectives_(store_->tp_collectives(*data_.tp, timeout_)),
        model_(config, frozen ? base_shard_.table : dp_state_.shard().table, store_->ops(), options.recompute,
               dp_state_.shard().model, &tp_collectives_,
               host_.layout.ep > 1 ? &store_->ep_collectives(*data_.ep, *host_.ep, timeout_) : nullptr),
        tensors_(store_->tensors()),
        cp_collectives_(host_.layout.cp > 1 ? std::make_unique<CommTpCollectives>(*data_.cp, timeout_,
                                                                                  [this] { store_->wait(); })
                                            : nullptr) {
    model_.set_linear_precision(options.linear_precision, &store_->weight_cache());
    model_.set_moe_aux_loss(options.moe_aux_loss);
    if (cp_collectives_) model_.set_context_parallel(cp_collectives_.get());
    if (options.activation_offload) {
      activation_offload_ = store_->activation_offload_create();
      model_.set_activation_offload(activation_offload_.get());
    }
    if (cp_collectives_ && options.context_comm == ContextComm::ring)
      model_.set_context_ring(host_.layout.cp, host_.coords.cp);
    if (frozen) {
      model_.set_lora(frozen->lora, dp_state_.shard().table);
      ParamSource& weights = *frozen->weights;
      store_->load_frozen([&](int64_t begin, int64_t count, float* dst) {
        if (single_rank()) return weights.read(begin, count, dst);
        std::fill_n(dst, count, 0.0f);
        shard_read(base_shard_, *frozen->table, weights, begin, count, dst);
      });
    }
    store_->load_state(shard_fill(dp_state_, single_rank(), initial), {}, {});
    weights_changed();
  }

  void zero_grads() override { store_->zero_grads(); }

  double micro_batches(std::vector<MicroBatchData> data) override {
    StagePipelineRun run = pipeline_run_of(data);
    run.before_backward = [this] { store_->grads_needed(); };
    if (config_.num_experts > 0) model_.routing_census_begin();
    const double nll = stage_pipeline_run(run, *data_.pp, timeout_);
    reduce_grads();
    return step_nll(nll);
  }

  double eval_micro_batches(std::vector<MicroBatchData> data) override {
    const StagePipelineRun run = pipeline_run_of(data);
    return step_nll(stage_pipeline_eval(run, *data_.pp, timeout_));
  }

  void scale_grads(float scale) override { store_->scale_grads(scale); }

  double grad_sum_squares() override {
    double total = store_->sum_squares(counted_joined_);
    host_.world->all_reduce_sum(&total, 1, DType::f64, timeout_);
    return total;
  }

  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    store_->optimizer_step(adam, lr, step);
    gather_weights();
    // LoRA's frozen base keeps its FP8 forms from the first step on (the adapters are bf16).
    if (!frozen_) model_.weights_changed();
  }

  void fp8_census_begin() override { model_.fp8_census_begin(); }

  // Counts summed over the world in f64 (exact below 2^53), the amax gathered; a weight's
  // counts come from DP (and CP) rank 0's (the other DP and CP ranks cast the same weights).
  Fp8Stats fp8_census_end() override {
    Fp8Stats mine = model_.fp8_census_end();
    if (host_.coords.dp != 0 || host_.coords.cp != 0)
      for (int k = 0; k < Fp8Stats::kKinds; ++k)
        if (k % 3 == Fp8Stats::weight) mine.kinds[static_cast<size_t>(k)] = {};
    if (single_rank()) return mine;
    std::vector<double> counts;
    for (const Fp8TensorStats& t : mine.kinds)
      for (int64_t c : {t.values, t.flushed, t.clamped}) counts.push_back(static_cast<double>(c));
    host_.world->all_reduce_sum(counts.data(), counts.size(), DType::f64, timeout_);
    const auto world = static_cast<size_t>(host_.world->size());
    std::vector<float> amax(world * Fp8Stats::kKinds);
    std::vector<float> own(Fp8Stats::kKinds);
    for (size_t k = 0; k < own.size(); ++k) own[k] = mine.kinds[k].amax;
    host_.world->all_gather(own.data(), amax.data(), own.size(), DType::f32, timeout_);
    Fp8Stats all;
    for (size_t k = 0; k < Fp8Stats::kKinds; ++k) {
      Fp8TensorStats& t = all.kinds[k];
      t.values = static_cast<int64_t>(counts[3 * k]);
      t.flushed = static_cast<int64_t>(counts[3 * k + 1]);
      t.clamped = static_cast<int64_t>(counts[3 * k + 2]);
      for (size_t r = 0; r < world; ++r) t.amax = std::max(t.amax, amax[r * Fp8Stats::kKinds + k]);
    }
    return all;
  }

  // Summed over the world in f64 (exact: token counts, and probability sums of a few terms
  // each); a layer's census from TP rank 0 alone (every TP rank holds the same one).
  RoutingStats routing_stats() override {
    RoutingStats mine = model_.routing_census_end();
    if (single_rank() || config_.num_experts == 0) return mine;
    std::vector<double> flat;
    for (const std::vector<double>& layer : mine.expert_tokens)
      flat.insert(flat.end(), layer.begin(), layer.end());
    flat.push_back(mine.aux_loss_sum);
    flat.push_back(static_cast<double>(mine.aux_loss_terms));
    if (host_.coords.tp != 0) std::fill(flat.begin(), flat.end(), 0.0);
    host_.world->all_reduce_sum(flat.data(), flat.size(), DType::f64, timeout_);
    size_t i = 0;
    for (std::vector<double>& layer : mine.expert_tokens)
      for (double& x : layer) x = flat[i++];
    mine.aux_loss_sum = flat[i++];
    mine.aux_loss_terms = static_cast<int64_t>(flat[i]);
    return mine;
  }

  DType export_dtype() const override { return store_->export_dtype(); }

  // One rank reads its own slice straight from the store; several stream from every rank's
  // slice to world rank 0 (DataParallelState::state_source): no rank holds the full state.
  std::unique_ptr<StateSource> state_source() override {
    if (single_rank()) return std::make_unique<StoreState>(*store_, dp_state_.full().total_numel);
    return dp_state_.state_source(slice_read());
  }
  std::unique_ptr<ParamSource> master_source() override {
    return std::make_unique<StateGroupSource>(state_source(), StateGroup::master);
  }
  void state_serve() override {
    if (!single_rank()) dp_state_.state_serve(slice_read());
  }
  bool state_gathers() const override { return !single_rank(); }

  // One rank reads its store; several gather each rank's slice into full tensors on world
  // rank 0 (point to point, a shard at a time: DataParallelState::gather_full), independently of
  // the streamed reads that checkpoints use, which tests compare with it.
  void state_to_host(TrainState& out) override {
    out.master = gathered(StateGroup::master);
    out.adam_m = gathered(StateGroup::adam_m);
    out.adam_v = gathered(StateGroup::adam_v);
  }
  void state_from_host(const TrainState& in) override {
    TrainStateView view(in);
    state_load(view);
  }
  // A resume reads this rank's slice of each group from the checkpoint, never the full
  // tensors (12 B a parameter on every rank); the rest of the weights come from the DP ranks.
  void state_load(StateSource& in) override {
    LOOM_ASSERT(in.numel() == dp_state_.full().total_numel, "state of another model");
    StateGroupSource master(in, StateGroup::master), m(in, StateGroup::adam_m), v(in, StateGroup::adam_v);
    store_->load_state(shard_fill(dp_state_, single_rank(), master), shard_fill(dp_state_, single_rank(), m),
                       shard_fill(dp_state_, single_rank(), v));
    weights_changed();
  }

  // Each rank counts its own slice where it lives (after the reduce-scatter: the step's
  // sums), then the counts are summed over the world; the grads are not copied anywhere.
  std::vector<int64_t> nonfinite_grad_counts() override {
    std::vector<int64_t> counts = store_->count_nonfinite(counted_, dp_state_.full().params.size());
    dp_state_.sum_over_world(counts);
    return counts;
  }

  int64_t peak_bytes() const override { return store_->peak_bytes(); }

  // The full tensors of one group of the state on world rank 0 (collective; empty elsewhere).
  std::vector<float> gathered(StateGroup group) {
    std::vector<float> slice(static_cast<size_t>(dp_state_.slice()));
    store_->read_state(group, 0, dp_state_.slice(), slice.data());
    if (single_rank()) return slice;
    return dp_state_.gather_full(dp_state_.gather_slices(slice.data()));
  }
  std::vector<float> grads_gathered() {
    const std::vector<float> slice = store_->grad_slice_to_host();
    if (single_rank()) return slice;
    return dp_state_.gather_full(dp_state_.gather_slices(slice.data()));
  }

 private:
  // The pipeline run of this rank's micro-batches `data` (which must outlive it).
  StagePipelineRun pipeline_run_of(std::vector<MicroBatchData>& data) {
    StagePipelineRun run;
    run.model = &model_;
    run.tensors = &tensors_;
    int64_t most = 0;
    for (const MicroBatchData& d : data) {
      run.tokens.push_back(static_cast<int64_t>(d.ids.size()));
      most = std::max(most, model_.stream_tokens(run.tokens.back()));
    }
    run.batch = [this, &data](int mb, TensorAllocator& arena) {
      return store_->micro_batch(data[static_cast<size_t>(mb)], arena);
    };
    run.activation_dtype = store_->ops().activation_dtype();
    run.hidden = config_.hidden_size;
    const bool sends_back = !host_.is_first_stage();
    run.arenas = &store_->step_arenas(
        static_cast<int>(data.size()),
        sends_back ? most * config_.hidden_size * static_cast<int64_t>(dtype_size(run.activation_dtype)) : 0);
    // A device Comm reads what a stage sends on a stream of its own: the store's work first.
    if (host_.layout.pp > 1) run.before_send = [this] { store_->wait(); };
    return run;
  }

  // Σ nll of the step from this stage's: the last stages hold it, the same on each TP rank.
  double step_nll(double stage_nll) {
    double total = host_.is_last_stage() && host_.coords.tp == 0 ? stage_nll : 0.0;
    host_.world->all_reduce_sum(&total, 1, DType::f64, timeout_);
    return total;
  }

  // The whole state of one rank, read from its store a range at a time.
  class StoreState final : public StateSource {
   public:
    StoreState(ParamStore& store, int64_t numel) : store_(store), numel_(numel) {}
    int64_t numel() const override { return numel_; }
    void read(StateGroup group, int64_t begin, int64_t count, float* dst) override {
      LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= numel_, "state range past the end");
      store_.read_state(group, begin, count, dst);
    }

   private:
    ParamStore& store_;
    int64_t numel_;
  };

  bool single_rank() const { return host_.world->size() == 1; }
  // The ranks the optimizer's slices split over: DP, times CP (dp_cp, rank_shard.h).
  int data_parallel() const { return host_.layout.dp * host_.layout.cp; }

  std::unique_ptr<ParamStore> store_create(EngineDevice device, const EngineOptions& options) const {
    ParamStoreShape shape;
    shape.table = dp_state_.shard().table;
    shape.padded = dp_state_.padded();
    const std::vector<ShardRegion>& regions = dp_state_.shard().regions;
    for (size_t r = 0; r < regions.size(); ++r)
      shape.segments.push_back(
          {dp_state_.segments()[r].begin, dp_state_.segments()[r].count, regions[r].ranks == 1});
    shape.slice = dp_state_.slice();
    shape.slice_ranges = dp_state_.slice_ranges();
    shape.stage_slots = host_.layout.pp - host_.coords.pp;
    shape.frozen = base_shard_.table;
    std::unique_ptr<ParamStore> store =
        device == EngineDevice::cpu ? cpu_param_store_create(shape) : cuda_param_store_create(shape, options);
    if (!store) throw_runtime_failure("train.device", "this loom was built without the CUDA backend");
    return store;
  }

  SliceRead slice_read() {
    return [this](StateGroup group, int64_t offset, int64_t count, float* dst) {
      store_->read_state(group, offset, count, dst);
    };
  }

  // Steps 2 and 3 of the header: the partial sums of replicated tensors, then DP (each region
  // over its group: the experts' over EDP; a group of one rank's slice is the grads already).
  void reduce_grads() {
    if (dp_state_.shard().partials.empty() && data_parallel() == 1) return;
    store_->grads_needed();
    store_->wait();
    for (const PartialGrad& p : dp_state_.shard().partials)
      dp_state_.partial_comm(p.group).all_reduce_sum(store_->grads() + p.offset, static_cast<size_t>(p.numel),
                                                     DType::f32, timeout_);
    const std::vector<ShardRegion>& regions = dp_state_.shard().regions;
    for (size_t r = 0; r < regions.size(); ++r)
      if (regions[r].ranks > 1)
        dp_state_.region_comm(regions[r])
            .reduce_scatter_sum(store_->grads() + regions[r].begin, store_->segment_grads(r),
                                static_cast<size_t>(regions[r].chunk()), DType::f32, timeout_);
  }

  // After the slice's weights changed: every DP rank's slice into the whole shard, and the
  // model's forms of them (FP8) made again when next used.
  void weights_changed() {
    gather_weights();
    model_.weights_changed();
  }

  // Every DP rank's slice of the weights into the whole shard, in place (each region over its
  // group).
  void gather_weights() {
    if (data_parallel() == 1) return;
    store_->wait();
    const auto bytes = static_cast<int64_t>(dtype_size(store_->weight_dtype()));
    auto* weights = static_cast<uint8_t*>(store_->weights());
    const std::vector<ShardRegion>& regions = dp_state_.shard().regions;
    for (size_t r = 0; r < regions.size(); ++r)
      dp_state_.region_comm(regions[r])
          .all_gather(weights + dp_state_.segments()[r].begin * bytes, weights + regions[r].begin * bytes,
                      static_cast<size_t>(regions[r].chunk()), store_->weight_dtype(), timeout_);
  }

  ModelConfig config_;
  CommTimeout timeout_;
  std::unique_ptr<SingleRankGroups> single_;  // when made without groups
  Groups& host_;
  Groups& data_;
  DataParallelState dp_state_;
  std::vector<TensorRange> counted_;  // of the slice: what this rank counts of the model
  std::vector<std::pair<int64_t, int64_t>> counted_joined_;
  bool frozen_;           // LoRA: a frozen base beside the trained adapters
  RankShard base_shard_;  // LoRA's frozen base; empty otherwise
  std::unique_ptr<ParamStore> store_;
  TpCollectives& tp_collectives_;  // the store's
  DecoderModel model_;
  std::unique_ptr<ActivationOffload> activation_offload_;  // layout.activation_offload
  ModelTensors tensors_;
  std::unique_ptr<CommTpCollectives> cp_collectives_;  // the model's CP hook, with cp > 1
};

}  // namespace

std::unique_ptr<TrainEngine> engine_create(const ModelConfig& config, const ParamTable& table,
                                           ParamSource& initial, EngineDevice device,
                                           const EngineOptions& options, Groups* host, Groups* data,
                                           const FrozenBase* frozen) {
  return std::make_unique<Engine>(config, table, initial, device, options, host, data, frozen);
}

std::vector<float> engine_masters(TrainEngine& engine) {
  return dynamic_cast<Engine&>(engine).gathered(StateGroup::master);
}

std::vector<float> engine_grads(TrainEngine& engine) {
  return dynamic_cast<Engine&>(engine).grads_gathered();
}

}  // namespace loom
