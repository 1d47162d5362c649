#include "plan/dry_run.h"

#include <algorithm>
#include <map>
#include <memory>

#include "core/error.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "model/param_table.h"
#include "model/shard_spec.h"
#include "ops/op_workspace.h"
#include "ops/shape/shape_ops.h"
#include "parallel/context_split.h"

namespace loom {
namespace {

// The TP (and CP) collectives of a dry run: each checks what it is given, as a Comm would,
// and moves nothing.
class ShapeTpCollectives final : public TpCollectives {
 public:
  explicit ShapeTpCollectives(int64_t tp) : tp_(tp) {}
  void all_reduce(Tensor) override {}
  void all_gather(Tensor full, Tensor part) override { check("all_gather", full, part); }
  void reduce_scatter(Tensor part, Tensor full) override { check("reduce_scatter", full, part); }
  void shift(Tensor recv, Tensor send) override {
    if (recv.dtype != send.dtype || recv.numel() != send.numel())
      throw_runtime_failure("shift", "recv " + recv.shape.str() + " is not send " + send.shape.str());
  }

 private:
  void check(const char* op, const Tensor& full, const Tensor& part) const {
    if (full.dtype != part.dtype || full.numel() != tp_ * part.numel())
      throw_runtime_failure(op, "full " + full.shape.str() + " is not tp = " + std::to_string(tp_) +
                                    " times part " + part.shape.str());
  }
  int64_t tp_;
};

// How a dry run's EP exchanges route the micro-batch (every EP rank's the same shape). The
// time model's: evenly, T·k rows through each GPU's grouped GEMMs. The memory model's: evenly
// but for one sparse layer at the dispatch's worst case, every row of every EP rank to this
// GPU's experts (ep · T·k rows; dropless, nothing caps them): the stage's last sparse layer,
// whose kept rows then sit beside every other layer's and whose backward's buffers come
// first, and every forward a recompute runs again (one chunk at a time). Every layer at the
// worst at once would be a router sending each layer's every token to one GPU, which the
// load-balancing it trains with works against; one layer so skewed is what a GPU must hold.
enum class EpRouting : uint8_t { skewed, even };

// The EP collectives of a dry run: the counts of the routing above, the rows moved nowhere.
class ShapeEpCollectives final : public EpCollectives {
 public:
  ShapeEpCollectives(int64_t ep, int64_t rows, EpRouting routing, int64_t skewed_from)
      : ep_(ep), rows_(rows), routing_(routing), skewed_from_(skewed_from) {}
  // EP rank 0's view: its first local expert (expert 0) receives the rows.
  std::vector<int32_t> all_gather_counts(const std::vector<int32_t>& counts) override {
    const bool skewed = routing_ == EpRouting::skewed && calls_++ >= skewed_from_;
    std::vector<int32_t> all(counts.size() * static_cast<size_t>(ep_), 0);
    for (int64_t s = 0; s < ep_; ++s)
      all[static_cast<size_t>(s) * counts.size()] = static_cast<int32_t>(skewed ? rows_ : rows_ / ep_);
    return all;
  }
  void all_to_all(Tensor recv, const std::vector<int64_t>& recv_rows, Tensor send,
                  const std::vector<int64_t>& send_rows) override {
    int64_t in = 0, out = 0;
    for (size_t r = 0; r < recv_rows.size(); ++r) {
      in += recv_rows[r];
      out += send_rows[r];
    }
    if (recv.dtype != send.dtype || in > recv.shape[0] || out > send.shape[0])
      throw_runtime_failure("all_to_all",
                            "rows past recv " + recv.shape.str() + " or send " + send.shape.str());
  }

