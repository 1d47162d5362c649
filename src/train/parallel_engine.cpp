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
#include <cstring>
#include <deque>

#include "core/allocator.h"
#include "core/error.h"
#include "model/qwen3.h"
#include "ops/cpu/cpu_ops.h"
#include "optim/grad_clip.h"
#include "parallel/pipeline.h"
#include "train/engine.h"

namespace loom {
namespace {

// Rows [row, row + rows) of a full tensor, one piece of a local one.
struct RowBlock {
  int64_t row = 0;
  int64_t rows = 0;
};

// Where a local tensor comes from: its row blocks of the full tensor, laid end to end,
// each over the columns [col, col + cols) (1-D tensors: rows of one column).
struct SliceMap {
  int full = 0;  // index into the full table
  std::vector<RowBlock> blocks;
  int64_t col = 0;
  int64_t cols = 0;
};

// A part of a local tensor's grad that is a partial sum, all-reduced over `group`.
enum class Reduce : uint8_t { tp, kv, embedding };
struct PartialGrad {
  Reduce group;
  int64_t offset = 0;  // in the local flat buffer
  int64_t numel = 0;
};

// One rank's shard of the model: what it runs, what it holds and how that maps onto the
// full tensors.
struct RankShard {
  ModelShard model;
  ParamTable table;              // local shapes, the full table's kinds and layers
  std::vector<SliceMap> slices;  // per local tensor
  std::vector<PartialGrad> partials;
  // Local ranges counted once in the model: the grad norm sums these; replicas of a tensor
  // held by several ranks are counted on one of them.
  std::vector<std::pair<int64_t, int64_t>> counted;
};

int64_t cols_of(const Shape& s) {
  return s.ndim == 1 ? 1 : s[1];
}

// The PP stage's layers [begin, end) of `layers`: layer_split or an even split.
std::pair<int64_t, int64_t> stage_layers(int64_t layers, int pp, int stage,
                                         const std::vector<int64_t>& split) {
  if (split.empty()) return {layers / pp * stage, layers / pp * (stage + 1)};
  int64_t begin = 0;
  for (int s = 0; s < stage; ++s) begin += split[static_cast<size_t>(s)];
  return {begin, begin + split[static_cast<size_t>(stage)]};
}

// What the shards need of the layout (recipe_load's layout_check makes the same checks).
void check_layout(const Qwen3Config& c, const ParallelLayout& layout, const EngineOptions& options) {
  const int64_t tp = layout.tp, kv = c.num_key_value_heads;
  if (c.num_attention_heads % tp != 0 || (kv % tp != 0 && tp % kv != 0) || c.intermediate_size % tp != 0 ||
      c.vocab_size % tp != 0)
    throw_input_error(
        "layout.tp",
        std::to_string(tp) + " does not split the heads, the KV heads, the FFN and the vocabulary evenly");
  if (layout.cp != 1) throw_input_error("layout.cp", "context parallel is not implemented (expected 1)");
  int64_t layers = 0;
  for (int64_t n : options.layer_split) layers += n;
  if (options.layer_split.empty()
          ? c.num_hidden_layers % layout.pp != 0
          : static_cast<int>(options.layer_split.size()) != layout.pp || layers != c.num_hidden_layers ||
                *std::min_element(options.layer_split.begin(), options.layer_split.end()) < 1)
    throw_input_error("layout.layer_split", "does not split the " + std::to_string(c.num_hidden_layers) +
                                                " layers into " + std::to_string(layout.pp) + " stages");
}

RankShard rank_shard(const Qwen3Config& c, const ParamTable& full, const ParallelLayout& layout,
                     const RankCoords& at, const EngineOptions& options) {
  check_layout(c, layout, options);
  const int64_t tp = layout.tp, r = at.tp, hd = c.head_dim;
  RankShard shard;
  ModelShard& m = shard.model;
  m.tp = tp;
  m.tp_rank = r;
  m.sequence_parallel = options.sequence_parallel && tp > 1;
  std::tie(m.layer_begin, m.layer_end) =
      stage_layers(c.num_hidden_layers, layout.pp, at.pp, options.layer_split);
  m.first_stage = at.pp == 0;
  m.last_stage = at.pp == layout.pp - 1;
  const HeadLayout heads = shard_heads(c, m);
  const int64_t q_rows = heads.q_heads * hd, kv_rows = heads.kv_heads * hd;
  const bool kv_replicated = c.num_key_value_heads < tp;
  // The KV heads of this rank: its own when split; when replicated, the one its q heads
  // use, shared by tp / kv_heads consecutive ranks.
  const int64_t kv_first = kv_replicated ? r / (tp / c.num_key_value_heads) : r * heads.kv_heads;
  const bool kv_holder = !kv_replicated || r % (tp / c.num_key_value_heads) == 0;
  const int64_t vocab = c.vocab_size / tp, ffn = c.intermediate_size / tp;
  const bool tied_copy = c.tie_word_embeddings && layout.pp > 1;

  auto add = [&](int full_index, std::vector<RowBlock> blocks, int64_t col, int64_t cols, bool replicated) {
    const ParamSpec& f = full.params[static_cast<size_t>(full_index)];
    int64_t rows = 0;
    for (const RowBlock& b : blocks) rows += b.rows;
    const Shape shape = f.shape.ndim == 1 ? Shape{rows} : Shape{rows, cols};
    const int64_t offset = shard.table.total_numel;
    shard.table.params.push_back({f.name, f.kind, f.layer, shape, offset});
    shard.table.total_numel += shape.numel();
    shard.slices.push_back({full_index, std::move(blocks), col, cols});
    if (!replicated || r == 0) shard.counted.emplace_back(offset, shape.numel());
    return offset;
  };
  auto full_param = [&](int i) { return full.params[static_cast<size_t>(i)]; };
  auto whole = [&](int i) {
    const ParamSpec& f = full_param(i);
    return add(i, {{0, f.shape[0]}}, 0, cols_of(f.shape), tp > 1);
  };
  // A norm's weight: replicated over TP; its grad is partial under SP (each rank's tokens).
  auto norm = [&](int i, bool partial) {
    const int64_t offset = whole(i);
    if (partial && tp > 1) shard.partials.push_back({Reduce::tp, offset, full_param(i).numel()});
  };
  auto vocab_rows = [&](int i) {
    const ParamSpec& f = full_param(i);
    const int64_t offset = add(i, {{r * vocab, vocab}}, 0, f.shape[1], false);
    if (tied_copy) {
      shard.partials.push_back({Reduce::embedding, offset, vocab * f.shape[1]});
      // The last stage's copy is the first stage's tensor again.
      if (!m.first_stage) shard.counted.pop_back();
    }
  };

  for (size_t i = 0; i < full.params.size(); ++i) {
    const ParamSpec& f = full.params[i];
    const int index = static_cast<int>(i);
    const bool in_stage = f.layer >= m.layer_begin && f.layer < m.layer_end;
    switch (f.kind) {
      case ParamKind::embedding:
        if (m.first_stage || (m.last_stage && c.tie_word_embeddings)) vocab_rows(index);
        break;
      case ParamKind::lm_head:
        if (m.last_stage) vocab_rows(index);
        break;
      case ParamKind::final_norm:
        if (m.last_stage) norm(index, m.sequence_parallel);
        break;
      case ParamKind::input_norm:
      case ParamKind::post_attn_norm:
        if (in_stage) norm(index, m.sequence_parallel);
        break;
      case ParamKind::q_norm:
      case ParamKind::k_norm:
        if (in_stage) norm(index, true);
        break;
      case ParamKind::qkv:
        if (in_stage) {
          const int64_t offset = add(index,
                                     {{r * q_rows, q_rows},
                                      {c.q_dim() + kv_first * hd, kv_rows},
                                      {c.q_dim() + c.kv_dim() + kv_first * hd, kv_rows}},
                                     0, c.hidden_size, false);
          if (kv_replicated) {
            const int64_t kv_offset = offset + q_rows * c.hidden_size, kv_numel = 2 * kv_rows * c.hidden_size;
            shard.partials.push_back({Reduce::kv, kv_offset, kv_numel});
            if (!kv_holder) shard.counted.back().second = q_rows * c.hidden_size;
          }
        }
        break;
      case ParamKind::o_proj:
        if (in_stage) add(index, {{0, c.hidden_size}}, r * q_rows, q_rows, false);
        break;
      case ParamKind::gate_up:
        if (in_stage)
          add(index, {{r * ffn, ffn}, {c.intermediate_size + r * ffn, ffn}}, 0, c.hidden_size, false);
        break;
      case ParamKind::down:
        if (in_stage) add(index, {{0, c.hidden_size}}, r * ffn, ffn, false);
        break;
    }
  }
  return shard;
}

// Copies between a local flat buffer laid out by shard.table and a full one by `full`.
template <typename Copy>
void for_each_slice_row(const RankShard& shard, const ParamTable& full, Copy copy) {
  for (size_t i = 0; i < shard.slices.size(); ++i) {
    const SliceMap& s = shard.slices[i];
    const ParamSpec& f = full.params[static_cast<size_t>(s.full)];
    const int64_t full_cols = cols_of(f.shape);
    int64_t local = shard.table.params[i].offset;
    for (const RowBlock& b : s.blocks)
      for (int64_t row = b.row; row < b.row + b.rows; ++row, local += s.cols)
        copy(local, f.offset + row * full_cols + s.col, s.cols);
  }
}

void full_to_local(const RankShard& shard, const ParamTable& full, const float* in, float* out) {
  for_each_slice_row(shard, full,
                     [&](int64_t local, int64_t at, int64_t n) { std::copy_n(in + at, n, out + local); });
}

void local_to_full(const RankShard& shard, const ParamTable& full, const float* in, float* out) {
  for_each_slice_row(shard, full,
                     [&](int64_t local, int64_t at, int64_t n) { std::copy_n(in + local, n, out + at); });
}

// The TP hook of Qwen3Model over the TP group's Comm.
class CommTpCollectives final : public TpCollectives {
 public:
  CommTpCollectives(Comm& tp, CommTimeout timeout) : tp_(tp), timeout_(timeout) {}
  void all_reduce(Tensor x) override {
    tp_.all_reduce_sum(x.data, static_cast<size_t>(x.numel()), DType::f32, timeout_);
  }
  void all_gather(Tensor full, Tensor part) override {
    LOOM_ASSERT(full.numel() == part.numel() * tp_.size(), "all_gather sizes");
    tp_.all_gather(part.data, full.data, static_cast<size_t>(part.numel()), DType::f32, timeout_);
  }
  void reduce_scatter(Tensor part, Tensor full) override {
    LOOM_ASSERT(full.numel() == part.numel() * tp_.size(), "reduce_scatter sizes");
    tp_.reduce_scatter_sum(full.data, part.data, static_cast<size_t>(part.numel()), DType::f32, timeout_);
  }