 private:
  int64_t ep_, rows_;
  EpRouting routing_;
  int64_t skewed_from_;
  int64_t calls_ = 0;
};

// TP rank 0's (and EP rank 0's) tensors of `full` (the model's, or LoRA's adapters') on
// stage `stage`, laid out as train/rank_shard.cpp lays a rank's (its regions' padding aside).
ParamTable stage_table(const ParamTable& full, const ModelConfig& model, const ShardLayout& spec,
                       int64_t stage) {
  ParamTable table;
  for (const ParamSpec& f : full.params) {
    const TensorShard t = tensor_shard(model, spec, 0, stage, f);
    if (!t.held) continue;
    table.params.push_back({f.name, f.kind, f.layer, t.shape, table.total_numel});
    table.total_numel += t.shape.numel();
  }
  return table;
}

RecomputePolicy recompute_policy(const RecomputeSpec& spec) {
  RecomputePolicy policy;
  if (!spec.enabled) return policy;
  policy.granularity = spec.granularity == "selective" ? RecomputePolicy::Granularity::selective
                                                       : RecomputePolicy::Granularity::full;
  policy.block = spec.method == "block";
  policy.num_layers = spec.num_layers;
  return policy;
}

LinearPrecision linear_precision(const WorkloadSpec& workload) {
  LinearPrecision p;
  if (workload.precision != "fp8") return p;
  p.fp8 = true;
  p.gradient_format = workload.fp8.gradients == "e4m3" ? DType::e4m3 : DType::e5m2;
  p.bf16_first_layers = workload.fp8.bf16_first_layers;
  p.bf16_last_layers = workload.fp8.bf16_last_layers;
  p.scaling = workload.fp8.scaling == "block" ? Fp8Scaling::block : Fp8Scaling::tensor;
  return p;
}

// The micro-batch's rows: `rows` of row_tokens; for sample-isolated rows the run's
// micro-batch with the largest THD backward call (plan.h isolated_attention_shape).
RowSpans micro_batch_rows(const PlanInput& input, int64_t rows, int64_t row_tokens) {
  return isolated_micro_batch_spans(isolated_attention_shape(input, rows), rows, row_tokens);
}

int64_t aligned(int64_t bytes) {
  return BlockArena::align_up(std::max<int64_t>(bytes, 1));
}

struct DryRun {
  StageArenas arenas;
  OpCounts ops;
  int64_t offloaded_inputs = 0, offloaded_input_bytes = 0;
};

// layout.activation_offload's twin for the dry run (ops/activation_offload.h): the CUDA
// twin's three device slots in an arena of their own, and what goes to the host.
class ShapeActivationOffload final : public ActivationOffload {
 public:
  Tensor slot(size_t index, Shape shape, DType dtype) override {
    Tensor t{nullptr, shape, dtype, Device::cuda};
    const auto bytes = static_cast<int64_t>(t.nbytes());
    if (bytes > slot_bytes_) {
      slots_arena_.release_all();
      for (void*& s : slots_)
        s = slots_arena_.allocate_bytes(bytes, "activation offload slot (a chunk input)");
      slot_bytes_ = bytes;
    }
    t.data = slots_[index % kSlots];
    inputs_[index] = t;
    return t;
  }
  void to_host(size_t index) override {
    const auto bytes = static_cast<int64_t>(inputs_.at(index).nbytes());
    host_[index] = bytes;
    input_bytes_ = std::max(input_bytes_, bytes);
  }
  Tensor from_host(size_t index, size_t) override { return inputs_.at(index); }
  int64_t host_bytes() const override {
    int64_t total = 0;
    for (const auto& [index, bytes] : host_) total += bytes;
    return total;
  }
  int64_t device_bytes() const override { return slots_arena_.reserved_bytes(); }
  int64_t inputs() const { return static_cast<int64_t>(host_.size()); }
  int64_t input_bytes() const { return input_bytes_; }