 private:
  Comm& tp_;
  CommTimeout timeout_;
};

class ParallelCpuEngine final : public TrainEngine {
 public:
  ParallelCpuEngine(const Qwen3Config& config, const ParamTable& table, const std::vector<float>& params,
                    const EngineOptions& options, Groups& groups)
      : full_(table),
        config_(config),
        options_(options),
        groups_(groups),
        timeout_(options.comm_timeout),
        layout_(groups.world->size(), groups.layout),
        shard_(rank_shard(config, table, groups.layout, groups.coords, options)),
        dp_(groups.layout.dp),
        dp_rank_(groups.coords.dp),
        slice_(padded() / dp_),
        params_(static_cast<size_t>(padded())),
        grads_(params_.size()),
        grad_slice_(static_cast<size_t>(slice_)),
        adam_m_(grad_slice_.size()),
        adam_v_(grad_slice_.size()),
        tp_collectives_(*groups.tp, timeout_),
        model_(config, shard_.table, ops_, options.recompute, shard_.model, &tp_collectives_),
        tensors_{param_views(shard_.table, params_.data()), param_views(shard_.table, grads_.data())} {
    LOOM_ASSERT(static_cast<int64_t>(params.size()) == table.total_numel, "initial weights of another model");
    full_to_local(shard_, full_, params.data(), params_.data());
    ranges_ = slice_ranges();
    if (config.num_key_value_heads < groups.layout.tp) {
      // The ranks whose q heads share a KV head: tp / kv_heads consecutive TP ranks.
      const int share = static_cast<int>(groups.layout.tp / config.num_key_value_heads);
      std::vector<int> members;
      for (int i = 0; i < share; ++i) members.push_back(groups.coords.tp / share * share + i);
      kv_group_ = groups.tp->split(members, "tp_kv", timeout_);
    }
  }