 private:
  CountingArena slots_arena_{"activation offload slots"};
  void* slots_[kSlots] = {};
  int64_t slot_bytes_ = 0, input_bytes_ = 0;
  std::map<size_t, Tensor> inputs_;
  std::map<size_t, int64_t> host_;
};

DryRun dry_run(const PlanInput& input, const MicroBatchShape& micro, int64_t stage, EpRouting routing) {
  const ModelConfig& config = input.model;
  const LayoutSpec& layout = input.layout;
  const ShardLayout spec{layout.tp,          layout.pp,  layout.sequence_parallel,
                         layout.layer_split, layout.vpp, layout.ep};
  const LayerRange layers = stage_layer_range(config, spec, stage);
  ModelShard shard;
  shard.tp = layout.tp;
  shard.sequence_parallel = layout.sequence_parallel && layout.tp > 1;
  shard.layer_begin = layers.begin;
  shard.layer_end = layers.end;
  shard.first_stage = stage == 0;
  shard.last_stage = stage == layout.pp - 1;
  shard.ep = layout.ep;
  const ParamTable table = stage_table(param_table_build(config), config, spec, stage);
  // The experts run on the rank's stream tokens (T / tp under SP), k rows each.
  const int64_t tokens = micro.tokens / layout.cp;
  const int64_t stream_tokens = shard.sequence_parallel ? tokens / layout.tp : tokens;
  int64_t sparse_layers = 0;
  for (int64_t l = layers.begin; l < layers.end; ++l) sparse_layers += config.sparse_layer(l) ? 1 : 0;
  ShapeEpCollectives ep(layout.ep, stream_tokens * config.num_experts_per_tok, routing, sparse_layers - 1);

  ShapeOpsOptions options;
  options.multiprocessors = input.gpu.multiprocessors;
  options.loss_chunk_tokens = input.constants.loss_chunk_tokens;
  options.attention_backward_by_row = input.attention_backward_by_row;
  options.sdpa_backward_dq_units = input.constants.sdpa_backward_workspace_dq_units;
  options.sdpa_forward_workspace_bytes = input.constants.sdpa_forward_workspace_bytes;
  options.cp = layout.cp;
  ShapeOps ops(options);
  ShapeTpCollectives tp(layout.tp), cp(layout.cp);
  DecoderModel model(config, table, ops, recompute_policy(layout.recompute), shard,
                     layout.tp > 1 ? &tp : nullptr, layout.ep > 1 ? &ep : nullptr);
  ShapeActivationOffload offload;
  if (layout.activation_offload) model.set_activation_offload(&offload);
  // Context parallelism runs its own form's attention (the whole rows gathered, or the ring's
  // blocks) with the buffers it takes, as CP rank 0.
  if (layout.cp > 1) {
    model.set_context_parallel(&cp);
    if (layout.cp_comm == "ring") model.set_context_ring(layout.cp, 0);
  }
  CountingArena fp8_weights("FP8 weights");
  const LinearPrecision precision = linear_precision(input.workload);
  if (precision.fp8) {
    model.set_linear_precision(precision, &fp8_weights);
    // The engine's FP8 weight cache holds the FP8 statistics' counters too, whether a step
    // takes statistics or not (train/cuda_param_store.cpp fp8_weight_bytes).
    model.fp8_census_begin();
  }

  // The parameter store's buffers (their sizes are the memory model's own terms): addresses
  // for the model's weight and main-grad views.
  CountingArena weights("weights"), grads("main grads");
  ModelTensors tensors;
  void* weight_bytes = weights.allocate_bytes(2 * table.total_numel, "bf16 weights");
  tensors.params = param_views(table, weight_bytes, DType::bf16, Device::cuda);
  ops.set_weights(Tensor{weight_bytes, {table.total_numel}, DType::bf16, Device::cuda});
  // LoRA: a frozen base (no main grads: no weight-gradient GEMMs of it) and the adapters.
  const ParamTable adapters = input.lora.enabled()
                                  ? stage_table(lora_table_build(config, input.lora), config, spec, stage)
                                  : ParamTable{};
  if (input.lora.enabled()) {
    model.set_lora(input.lora, adapters);
    tensors.adapters =
        param_views(adapters, weights.allocate_bytes(2 * adapters.total_numel, "bf16 adapters"), DType::bf16,
                    Device::cuda);
    tensors.adapter_grads =
        param_views(adapters, grads.allocate_bytes(4 * adapters.total_numel, "fp32 adapter grads"),
                    DType::f32, Device::cuda);
  } else {
    tensors.grads = param_views(table, grads.allocate_bytes(4 * table.total_numel, "fp32 main grads"),
                                DType::f32, Device::cuda);
  }

  // One micro-batch as stage_pipeline_run drives it (train/stage_pipeline.cpp): the stage's
  // input, then the batch's ids and targets, the forward, the output's gradient; the backward
  // in the slot itself where the stage has one slot (pp − stage of them), else in an arena of
  // its own.
  const int64_t row_tokens = micro.row_tokens / layout.cp;
  const int64_t hidden = config.hidden_size;
  const int64_t stream = model.stream_tokens(tokens);
  CountingArena slot("activations"), backward_arena("activations (backward)");
  const bool one_slot = layout.pp - stage == 1;
  Tensor input_tensor;
  if (!shard.first_stage) input_tensor = slot.allocate({stream, hidden}, DType::bf16, "stage input");
  MicroBatch batch;
  batch.ids = slot.allocate({tokens}, DType::i32, "token ids");
  batch.targets = slot.allocate({tokens}, DType::i32, "targets");
  batch.rows = micro_batch_rows(input, micro.rows, row_tokens);
  // Positions without a target let the lm_head run on the rows with one (PlanInput::loss_rows).
  const int64_t loss_rows =
      input.loss_rows < 0 ? (tokens - 1) / kLossRowsGranule * kLossRowsGranule : input.loss_rows;
  if (loss_rows > 0 && loss_rows < tokens) {
    batch.loss_positions = slot.allocate({loss_rows}, DType::i32, "loss row positions");
    batch.loss_targets = slot.allocate({loss_rows}, DType::i32, "loss row targets");
    batch.loss_rows = loss_rows;
  }
  if (layout.cp > 1) {
    // CP rank 0's spans over whole rows (which ShapeOps counts the attention's work by; every
    // rank's pair of chunks sees as many keys).
    std::vector<int32_t> whole_rows;
    for (int64_t r = 0; r <= micro.rows; ++r)
      whole_rows.push_back(static_cast<int32_t>(r * micro.row_tokens));
    const ContextShard rank0 = context_shard(whole_rows, micro.row_tokens, layout.cp, 0);
    batch.context.key_begin = rank0.key_begin;
    batch.context.key_end.clear();
    for (int32_t t : rank0.source) batch.context.key_end.push_back(t + 1);
    batch.cp_row_order = slot.allocate({tokens * layout.cp}, DType::i32, "CP row order");
    batch.cp_rank_order = slot.allocate({tokens * layout.cp}, DType::i32, "CP rank order");
  }
  // LoRA dropout: the token pairs its masks are drawn from (the dropped inputs are scratch of
  // the linear layers, counted as they are made).
  if (input.lora.enabled() && input.lora.dropout > 0)
    batch.lora_dropout = {input.lora.dropout, 0, 1,
                          slot.allocate({tokens, 2}, DType::i32, "LoRA dropout's token pairs")};
  DecoderModel::Activations acts = model.stage_forward(tensors, batch, input_tensor, slot);
  Tensor d_output;
  if (!shard.last_stage) d_output = slot.allocate({stream, hidden}, DType::bf16, "stage output gradient");
  Tensor d_input;
  model.stage_backward(tensors, batch, acts, d_output, one_slot ? slot : backward_arena, 1.0f, &d_input);
  if (precision.fp8) model.fp8_census_end();

  DryRun run;
  run.ops = ops.counts();
  StageArenas& out = run.arenas;
  out.slot_peak = slot.peak_bytes();
  // Every arena is released at the next micro-batch: blocks a pass spilled into are merged
  // then, into what it keeps from the second step on.
  for (CountingArena* arena : {&slot, &backward_arena, &ops.workspace()}) arena->release_all();
  out.slot = slot.reserved_bytes();
  out.backward = backward_arena.reserved_bytes();
  out.send = shard.first_stage ? 0 : aligned(stream * hidden * 2);
  out.workspace = ops.workspace().reserved_bytes();
  out.tables = ops.tables().reserved_bytes();
  out.fp8_weights = fp8_weights.reserved_bytes();
  out.sdpa_backward = ops.sdpa_backward_bytes();
  const int64_t vocab_rows = shard_vocab(config, layout.tp);
  const int64_t head_rows = batch.loss_rows > 0 ? batch.loss_rows : tokens;
  out.logits = shard.last_stage ? op_workspace::lm_head_logits_bytes(head_rows, vocab_rows,
                                                                     input.constants.loss_chunk_tokens)
                                : 0;
  if (layout.ep > 1) out.dispatch_rows = layout.ep * stream_tokens * config.num_experts_per_tok;
  out.offload_slots = offload.device_bytes();
  out.offload_host = offload.host_bytes();
  run.offloaded_inputs = offload.inputs();
  run.offloaded_input_bytes = offload.input_bytes();
  return run;
}

}  // namespace

StageArenas stage_dry_run(const PlanInput& input, const MicroBatchShape& micro, int64_t stage) {
  return dry_run(input, micro, stage, EpRouting::skewed).arenas;
}

StageOps stage_ops(const PlanInput& input, const MicroBatchShape& micro, int64_t stage) {
  StageOps out;
  const DryRun pass = dry_run(input, micro, stage, EpRouting::even);
  out.pass = pass.ops;
  out.offloaded_inputs = pass.offloaded_inputs;
  out.offloaded_input_bytes = pass.offloaded_input_bytes;
  if (!input.layout.recompute.enabled) return out;
  PlanInput kept = input;
  kept.layout.recompute = RecomputeSpec{};
  const OpCounts without = dry_run(kept, micro, stage, EpRouting::even).ops;
  for (size_t k = 0; k < out.pass.by_class.size(); ++k) {
    out.recompute.by_class[k].flops = out.pass.by_class[k].flops - without.by_class[k].flops;
    out.recompute.by_class[k].bytes = out.pass.by_class[k].bytes - without.by_class[k].bytes;
  }
  return out;
}

}  // namespace loom