  void zero_grads() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }

  double micro_batch(const MicroBatchData&) override {
    LOOM_ASSERT(false, "the parallel engine runs a step's micro-batches together (micro_batches)");
    return 0;
  }

  double micro_batches(const std::vector<MicroBatchData>& batches) override {
    const int count = static_cast<int>(batches.size());
    std::vector<MicroBatchData> data = batches;
    std::vector<MicroBatch> views;
    for (MicroBatchData& d : data) views.push_back(d.view());
    const int64_t h = config_.hidden_size;
    std::vector<std::vector<float>> inputs(static_cast<size_t>(count)), output_grads(inputs.size());
    std::vector<std::unique_ptr<HostArena>> arenas(inputs.size());
    std::vector<Qwen3Model::Activations> acts(inputs.size());
    auto stream = [&](int mb) { return model_.stream_tokens(views[static_cast<size_t>(mb)].ids.numel()); };
    auto buffer = [&](std::vector<float>& b, int mb) {
      b.assign(static_cast<size_t>(stream(mb) * h), 0.0f);
      return b.data();
    };
    auto track_peak = [&](size_t mb) {
      int64_t others = 0;
      for (size_t i = 0; i < arenas.size(); ++i)
        if (i != mb && arenas[i]) others += arenas[i]->bytes_in_use();
      activation_peak_ = std::max(activation_peak_, others + arenas[mb]->peak_bytes());
    };
    double nll = 0;
    Tensor d_input;
    PipelineStage stage;
    stage.dtype = DType::f32;
    stage.activation_count = [&](int mb) { return static_cast<size_t>(stream(mb) * h); };
    stage.input_buffer = [&](int mb) -> void* { return buffer(inputs[static_cast<size_t>(mb)], mb); };
    stage.output_grad_buffer = [&](int mb) -> void* {
      return buffer(output_grads[static_cast<size_t>(mb)], mb);
    };
    stage.forward = [&](int mb) -> const void* {
      const size_t i = static_cast<size_t>(mb);
      arenas[i] = std::make_unique<HostArena>();
      const Tensor input{inputs[i].data(), {stream(mb), h}, DType::f32, Device::cpu};
      acts[i] = model_.stage_forward(tensors_, views[i], input, *arenas[i]);
      track_peak(i);
      return acts[i].output.data;
    };
    stage.backward = [&](int mb) -> const void* {
      const size_t i = static_cast<size_t>(mb);
      // The previous backward's input gradient has been sent: its arena can go.
      if (i > 0) arenas[i - 1].reset();
      const Tensor d_output{output_grads[i].data(), {stream(mb), h}, DType::f32, Device::cpu};
      nll += model_.stage_backward(tensors_, views[i], acts[i], d_output, *arenas[i], 1.0f, &d_input);
      track_peak(i);
      acts[i] = {};
      return d_input.data;
    };
    pipeline_run_1f1b(*groups_.pp, stage, count, timeout_);
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
    double sum = 0;
    const int64_t lo = dp_rank_ * slice_;
    for (const auto& [offset, numel] : shard_.counted) {
      const int64_t b = std::max(offset, lo), e = std::min(offset + numel, lo + slice_);
      if (b < e) sum += loom::grad_sum_squares(grad_slice_.data() + (b - lo), e - b);
    }
    groups_.world->all_reduce_sum(&sum, 1, DType::f64, timeout_);
    return sum;
  }

  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    float* slice = params_.data() + dp_rank_ * slice_;
    adamw_step(adam, lr, step, ranges_, slice, grad_slice_.data(), adam_m_.data(), adam_v_.data());
    groups_.dp->all_gather(slice, params_.data(), static_cast<size_t>(slice_), DType::f32, timeout_);
  }

  std::vector<float> master_params() override { return gather_full(params_); }
  DType export_dtype() const override { return DType::f32; }

  void state_to_host(TrainState& out) override {
    out.master = gather_full(params_);
    out.adam_m = gather_full(gather_slices(adam_m_));
    out.adam_v = gather_full(gather_slices(adam_v_));
  }

  // Takes this rank's slices; the model's tensor views point into params_, so in place.
  void state_from_host(const TrainState& in) override {
    LOOM_ASSERT(static_cast<int64_t>(in.master.size()) == full_.total_numel, "state of another model");
    full_to_local(shard_, full_, in.master.data(), params_.data());
    std::vector<float> local(params_.size());
    const int64_t lo = dp_rank_ * slice_;
    for (auto [from, to] : {std::pair{&in.adam_m, &adam_m_}, std::pair{&in.adam_v, &adam_v_}}) {
      full_to_local(shard_, full_, from->data(), local.data());
      std::copy_n(local.begin() + lo, slice_, to->begin());
    }
  }

  std::vector<float> grads_to_host() override { return gather_full(gather_slices(grad_slice_)); }

  int64_t peak_bytes() const override {
    return static_cast<int64_t>((2 * params_.size() + 3 * grad_slice_.size()) * sizeof(float)) +
           activation_peak_;
  }

 private:
  int64_t padded() const { return (shard_.table.total_numel + dp_ - 1) / dp_ * dp_; }

  // The optimizer's ranges of this DP rank's slice, relative to the slice's start.
  std::vector<ParamRange> slice_ranges() const {
    std::vector<ParamRange> ranges;
    const int64_t lo = dp_rank_ * slice_, hi = lo + slice_;
    for (const ParamSpec& p : shard_.table.params) {
      const int64_t b = std::max(p.offset, lo), e = std::min(p.offset + p.numel(), hi);
      if (b < e) ranges.push_back({b - lo, e - b, p.decay()});
    }
    return ranges;
  }

  // Steps 2 and 3 of the header: the partial sums of replicated tensors, then DP.
  void reduce_grads() {
    for (const PartialGrad& p : shard_.partials) {
      Comm* group = p.group == Reduce::tp   ? groups_.tp.get()
                    : p.group == Reduce::kv ? kv_group_.get()
                                            : groups_.embedding.get();
      group->all_reduce_sum(grads_.data() + p.offset, static_cast<size_t>(p.numel), DType::f32, timeout_);
    }
    groups_.dp->reduce_scatter_sum(grads_.data(), grad_slice_.data(), static_cast<size_t>(slice_), DType::f32,
                                   timeout_);
  }

  // The whole shard of a DP-sliced buffer (padded), all-gathered over DP.
  std::vector<float> gather_slices(const std::vector<float>& slice) const {
    std::vector<float> local(params_.size());
    groups_.dp->all_gather(slice.data(), local.data(), static_cast<size_t>(slice_), DType::f32, timeout_);
    return local;
  }

  // The full tensors laid out by the full table, from every rank's shard (collective over
  // the world): the shards of DP rank 0 of each TP × PP position, all-gathered.
  std::vector<float> gather_full(const std::vector<float>& local) const {
    const int world = layout_.world_size();
    std::vector<RankShard> shards;
    int64_t most = 0;
    for (int r = 0; r < world; ++r) {
      shards.push_back(rank_shard(config_, full_, layout_.layout(), layout_.coords(r), options_));
      most = std::max(most, shards.back().table.total_numel);
    }
    std::vector<float> send(static_cast<size_t>(most)), all(static_cast<size_t>(most * world));
    std::copy_n(local.begin(), shard_.table.total_numel, send.begin());
    groups_.world->all_gather(send.data(), all.data(), static_cast<size_t>(most), DType::f32, timeout_);
    std::vector<float> full(static_cast<size_t>(full_.total_numel));
    for (int r = 0; r < world; ++r)
      if (layout_.coords(r).dp == 0)
        local_to_full(shards[static_cast<size_t>(r)], full_, all.data() + static_cast<size_t>(r) * most,
                      full.data());
    return full;
  }

  ParamTable full_;
  Qwen3Config config_;
  EngineOptions options_;
  Groups& groups_;
  CommTimeout timeout_;
  RankLayout layout_;
  RankShard shard_;
  int64_t dp_, dp_rank_, slice_;
  std::vector<float> params_, grads_, grad_slice_, adam_m_, adam_v_;
  std::vector<ParamRange> ranges_;
  CpuOps ops_;
  CommTpCollectives tp_collectives_;
  Qwen3Model model_;
  ModelTensors tensors_;
  std::unique_ptr<Comm> kv_group_;
  int64_t activation_peak_ = 0;
};

}  // namespace

std::unique_ptr<TrainEngine> parallel_cpu_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                        const std::vector<float>& params,
                                                        const EngineOptions& options, Groups& groups) {
  return std::make_unique<ParallelCpuEngine>(config, table, params, options, groups);
}

}  // namespace loom
