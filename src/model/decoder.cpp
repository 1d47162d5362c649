#include "model/decoder.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "model/shard_spec.h"
#include "parallel/context_split.h"

namespace loom {

std::vector<Tensor> param_views(const ParamTable& table, void* flat, DType dtype, Device device) {
  std::vector<Tensor> views;
  views.reserve(table.params.size());
  auto* base = static_cast<uint8_t*>(flat);
  for (const ParamSpec& p : table.params)
    views.push_back(
        Tensor{base + p.offset * static_cast<int64_t>(dtype_size(dtype)), p.shape, dtype, device});
  return views;
}

std::vector<Tensor> param_views(const ParamTable& table, float* flat) {
  return param_views(table, flat, DType::f32, Device::cpu);
}

namespace {

// The stage's recompute chunks, numbered by the model's layers.
std::vector<LayerChunk> stage_chunks(const RecomputePolicy& policy, int64_t begin, int64_t end) {
  std::vector<LayerChunk> chunks = recompute_chunks(policy, end - begin);
  for (LayerChunk& c : chunks) c = {c.begin + begin, c.end + begin};
  return chunks;
}

RopeSpec rope_spec(const ModelConfig& c) {
  return {static_cast<float>(c.rope_theta),
          c.rope_llama3,
          static_cast<float>(c.rope_factor),
          static_cast<float>(c.rope_low_freq_factor),
          static_cast<float>(c.rope_high_freq_factor),
          c.rope_original_max_position};
}

ModelShard resolved(ModelShard shard, const ModelConfig& config) {
  if (shard.layer_end < 0) shard.layer_end = config.num_hidden_layers;
  return shard;
}

}  // namespace

DecoderModel::DecoderModel(const ModelConfig& config, const ParamTable& table, Ops& ops,
                           RecomputePolicy recompute, ModelShard shard, TpCollectives* tp, EpCollectives* ep)
    : config_(config),
      table_(table),
      ops_(ops),
      shard_(resolved(shard, config)),
      tp_(tp),
      ep_(ep),
      local_experts_(config.num_experts / shard_.ep),
      heads_(shard_heads(config, shard_.tp)),
      ffn_(shard_ffn(config, shard_.tp)),
      recompute_(recompute),
      chunks_(stage_chunks(recompute, shard_.layer_begin, shard_.layer_end)),
      eps_(static_cast<float>(config.rms_norm_eps)),
      rope_(rope_spec(config)),
      linears_(ops, {}, config.num_hidden_layers, tp, shard_.tp, shard_.tp_rank, shard_.sequence_parallel) {
  LOOM_ASSERT(shard_.tp == 1 || tp_, "a tensor-parallel shard needs its TP collectives");
  LOOM_ASSERT(shard_.ep == 1 || ep_, "an expert-parallel shard needs its EP collectives");
  LOOM_ASSERT(shard_.layer_begin < shard_.layer_end && shard_.layer_end <= config.num_hidden_layers,
              "a pipeline stage needs at least one of the model's layers");
}

void DecoderModel::set_linear_precision(const LinearPrecision& precision, TensorAllocator* weight_cache) {
  linears_.set_precision(precision, weight_cache);
}

int DecoderModel::param_index(ParamKind kind, int64_t layer) const {
  const int index = table_.find(kind, layer);
  LOOM_ASSERT(index >= 0, "parameter missing from the table");
  return index;
}

LinearParams DecoderModel::linear_params(const ModelTensors& w, ParamKind kind, int64_t l) const {
  LinearParams p;
  p.weight = param(w, kind, l);
  if (kind == ParamKind::qkv && config_.qkv_bias) p.bias = param(w, ParamKind::qkv_bias, l);
  if (!w.grads.empty()) p.grad = grad(w, kind, l);
  p.index = param_index(kind, l);
  if (!lora_table_) return p;
  const int a = lora_table_->find(lora_a_kind(kind), l);
  if (a < 0) return p;  // no target in this layer
  p.lora_a = w.adapters[static_cast<size_t>(a)];
  if (!w.adapter_grads.empty()) p.lora_a_grad = w.adapter_grads[static_cast<size_t>(a)];
  for (LoraTarget target : lora_layer_targets(kind)) {
    if (!lora_.targets_module(target)) continue;
    const auto b = static_cast<size_t>(lora_table_->find(lora_b_kind(target), l));
    p.lora_up.push_back({w.adapters[b], w.adapter_grads.empty() ? Tensor{} : w.adapter_grads[b],
                         lora_target_row(config_, target, shard_.tp)});
    p.lora_targets.push_back(target);
  }
  p.lora_scale = lora_.scale();
  return p;
}

void DecoderModel::linear_forward(const ModelTensors& w, const MicroBatch& batch, Tensor out, LinearInput& in,
                                  Tensor gemm_x, TensorAllocator& scratch) {
  linears_.forward(out, in, gemm_x, linear_params(w, in.kind, in.layer), batch.lora_dropout, scratch);
}

void DecoderModel::row_parallel_backward(const ModelTensors& w, Tensor d_x, const LinearOutputGrad& d,
                                         const LinearInput& in, TensorAllocator& scratch) {
  const LinearParams p = linear_params(w, d.kind, d.layer);
  const BlockLinears::Gradient g = linears_.gradient(d, p, in, scratch);
  linears_.backward_input(d_x, g, p, scratch);
  linears_.backward_weight(g, in, in.x, p, scratch);
  linears_.release_gradient(g, scratch);
}

int64_t DecoderModel::stream_tokens(int64_t tokens) const {
  return shard_.sequence_parallel ? tokens / shard_.tp : tokens;
}

const Tensor& DecoderModel::param(const ModelTensors& tensors, ParamKind kind, int64_t layer) const {
  int index = kind == ParamKind::lm_head ? table_.lm_head_param() : table_.find(kind, layer);
  LOOM_ASSERT(index >= 0, "parameter missing from the table");
  return tensors.params[static_cast<size_t>(index)];
}

Tensor DecoderModel::grad(const ModelTensors& tensors, ParamKind kind, int64_t layer) const {
  if (tensors.grads.empty()) return {};  // a frozen base (LoRA): no weight gradients
  int index = kind == ParamKind::lm_head ? table_.lm_head_param() : table_.find(kind, layer);
  LOOM_ASSERT(index >= 0, "parameter missing from the table");
  return tensors.grads[static_cast<size_t>(index)];
}

Tensor DecoderModel::gather_sequence(Tensor x, TensorAllocator& scratch, const char* what) {
  if (!shard_.sequence_parallel) return x;
  Tensor full = scratch.allocate({x.shape[0] * shard_.tp, x.shape[1]}, x.dtype, what);
  tp_->all_gather(full, x);
  return full;
}

Tensor DecoderModel::gather_sequence_into(Tensor x, Tensor full) {
  if (!shard_.sequence_parallel) return x;
  tp_->all_gather(full, x);
  return full;
}

Tensor DecoderModel::reduce_partial(Tensor partial, TensorAllocator& scratch, const char* what) {
  if (shard_.tp == 1 || !shard_.sequence_parallel) return reduce_partial_into(partial, Tensor{});
  return reduce_partial_into(
      partial, scratch.allocate({partial.shape[0] / shard_.tp, partial.shape[1]}, partial.dtype, what));
}

Tensor DecoderModel::reduce_partial_into(Tensor partial, Tensor reduced) {
  if (shard_.tp == 1) return partial;
  if (!shard_.sequence_parallel) {
    tp_->all_reduce(partial);
    return partial;
  }
  tp_->reduce_scatter(reduced, partial);
  return reduced;
}

void DecoderModel::attention_core_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l,
                                          LayerActivations& x, TensorAllocator& scratch) {
  const bool norm = config_.qk_norm;
  ops_.qk_norm_rope_forward(x.qkv_rot, x.qk_rstd, x.qkv, norm ? param(w, ParamKind::q_norm, l) : Tensor{},
                            norm ? param(w, ParamKind::k_norm, l) : Tensor{}, batch.rows, heads_, eps_,
                            rope_);
  if (cp_ && ring_size_ > 0)
    context_ring_forward(batch, x, scratch);
  else if (cp_)
    context_attention_forward(batch, x, scratch);
  else
    ops_.attention_forward(x.attn, x.lse, x.qkv_rot, batch.rows, heads_);
}

Tensor DecoderModel::context_whole(const MicroBatch& batch, Tensor qkv_rot, TensorAllocator& scratch) {
  LOOM_ASSERT(!batch.context.empty(), "a micro-batch without its CP split under context parallelism");
  const int64_t t = qkv_rot.shape[0], width = heads_.total_heads() * heads_.head_dim;
  const int64_t t_all = batch.cp_row_order.numel();
  Tensor gathered = scratch.allocate({t_all, width}, qkv_rot.dtype, "qkv of every CP rank");
  cp_->all_gather(gathered, qkv_rot.reshaped({t, width}));
  Tensor whole = scratch.allocate({t_all, width}, qkv_rot.dtype, "qkv of the whole rows");
  ops_.gather_rows(whole, gathered, batch.cp_row_order);
  return whole.reshaped({t_all, heads_.total_heads(), heads_.head_dim});
}

void DecoderModel::context_attention_forward(const MicroBatch& batch, LayerActivations& x,
                                             TensorAllocator& scratch) {
  const size_t mark = scratch.mark();
  const Tensor whole = context_whole(batch, x.qkv_rot, scratch);
  ops_.attention_context_forward(x.attn, x.lse, x.qkv_rot, whole, batch.context, heads_);
  scratch.release_to(mark);
}

void DecoderModel::context_attention_backward(const MicroBatch& batch, const LayerActivations& x,
                                              Tensor d_qkv, Tensor d_attn, TensorAllocator& scratch) {
  const size_t mark = scratch.mark();
  // K and V are gathered again rather than kept from the forward (Megatron's all-gather CP
  // does the same): a layer's whole-row copy would be cp times its qkv.
  const Tensor whole = context_whole(batch, x.qkv_rot, scratch);
  const int64_t t = d_qkv.shape[0], t_all = whole.shape[0], width = heads_.total_heads() * heads_.head_dim;
  Tensor d_whole = scratch.allocate(whole.shape, whole.dtype, "qkv gradient of the whole rows");
  ops_.attention_context_backward(d_qkv, d_whole, d_attn, x.attn, x.lse, x.qkv_rot, whole, batch.context,
                                  heads_);
  // Back into the gathered order, then each rank's tokens summed over the CP ranks in rank
  // order (the Comm's deterministic sum): its keys' and values' gradients from every query.
  Tensor d_gathered = scratch.allocate({t_all, width}, whole.dtype, "qkv gradient of every CP rank");
  ops_.gather_rows(d_gathered, d_whole.reshaped({t_all, width}), batch.cp_rank_order);
  Tensor d_mine = scratch.allocate({t, width}, whole.dtype, "qkv gradient from every CP rank's queries");
  cp_->reduce_scatter(d_mine, d_gathered);
  // d_qkv's k and v heads are 0 and d_mine's q heads a sum of zeros: the add puts each in place.
  const Tensor flat = d_qkv.reshaped({t, width});
  ops_.add(flat, flat, d_mine);
  scratch.release_to(mark);
}

Tensor DecoderModel::context_kv_rows(int64_t tokens, TensorAllocator& scratch) {
  const int64_t nh = heads_.total_heads(), nq = heads_.q_heads, width = 2 * heads_.kv_heads;
  std::vector<int32_t> rows(static_cast<size_t>(tokens * width));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < width; ++h)
      rows[static_cast<size_t>(t * width + h)] = static_cast<int32_t>(t * nh + nq + h);
  Tensor index = scratch.allocate({tokens * width}, DType::i32, "k and v heads' rows of qkv");
  ops_.copy_from_host(index, rows.data());
  return index;
}

void DecoderModel::context_ring_forward(const MicroBatch& batch, LayerActivations& x,
                                        TensorAllocator& scratch) {
  LOOM_ASSERT(!batch.context.empty(), "a micro-batch without its CP split under context parallelism");
  const size_t mark = scratch.mark();
  const int64_t t = x.qkv_rot.shape[0], nh = heads_.total_heads(), hd = heads_.head_dim;
  const int64_t width = 2 * heads_.kv_heads;
  const Tensor kv_rows = context_kv_rows(t, scratch);
  // Two block buffers: the one held, and the one the next block arrives in meanwhile.
  const Tensor blocks[2] = {scratch.allocate({t, width, hd}, x.qkv_rot.dtype, "K/V block held"),
                            scratch.allocate({t, width, hd}, x.qkv_rot.dtype, "K/V block arriving")};
  ops_.gather_rows(blocks[0].reshaped({t * width, hd}), x.qkv_rot.reshaped({t * nh, hd}), kv_rows);
  const Tensor part = scratch.allocate(x.attn.shape, x.attn.dtype, "attention of one K/V block");
  const Tensor part_lse = scratch.allocate(x.lse.shape, DType::f32, "log-sum-exp of one K/V block");
  const std::vector<RingStep> schedule = context_ring_schedule(ring_size_, ring_rank_);
  for (size_t s = 0; s < schedule.size(); ++s) {
    const Tensor held = blocks[s % 2];
    const bool more = s + 1 < schedule.size();
    const TpPending next = more ? cp_->start_shift(blocks[(s + 1) % 2], held) : TpPending{};
    const Tensor keys = batch.cp_rank_order.rows(schedule[s].block * t, t);
    if (s == 0) {
      ops_.attention_block_forward(x.attn, x.lse, x.qkv_rot, held, keys, batch.context, heads_);
    } else {
      ops_.attention_block_forward(part, part_lse, x.qkv_rot, held, keys, batch.context, heads_);
      ops_.attention_block_merge(x.attn, x.lse, part, part_lse);
    }
    if (more) cp_->wait(next);
  }
  scratch.release_to(mark);
}

void DecoderModel::context_ring_backward(const MicroBatch& batch, const LayerActivations& x, Tensor d_qkv,
                                         Tensor d_attn, TensorAllocator& scratch) {
  LOOM_ASSERT(!batch.context.empty(), "a micro-batch without its CP split under context parallelism");
  const size_t mark = scratch.mark();
  const int64_t t = x.qkv_rot.shape[0], nh = heads_.total_heads(), hd = heads_.head_dim;
  const int64_t width = 2 * heads_.kv_heads;
  const DType dtype = x.qkv_rot.dtype;
  const Tensor kv_rows = context_kv_rows(t, scratch);
  // The K/V blocks travel again as in the forward (rather than keeping the cp − 1 others per
  // layer); beside them each block's dK/dV accumulator, which follows its block one step behind.
  const Tensor blocks[2] = {scratch.allocate({t, width, hd}, dtype, "K/V block held"),
                            scratch.allocate({t, width, hd}, dtype, "K/V block arriving")};
  const Tensor d_blocks[2] = {scratch.allocate({t, width, hd}, dtype, "K/V block gradient held"),
                              scratch.allocate({t, width, hd}, dtype, "K/V block gradient arriving")};
  const Tensor d_part = scratch.allocate({t, width, hd}, dtype, "K/V block gradient of this rank's queries");
  ops_.gather_rows(blocks[0].reshaped({t * width, hd}), x.qkv_rot.reshaped({t * nh, hd}), kv_rows);
  ops_.fill_zero(d_qkv);  // its q heads sum the blocks' dQ; its k and v heads are written last
  const std::vector<RingStep> schedule = context_ring_schedule(ring_size_, ring_rank_);
  TpPending d_arriving;
  for (size_t s = 0; s < schedule.size(); ++s) {
    const Tensor held = blocks[s % 2], d_held = d_blocks[s % 2];
    const bool more = s + 1 < schedule.size();
    const TpPending next = more ? cp_->start_shift(blocks[(s + 1) % 2], held) : TpPending{};
    const Tensor keys = batch.cp_rank_order.rows(schedule[s].block * t, t);
    // This rank's queries' part of the block's dK/dV, computed while the part the ranks before
    // it summed arrives (the first step's block is this rank's own: nothing arrives).
    const Tensor d_mine = s == 0 ? d_held : d_part;
    ops_.fill_zero(d_mine);
    ops_.attention_block_backward(d_qkv, d_mine, d_attn, x.attn, x.lse, x.qkv_rot, held, keys, batch.context,
                                  heads_);
    if (s > 0) {
      cp_->wait(d_arriving);
      const Tensor flat = d_held.reshaped({t, width * hd});
      ops_.add(flat, flat, d_part.reshaped({t, width * hd}));
    }
    // On to the next rank, which holds this block at its next step; after the last step, back
    // to the block's own rank.
    d_arriving = cp_->start_shift(d_blocks[(s + 1) % 2], d_held);
    if (more) cp_->wait(next);
  }
  cp_->wait(d_arriving);
  ops_.scatter_rows(d_qkv.reshaped({t * nh, hd}), d_blocks[schedule.size() % 2].reshaped({t * width, hd}),
                    kv_rows);
  scratch.release_to(mark);
}

void DecoderModel::layer_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l,
                                 LayerActivations& x, const LayerActivations* prev, Activations& a,
                                 TensorAllocator& scratch, const AttentionCore* core) {
  const ResidualDelta& delta = a.delta;
  const int64_t t = batch.ids.numel(), ts = stream_tokens(t), h = config_.hidden_size, f = ffn_;
  const int64_t nq = heads_.q_heads, nh = heads_.total_heads(), hd = heads_.head_dim;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };

  // Each linear layer's input is written by the op before it (a norm, the attention, SwiGLU)
  // into the buffer the layer asks for, with the slot that travels with it (linear.h).
  if (!x.qkv_in.x.data) {
    x.qkv_in = linears_.input(l, ParamKind::qkv, ts, h, a.linear_inputs, scratch, "input norm output");
    x.rstd1 = alloc({ts}, DType::f32, "input norm rstd");
    if (x.residual_in.data) {
      ops_.rmsnorm_forward(x.qkv_in.x, x.rstd1, x.residual_in, param(w, ParamKind::input_norm, l), eps_,
                           x.qkv_in.amax);
    } else {
      LOOM_ASSERT(prev, "layer_forward needs the layer's input or the previous layer");
      x.residual_in = alloc({ts, h}, act, "residual stream");
      ops_.residual_rmsnorm_forward(x.residual_in, x.qkv_in.x, x.rstd1, prev->residual_mid, prev->down,
                                    param(w, ParamKind::input_norm, l), eps_, x.qkv_in.amax);
    }
  }
  x.qkv = alloc({t, nh, hd}, act, "qkv projection");
  linear_forward(w, batch, x.qkv.reshaped({t, nh * hd}), x.qkv_in,
                 gather_sequence_into(x.qkv_in.x, a.gathered), scratch);
  if (config_.qk_norm) x.qk_rstd = alloc({t, nq + heads_.kv_heads}, DType::f32, "q/k norm rstd");
  if (core) {
    x.qkv_rot = core->qkv_rot;
    x.attn = core->attn;
    x.lse = core->lse;
  } else {
    x.qkv_rot = alloc({t, nh, hd}, act, "qkv after q/k norm and rope");
    x.attn = alloc({t, nq, hd}, act, "attention output");
    x.lse = alloc({nq, t}, DType::f32, "attention log-sum-exp");
  }
  attention_core_forward(w, batch, l, x, scratch);
  x.o_proj_in = linears_.input_of(l, ParamKind::o_proj, x.attn.reshaped({t, nq * hd}), scratch);
  linear_forward(w, batch, delta.partial, x.o_proj_in, x.o_proj_in.x, scratch);
  const Tensor o = reduce_partial_into(delta.partial, delta.reduced);
  x.residual_mid = alloc({ts, h}, act, "residual stream");
  // A sparse layer's experts keep their own input (the router's weight gradient reads it).
  const bool sparse = config_.sparse_layer(l);
  if (sparse) {
    x.gate_up_in = LinearInput{};
    x.gate_up_in.x = alloc({ts, h}, act, "post-attention norm output (the experts' input)");
  } else {
    x.gate_up_in =
        linears_.input(l, ParamKind::gate_up, ts, h, a.linear_inputs, scratch, "post-attention norm output");
  }
  x.rstd2 = alloc({ts}, DType::f32, "post-attention norm rstd");
  ops_.residual_rmsnorm_forward(x.residual_mid, x.gate_up_in.x, x.rstd2, x.residual_in, o,
                                param(w, ParamKind::post_attn_norm, l), eps_, x.gate_up_in.amax);
  if (sparse) {
    experts_forward(w, batch, l, x, a, scratch);
    return;
  }
  x.gate_up = alloc({t, 2 * f}, act, "gate/up projection");
  linear_forward(w, batch, x.gate_up, x.gate_up_in, gather_sequence_into(x.gate_up_in.x, a.gathered),
                 scratch);
  x.down_in = linears_.input(l, ParamKind::down, t, f, a.linear_inputs, scratch, "swiglu output");
  ops_.swiglu_forward(x.down_in.x, x.gate_up, x.down_in.amax);
  linear_forward(w, batch, delta.partial, x.down_in, x.down_in.x, scratch);
  x.down = reduce_partial_into(delta.partial, delta.reduced);
}

Tensor DecoderModel::experts_view(const Tensor& stored) const {
  const int64_t e = local_experts_;
  return stored.reshaped({e, stored.shape[0] / e, stored.shape[1]});
}

void DecoderModel::expert_dispatch_plan(ExpertActivations& m, TensorAllocator& scratch) {
  const int64_t e = config_.num_experts, el = local_experts_, ep = shard_.ep, mine = shard_.ep_rank;
  std::vector<int32_t> offsets(static_cast<size_t>(e + 1));
  ops_.copy_to_host(offsets.data(), m.offsets);
  std::vector<int32_t> counts(static_cast<size_t>(e));
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = offsets[i + 1] - offsets[i];
  const std::vector<int32_t> all = ep_->all_gather_counts(counts);
  LOOM_ASSERT(all.size() == static_cast<size_t>(ep * e), "EP counts of another size");
  // count(s, j): the rows source rank s sends to this rank's local expert j.
  const auto count = [&](int64_t s, int64_t j) {
    return int64_t{all[static_cast<size_t>(s * e + mine * el + j)]};
  };
  m.send_rows.assign(static_cast<size_t>(ep), 0);
  m.recv_rows.assign(static_cast<size_t>(ep), 0);
  for (int64_t r = 0; r < ep; ++r) {
    m.send_rows[static_cast<size_t>(r)] =
        offsets[static_cast<size_t>((r + 1) * el)] - offsets[static_cast<size_t>(r * el)];
    for (int64_t j = 0; j < el; ++j) m.recv_rows[static_cast<size_t>(r)] += count(r, j);
  }
  // Received rows are by source rank, then the source's expert order; the local order is by
  // expert, then source rank: regroup[i] is the received row of local row i.
  std::vector<int64_t> source_first(static_cast<size_t>(ep), 0);
  for (int64_t s = 1; s < ep; ++s)
    source_first[static_cast<size_t>(s)] =
        source_first[static_cast<size_t>(s - 1)] + m.recv_rows[static_cast<size_t>(s - 1)];
  std::vector<int32_t> regroup, local_offsets(static_cast<size_t>(el + 1), 0);
  regroup.reserve(static_cast<size_t>(std::accumulate(m.recv_rows.begin(), m.recv_rows.end(), int64_t{0})));
  std::vector<int64_t> within(static_cast<size_t>(ep), 0);  // rows of each source's earlier experts
  for (int64_t j = 0; j < el; ++j) {
    for (int64_t s = 0; s < ep; ++s) {
      const int64_t first = source_first[static_cast<size_t>(s)] + within[static_cast<size_t>(s)];
      for (int64_t i = 0; i < count(s, j); ++i) regroup.push_back(static_cast<int32_t>(first + i));
      within[static_cast<size_t>(s)] += count(s, j);
    }
    local_offsets[static_cast<size_t>(j + 1)] = static_cast<int32_t>(regroup.size());
  }
  const auto rows = static_cast<int64_t>(regroup.size());
  m.local_offsets = scratch.allocate({el + 1}, DType::i32, "local experts' first rows");
  ops_.copy_from_host(m.local_offsets, local_offsets.data());
  // At least one row, so that an EP rank no token reaches still has tensors to point at.
  m.regroup = scratch.allocate({std::max<int64_t>(rows, 1)}, DType::i32, "local rows' received rows");
  if (rows > 0) ops_.copy_from_host(m.regroup, regroup.data());
  m.regroup = m.regroup.rows(0, rows);
}

void DecoderModel::expert_dispatch(const ExpertActivations& m, Tensor local, Tensor sorted,
                                   TensorAllocator& scratch) {
  const int64_t rows = m.regroup.numel();
  const size_t mark = scratch.mark();
  Tensor received =
      scratch.allocate({std::max<int64_t>(rows, 1), sorted.shape[1]}, sorted.dtype, "received rows");
  ep_->all_to_all(received, m.recv_rows, sorted, m.send_rows);
  if (rows > 0) ops_.gather_rows(local.rows(0, rows), received.rows(0, rows), m.regroup);
  scratch.release_to(mark);
}

void DecoderModel::expert_return(const ExpertActivations& m, Tensor sorted, Tensor local,
                                 TensorAllocator& scratch) {
  const int64_t rows = m.regroup.numel();
  const size_t mark = scratch.mark();
  Tensor received =
      scratch.allocate({std::max<int64_t>(rows, 1), local.shape[1]}, local.dtype, "rows to return");
  if (rows > 0) ops_.scatter_rows(received.rows(0, rows), local.rows(0, rows), m.regroup);
  ep_->all_to_all(sorted, m.send_rows, received, m.recv_rows);
  scratch.release_to(mark);
}

void DecoderModel::experts_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l,
                                   LayerActivations& x, Activations& a, TensorAllocator& scratch) {
  const Tensor in = x.gate_up_in.x;
  const int64_t t = in.shape[0], h = config_.hidden_size, e = config_.num_experts;
  const int64_t k = config_.num_experts_per_tok, f = config_.moe_intermediate_size, rows = t * k;
  const bool parallel = shard_.ep > 1;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };
  ExpertActivations& m = x.experts;
  m.logits = alloc({t, e}, act, "router logits");
  ops_.linear_forward(m.logits, in, param(w, ParamKind::router, l), Tensor{});
  m.probs = alloc({t, e}, DType::f32, "router probs");
  m.ids = alloc({t, k}, DType::i32, "routed experts");
  m.weights = alloc({t, k}, DType::f32, "routing weights");
  ops_.moe_route_forward(m.ids, m.weights, m.probs, m.logits, config_.norm_topk_prob);
  m.positions = alloc({t, k}, DType::i32, "dispatch positions");
  m.offsets = alloc({e + 1}, DType::i32, "experts' first rows");
  ops_.moe_sort(m.positions, m.offsets, m.ids);
  // A recompute's forward finds the census taken (the same routing) and its gradient set.
  if (batch.routing_census) {
    LayerRouting& routing = a.routing[static_cast<size_t>(l - shard_.layer_begin)];
    if (routing.tokens.empty()) routing = routing_census(m, scratch);
  }
  // The rows this rank's experts run: the dispatch order's own, or (EP) every EP rank's rows of
  // its experts.
  int64_t local_rows = rows;
  if (parallel) {
    expert_dispatch_plan(m, scratch);
    local_rows = m.regroup.numel();
    m.local = alloc({std::max<int64_t>(local_rows, 1), h}, act, "experts' input (local order)");
  }
  const Tensor offsets = parallel ? m.local_offsets : m.offsets;
  m.gate_up = alloc({std::max<int64_t>(local_rows, 1), 2 * f}, act, "experts' gate/up projection");
  m.y = alloc({rows, h}, act, "experts' down projection");
  const size_t mark = scratch.mark();
  Tensor sorted = alloc({rows, h}, act, "experts' input (dispatch order)");
  ops_.moe_permute(sorted, in, m.positions);
  if (parallel) expert_dispatch(m, m.local, sorted, scratch);
  ops_.grouped_linear_forward(m.gate_up, parallel ? m.local : sorted,
                              experts_view(param(w, ParamKind::experts_gate_up, l)), offsets);
  Tensor swiglu = alloc({std::max<int64_t>(local_rows, 1), f}, act, "experts' swiglu output");
  ops_.swiglu_forward(swiglu, m.gate_up, Tensor{});
  if (parallel) {
    Tensor y_local =
        alloc({std::max<int64_t>(local_rows, 1), h}, act, "experts' down projection (local order)");
    ops_.grouped_linear_forward(y_local, swiglu, experts_view(param(w, ParamKind::experts_down, l)), offsets);
    expert_return(m, m.y, y_local, scratch);
  } else {
    ops_.grouped_linear_forward(m.y, swiglu, experts_view(param(w, ParamKind::experts_down, l)), offsets);
  }
  scratch.release_to(mark);
  // The output goes where a dense layer's reduced down projection would (ResidualDelta): the
  // next norm adds it to the residual stream. No TP reduction: the experts ran on whole rows.
  x.down = a.delta.reduced;
  ops_.moe_combine_forward(x.down, m.y, m.positions, m.weights);
}

void DecoderModel::experts_backward(const ModelTensors& w, const MicroBatch&, int64_t l,
                                    const LayerActivations& x, Tensor d_out, const BackwardBuffers& g,
                                    const LayerRouting* routing, TensorAllocator& scratch) {
  const ExpertActivations& m = x.experts;
  const Tensor in = x.gate_up_in.x;
  const int64_t t = in.shape[0], h = config_.hidden_size, e = config_.num_experts;
  const int64_t k = config_.num_experts_per_tok, f = config_.moe_intermediate_size, rows = t * k;
  const bool parallel = shard_.ep > 1;
  const int64_t local_rows = parallel ? std::max<int64_t>(m.regroup.numel(), 1) : rows;
  const Tensor offsets = parallel ? m.local_offsets : m.offsets;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };
  const size_t mark = scratch.mark();
  // d_rows holds the down projection's output gradient, then (its last reader done) the
  // gradient of the permuted input; under EP, d_local holds the same two in the local order.
  Tensor d_rows = alloc({rows, h}, act, "experts' output gradient (dispatch order)");
  Tensor d_weights = alloc({t, k}, DType::f32, "routing weights' gradient");
  ops_.moe_combine_backward(d_rows, d_weights, d_out, m.y, m.positions, m.weights);
  Tensor d_local = d_rows;
  if (parallel) {
    d_local = alloc({local_rows, h}, act, "experts' output gradient (local order)");
    expert_dispatch(m, d_local, d_rows, scratch);
  }
  Tensor swiglu = alloc({local_rows, f}, act, "experts' swiglu output (again)");
  ops_.swiglu_forward(swiglu, m.gate_up, Tensor{});
  Tensor d_swiglu = alloc({local_rows, f}, act, "experts' swiglu output gradient");
  ops_.grouped_linear_backward(d_swiglu, experts_view(grad(w, ParamKind::experts_down, l)), d_local, swiglu,
                               experts_view(param(w, ParamKind::experts_down, l)), offsets);
  Tensor d_gate_up = alloc({local_rows, 2 * f}, act, "experts' gate/up gradient");
  ops_.swiglu_backward(d_gate_up, d_swiglu, m.gate_up, Tensor{});
  Tensor sorted = m.local;
  if (!parallel) {
    sorted = alloc({rows, h}, act, "experts' input (dispatch order, again)");
    ops_.moe_permute(sorted, in, m.positions);
  }
  ops_.grouped_linear_backward(d_local, experts_view(grad(w, ParamKind::experts_gate_up, l)), d_gate_up,
                               sorted, experts_view(param(w, ParamKind::experts_gate_up, l)), offsets);
  if (parallel) expert_return(m, d_rows, d_local, scratch);
  Tensor d_probs_per_expert;
  if (routing && !routing->d_probs.empty()) {
    const std::vector<float> values(routing->d_probs.begin(), routing->d_probs.end());
    d_probs_per_expert = alloc({e}, DType::f32, "load-balancing loss gradient per expert");
    ops_.copy_from_host(d_probs_per_expert, values.data());
  }
  Tensor d_logits = alloc({t, e}, act, "router logits' gradient");
  ops_.moe_route_backward(d_logits, d_weights, d_probs_per_expert, m.probs, m.ids, m.weights,
                          config_.norm_topk_prob);
  ops_.linear_backward(g.d_norm, grad(w, ParamKind::router, l), d_logits, in, param(w, ParamKind::router, l));
  ops_.moe_permute_backward(g.d_norm, d_rows, m.positions, true);
  scratch.release_to(mark);
}

LayerRouting DecoderModel::routing_census(const ExpertActivations& m, TensorAllocator& scratch) {
  const int64_t e = config_.num_experts;
  std::vector<int32_t> offsets(static_cast<size_t>(e + 1));
  ops_.copy_to_host(offsets.data(), m.offsets);
  // Row 0 the tokens per expert (integers, exact in fp32 below 2^24 pairs), row 1 the
  // probability sums: one all-reduce for both under sequence parallel.
  std::vector<float> census(static_cast<size_t>(2 * e));
  for (size_t i = 0; i < static_cast<size_t>(e); ++i)
    census[i] = static_cast<float>(offsets[i + 1] - offsets[i]);
  const size_t mark = scratch.mark();
  Tensor both = scratch.allocate({2, e}, DType::f32, "routing census");
  ops_.column_sum(both.rows(1, 1).reshaped({e}), m.probs);
  if (shard_.sequence_parallel && shard_.tp > 1) {
    ops_.copy_from_host(both.rows(0, 1), census.data());
    tp_->all_reduce(both);
    ops_.copy_to_host(census.data(), both);
  } else {
    ops_.copy_to_host(census.data() + e, both.rows(1, 1));
  }
  scratch.release_to(mark);
  LayerRouting routing;
  routing.tokens.assign(census.begin(), census.begin() + e);
  routing.probs.assign(census.begin() + e, census.end());
  return routing;
}

void DecoderModel::routing_census_begin() {
  routing_stats_ = RoutingStats{};
  routing_stats_.expert_tokens.assign(static_cast<size_t>(config_.sparse_layers()),
                                      std::vector<double>(static_cast<size_t>(config_.num_experts), 0.0));
}

RoutingStats DecoderModel::routing_census_end() {
  RoutingStats stats = std::move(routing_stats_);
  routing_stats_ = RoutingStats{};
  return stats;
}

void DecoderModel::aux_loss_backward(const MicroBatch& batch, Activations& a, float grad_scale) {
  if (!batch.routing_census || config_.num_experts == 0) return;
  const int64_t t = batch.ids.numel();
  std::vector<LayerRouting*> local;  // this stage's sparse layers' census
  const std::vector<int64_t> sparse = config_.sparse_layer_numbers();
  for (size_t index = 0; index < sparse.size(); ++index) {
    const int64_t l = sparse[index];
    if (l < shard_.layer_begin || l >= shard_.layer_end) continue;
    LayerRouting& r = a.routing[static_cast<size_t>(l - shard_.layer_begin)];
    if (!routing_stats_.expert_tokens.empty())
      for (size_t e = 0; e < r.tokens.size(); ++e) routing_stats_.expert_tokens[index][e] += r.tokens[e];
    local.push_back(&r);
  }
  // d(objective)/d(term) as the backward forms it: grad_scale · weight · coef.
  const double scale = static_cast<double>(grad_scale) * batch.aux_loss_weight * aux_.coef;
  const auto apply = [&](LayerRouting& r, const std::vector<double>& d_probs) {
    r.d_probs.resize(d_probs.size());
    for (size_t e = 0; e < d_probs.size(); ++e) r.d_probs[e] = scale * d_probs[e];
  };
  if (aux_.kind == MoeAuxLossKind::hf && !local.empty()) {
    LOOM_ASSERT(static_cast<int64_t>(local.size()) == config_.sparse_layers(),
                "the hf aux loss needs every sparse layer on one stage");
    const AuxLossTerm term = hf_aux_loss({local.begin(), local.end()}, t);
    routing_stats_.aux_loss_sum += term.value;
    ++routing_stats_.aux_loss_terms;
    for (LayerRouting* r : local) apply(*r, term.d_probs);
  } else if (aux_.kind == MoeAuxLossKind::megatron) {
    for (LayerRouting* r : local) {
      const AuxLossTerm term = megatron_aux_loss(*r, config_.num_experts_per_tok, t);
      routing_stats_.aux_loss_sum += term.value;
      ++routing_stats_.aux_loss_terms;
      apply(*r, term.d_probs);
    }
  }
}

DecoderModel::LayerActivations& DecoderModel::layer_of(Activations& a, int64_t l) const {
  return a.layers[static_cast<size_t>(l - shard_.layer_begin)];
}

DecoderModel::Activations DecoderModel::stage_forward(const ModelTensors& w, const MicroBatch& batch,
                                                      Tensor input, TensorAllocator& scratch) {
  const int64_t t = batch.ids.numel();
  LOOM_ASSERT(stream_tokens(t) * (shard_.sequence_parallel ? shard_.tp : 1) == t,
              "sequence parallel needs micro-batches of a multiple of tp tokens");
  Activations a;
  a.embed = input_forward(w, batch, input, scratch);
  stage_buffers_allocate(a, t, scratch);
  layers_forward(w, batch, a, scratch);
  return a;
}

Tensor DecoderModel::input_forward(const ModelTensors& w, const MicroBatch& batch, Tensor input,
                                   TensorAllocator& scratch) {
  if (!shard_.first_stage) return input;
  const int64_t t = batch.ids.numel(), h = config_.hidden_size;
  const DType act = ops_.activation_dtype();
  if (shard_.tp == 1) {
    Tensor embed = scratch.allocate({t, h}, act, "embedding output");
    ops_.embedding_forward(embed, batch.ids, param(w, ParamKind::embedding));
    return embed;
  }
  // Vocab-parallel: each rank looks up the ids of its rows, zeros elsewhere; the sum over
  // TP is the embedding.
  Tensor partial = scratch.allocate({t, h}, act, "embedding output (vocab shard)");
  ops_.embedding_forward_shard(partial, batch.ids, param(w, ParamKind::embedding),
                               shard_vocab_begin(config_, shard_.tp, shard_.tp_rank));
  return reduce_partial(partial, scratch, "embedding output (sequence reduce-scatter)");
}

void DecoderModel::stage_buffers_allocate(Activations& a, int64_t t, TensorAllocator& scratch) {
  const int64_t ts = stream_tokens(t), h = config_.hidden_size;
  const int64_t nq = heads_.q_heads, nh = heads_.total_heads(), hd = heads_.head_dim;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };
  // The final norm's tensors come first: under full recompute the last layer's tensors are
  // freed once the final residual add has written them.
  if (shard_.last_stage) {
    a.residual_final = alloc({ts, h}, act, "residual stream");
    a.final_norm = alloc({ts, h}, act, "final norm output");
    a.final_rstd = alloc({ts}, DType::f32, "final norm rstd");
  } else {
    a.output = alloc({ts, h}, act, "residual stream (stage output)");
  }
  a.delta.partial = alloc({t, h}, act, "o_proj / down output (every layer's in turn)");
  a.delta.reduced = shard_.sequence_parallel && shard_.tp > 1
                        ? alloc({ts, h}, act, "o_proj / down output (sequence reduce-scatter)")
                        : a.delta.partial;
  if (shard_.sequence_parallel)
    a.gathered = alloc({t, h}, act, "norm output (sequence all-gather, every layer's)");
  a.linear_inputs = linears_.shared_inputs(shard_.layer_begin, shard_.layer_end, t, h, ffn_, scratch);
  if (recompute_.granularity == RecomputePolicy::Granularity::selective)
    a.core = {alloc({t, nh, hd}, act, "qkv after q/k norm and rope (recomputed)"),
              alloc({t, nq, hd}, act, "attention output (recomputed)"),
              alloc({nq, t}, DType::f32, "attention log-sum-exp (recomputed)")};
}

void DecoderModel::layers_forward(const ModelTensors& w, const MicroBatch& batch, Activations& a,
                                  TensorAllocator& scratch) {
  const int64_t first = shard_.layer_begin, end = shard_.layer_end;
  const AttentionCore* core =
      recompute_.granularity == RecomputePolicy::Granularity::selective ? &a.core : nullptr;
  a.layers.resize(static_cast<size_t>(end - first));
  if (batch.routing_census) a.routing.assign(static_cast<size_t>(end - first), LayerRouting{});
  a.layers[0].residual_in = a.embed;
  size_t chunk = 0;
  for (int64_t l = first; l < end;) {
    if (chunk < chunks_.size() && chunks_[chunk].begin == l) {
      l = chunks_[chunk].end;
      recompute_chunk_forward(w, batch, chunk++, a, scratch);
      continue;
    }
    layer_forward(w, batch, l, layer_of(a, l), l == first ? nullptr : &layer_of(a, l - 1), a, scratch, core);
    ++l;
  }
  const LayerActivations& last = a.layers.back();
  if (last.down.data)  // else the last chunk of full recompute wrote the stage's end
    stage_output_forward(w, last, a, a.final_norm, a.final_rstd);
}

void DecoderModel::recompute_chunk_forward(const ModelTensors& w, const MicroBatch& batch, size_t index,
                                           Activations& a, TensorAllocator& scratch) {
  // A chunk of full recompute keeps only its input (stored by the layer before) and writes
  // the next layer's input before its own tensors are freed.
  const LayerChunk c = chunks_[index];
  const int64_t ts = stream_tokens(batch.ids.numel()), h = config_.hidden_size, end = shard_.layer_end;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };
  Tensor next_residual, next_norm, next_rstd;
  const bool offload_next = offloaded(index + 1);
  if (c.end < end) {
    LayerActivations& next = layer_of(a, c.end);
    next_residual = next.residual_in = offload_next
                                           ? offload_->slot(index + 1, {ts, h}, act)
                                           : alloc({ts, h}, act, "residual stream (recompute chunk input)");
    // A next layer outside any chunk keeps its norm output, so it is computed here once.
    if (index + 1 >= chunks_.size() || chunks_[index + 1].begin != c.end) {
      next.qkv_in =
          linears_.input_of(c.end, ParamKind::qkv, alloc({ts, h}, act, "input norm output"), scratch);
      next_norm = next.qkv_in.x;
      next_rstd = next.rstd1 = alloc({ts}, DType::f32, "input norm rstd");
    }
  } else {
    next_norm = a.final_norm;
    next_rstd = a.final_rstd;
  }
  const size_t mark = scratch.mark();
  chunk_forward(w, batch, c, a, scratch);
  const LayerActivations& last = layer_of(a, c.end - 1);
  if (c.end < end) {
    if (!next_norm.data) {  // the next chunk recomputes its input norm: this one is thrown away
      next_norm = alloc({ts, h}, act, "input norm output (discarded)");
      next_rstd = alloc({ts}, DType::f32, "input norm rstd (discarded)");
    }
    ops_.residual_rmsnorm_forward(next_residual, next_norm, next_rstd, last.residual_mid, last.down,
                                  param(w, ParamKind::input_norm, c.end), eps_, Tensor{});
    if (offload_next) offload_->to_host(index + 1);  // beside the next chunk's forward
  } else {
    stage_output_forward(w, last, a, next_norm, next_rstd);
  }
  scratch.release_to(mark);
  for (int64_t k = c.begin; k < c.end; ++k) {
    LayerActivations& x = layer_of(a, k);
    // An offloaded input is on the host now; its slot goes to a later chunk.
    const Tensor kept = k == c.begin && !offloaded(index) ? x.residual_in : Tensor{};
    x = LayerActivations{};
    x.residual_in = kept;
  }
}

bool DecoderModel::offloaded(size_t index) const {
  return offload_ && index >= 1 && index < chunks_.size() && chunks_[index - 1].end == chunks_[index].begin;
}

void DecoderModel::stage_output_forward(const ModelTensors& w, const LayerActivations& last, Activations& a,
                                        Tensor norm, Tensor rstd) {
  if (shard_.last_stage)
    ops_.residual_rmsnorm_forward(a.residual_final, norm, rstd, last.residual_mid, last.down,
                                  param(w, ParamKind::final_norm), eps_, Tensor{});
  else
    ops_.add(a.output, last.residual_mid, last.down);
}

void DecoderModel::chunk_forward(const ModelTensors& w, const MicroBatch& batch, const LayerChunk& c,
                                 Activations& a, TensorAllocator& scratch) {
  for (int64_t l = c.begin; l < c.end; ++l)
    layer_forward(w, batch, l, layer_of(a, l), l == c.begin ? nullptr : &layer_of(a, l - 1), a, scratch,
                  nullptr);
}

void DecoderModel::forward_logits(const ModelTensors& tensors, const MicroBatch& batch,
                                  TensorAllocator& scratch, Tensor logits) {
  LOOM_ASSERT(shard_.tp == 1 && shard_.first_stage && shard_.last_stage,
              "forward_logits runs the whole model");
  Activations a = stage_forward(tensors, batch, Tensor{}, scratch);
  ops_.linear_forward(logits, a.final_norm, param(tensors, ParamKind::lm_head), Tensor{});
}

double DecoderModel::forward_backward(const ModelTensors& w, const MicroBatch& batch,
                                      TensorAllocator& scratch, float grad_scale) {
  LOOM_ASSERT(shard_.first_stage && shard_.last_stage, "forward_backward runs every layer");
  Activations a = stage_forward(w, batch, Tensor{}, scratch);
  return stage_backward(w, batch, a, Tensor{}, scratch, grad_scale, nullptr);
}

Tensor DecoderModel::head_backward(const ModelTensors& w, const MicroBatch& batch, const Activations& a,
                                   Tensor* nll, TensorAllocator& scratch, float grad_scale) {
  const int64_t t = batch.ids.numel(), h = config_.hidden_size;
  const DType act = ops_.activation_dtype();
  Tensor hidden = shard_.tp == 1
                      ? a.final_norm
                      : gather_sequence(a.final_norm, scratch, "final norm output (sequence all-gather)");
  Tensor targets = batch.targets;
  const bool loss_rows_only = batch.loss_positions.data != nullptr;
  if (loss_rows_only) {
    Tensor rows = scratch.allocate({batch.loss_positions.numel(), h}, act, "final norm output (loss rows)");
    ops_.gather_rows(rows, hidden, batch.loss_positions);
    hidden = rows;
    targets = batch.loss_targets;
  }
  const int64_t r = hidden.shape[0];
  *nll = scratch.allocate({r}, DType::f32, "per-token nll");
  Tensor d_hidden = scratch.allocate({r, h}, act, "final norm gradient");
  if (shard_.tp == 1)
    ops_.lm_head_loss(*nll, d_hidden, grad(w, ParamKind::lm_head), hidden, param(w, ParamKind::lm_head),
                      targets, grad_scale);
  else
    head_backward_tp(w, hidden, targets, *nll, d_hidden, scratch, grad_scale);
  if (loss_rows_only) {
    // The positions without a target get a zero gradient; the padding rows are not put back.
    Tensor full = scratch.allocate({t, h}, act, "final norm gradient (every position)");
    ops_.fill_zero(full);
    const Tensor positions{
        batch.loss_positions.data, {batch.loss_rows}, DType::i32, batch.loss_positions.device};
    ops_.scatter_rows(full, d_hidden, positions);
    d_hidden = full;
  }
  return shard_.tp == 1 ? d_hidden
                        : reduce_partial(d_hidden, scratch, "final norm gradient (sequence reduce-scatter)");
}

double DecoderModel::stage_loss(const ModelTensors& w, const MicroBatch& batch, const Activations& a,
                                TensorAllocator& scratch) {
  if (!shard_.last_stage) return 0.0;
  Tensor hidden = shard_.tp == 1
                      ? a.final_norm
                      : gather_sequence(a.final_norm, scratch, "final norm output (sequence all-gather)");
  Tensor targets = batch.targets;
  if (batch.loss_positions.data != nullptr) {
    Tensor rows = scratch.allocate({batch.loss_positions.numel(), config_.hidden_size},
                                   ops_.activation_dtype(), "final norm output (loss rows)");
    ops_.gather_rows(rows, hidden, batch.loss_positions);
    hidden = rows;
    targets = batch.loss_targets;
  }
  const int64_t r = hidden.shape[0];
  Tensor nll = scratch.allocate({r}, DType::f32, "per-token nll");
  if (shard_.tp == 1) {
    ops_.lm_head_loss(nll, Tensor{}, Tensor{}, hidden, param(w, ParamKind::lm_head), targets, 0.0f);
  } else {
    const int64_t vocab_begin = shard_vocab_begin(config_, shard_.tp, shard_.tp_rank);
    Tensor lse_part = scratch.allocate({r}, DType::f32, "lm_head log-sum-exp (vocab shard)");
    Tensor lse_parts =
        scratch.allocate({shard_.tp, r}, DType::f32, "lm_head log-sum-exp (every vocab shard)");
    Tensor target_logit = scratch.allocate({r}, DType::f32, "target logit");
    Tensor lse = scratch.allocate({r}, DType::f32, "lm_head log-sum-exp");
    ops_.lm_head_shard_forward(lse_part, target_logit, hidden, param(w, ParamKind::lm_head), targets,
                               vocab_begin);
    tp_->all_gather(lse_parts, lse_part);
    tp_->all_reduce(target_logit);
    ops_.lm_head_shard_combine(nll, lse, lse_parts, target_logit, targets);
  }
  return ops_.sum(nll);
}

void DecoderModel::head_backward_tp(const ModelTensors& w, Tensor hidden, Tensor targets, Tensor nll,
                                    Tensor d_hidden, TensorAllocator& scratch, float grad_scale) {
  // Vocab-parallel (Megatron's VocabParallelCrossEntropy): each rank's log-sum-exp and
  // target logit over its vocabulary rows, put together over TP; then each rank's part of
  // the logits' gradient, whose d_hidden partial sums are reduced like a row-parallel output.
  const int64_t r = hidden.shape[0];
  const int64_t vocab_begin = shard_vocab_begin(config_, shard_.tp, shard_.tp_rank);
  const Tensor& weight = param(w, ParamKind::lm_head);
  Tensor lse_part = scratch.allocate({r}, DType::f32, "lm_head log-sum-exp (vocab shard)");
  Tensor lse_parts = scratch.allocate({shard_.tp, r}, DType::f32, "lm_head log-sum-exp (every vocab shard)");
  Tensor target_logit = scratch.allocate({r}, DType::f32, "target logit");
  Tensor lse = scratch.allocate({r}, DType::f32, "lm_head log-sum-exp");
  ops_.lm_head_shard_forward(lse_part, target_logit, hidden, weight, targets, vocab_begin);
  tp_->all_gather(lse_parts, lse_part);
  tp_->all_reduce(target_logit);  // one rank holds each target: the sum is exact
  ops_.lm_head_shard_combine(nll, lse, lse_parts, target_logit, targets);
  ops_.lm_head_shard_backward(d_hidden, grad(w, ParamKind::lm_head), hidden, weight, targets, lse,
                              vocab_begin, grad_scale);
}

double DecoderModel::stage_backward(const ModelTensors& w, const MicroBatch& batch, Activations& a,
                                    Tensor d_output, TensorAllocator& scratch, float grad_scale,
                                    Tensor* d_input) {
  LOOM_ASSERT(w.grads.size() == w.params.size() || (w.grads.empty() && !w.adapter_grads.empty()),
              "stage_backward needs the grads of the weights or of LoRA's adapters");
  Tensor nll;
  BackwardBuffers g;
  g.d_residual = output_backward(w, batch, a, d_output, &nll, scratch, grad_scale);
  backward_buffers_allocate(g, batch.ids.numel(), scratch);
  aux_loss_backward(batch, a, grad_scale);
  size_t chunk = chunks_.size(), chunk_mark = 0;
  for (int64_t l = shard_.layer_end - 1; l >= shard_.layer_begin; --l) {
    if (chunk > 0 && chunks_[chunk - 1].end - 1 == l) {
      chunk_mark = scratch.mark();
      if (offloaded(chunk - 1))  // back from the host; the chunk before starts coming too
        layer_of(a, chunks_[chunk - 1].begin).residual_in = offload_->from_host(
            chunk - 1, chunk >= 2 && offloaded(chunk - 2) ? chunk - 2 : ActivationOffload::kNone);
      linears_.census_pause(true);  // the forward's casts were counted the first time
      chunk_forward(w, batch, chunks_[chunk - 1], a, scratch);
      linears_.census_pause(false);
    }
    layer_backward(w, batch, l, a, g, scratch);
    if (chunk > 0 && chunks_[chunk - 1].begin == l) {
      scratch.release_to(chunk_mark);
      --chunk;
    }
  }
  input_backward(w, batch, g, d_input);
  return nll.data ? ops_.sum(nll) : 0.0;
}

Tensor DecoderModel::output_backward(const ModelTensors& w, const MicroBatch& batch, const Activations& a,
                                     Tensor d_output, Tensor* nll, TensorAllocator& scratch,
                                     float grad_scale) {
  // The output was the last layer's residual add: its gradient flows into both terms.
  if (!shard_.last_stage) return d_output;
  const Tensor d_final = head_backward(w, batch, a, nll, scratch, grad_scale);
  Tensor d_residual = scratch.allocate({stream_tokens(batch.ids.numel()), config_.hidden_size},
                                       ops_.activation_dtype(), "residual stream gradient");
  ops_.fill_zero(d_residual);
  ops_.rmsnorm_backward(d_residual, grad(w, ParamKind::final_norm), d_final, a.residual_final,
                        param(w, ParamKind::final_norm), a.final_rstd, Tensor{});
  return d_residual;
}

void DecoderModel::backward_buffers_allocate(BackwardBuffers& g, int64_t t, TensorAllocator& scratch) {
  const int64_t ts = stream_tokens(t), h = config_.hidden_size, f = ffn_;
  const int64_t nq = heads_.q_heads, nh = heads_.total_heads(), hd = heads_.head_dim;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };
  g.d_act = alloc({t, f}, act, "swiglu output gradient");
  g.d_gate_up = alloc({t, 2 * f}, act, "gate/up gradient");
  g.d_norm = alloc({ts, h}, act, "norm output gradient");
  g.d_attn = alloc({t, nq, hd}, act, "attention output gradient");
  g.d_qkv = alloc({t, nh, hd}, act, "qkv gradient");
  const bool sp = shard_.sequence_parallel;
  g.d_norm_in = sp ? alloc({t, h}, act, "norm output gradient (partial)") : g.d_norm;
  g.d_stream_in = sp ? alloc({t, h}, act, "residual stream gradient (sequence all-gather)") : g.d_residual;
  g.amax_slots = linears_.gradient_slots(shard_.layer_begin, shard_.layer_end, scratch);
}

void DecoderModel::gather_d_residual(const BackwardBuffers& g) {
  if (shard_.sequence_parallel) tp_->all_gather(g.d_stream_in, g.d_residual);
}

void DecoderModel::column_parallel_backward(const ModelTensors& w, const LinearOutputGrad& d,
                                            const LinearInput& in, Tensor gathered, const BackwardBuffers& g,
                                            TensorAllocator& scratch) {
  // Under TP each collective runs beside the GEMM it does not feed (Megatron's bulk overlap,
  // where the TpCollectives can overlap): the re-gather beside the input-gradient GEMM, the
  // input gradient's reduction beside the weight-gradient GEMM. The same GEMMs and
  // collectives as one linear_backward between them, in the same order: the same bits.
  const LinearParams p = linear_params(w, d.kind, d.layer);
  const BlockLinears::Gradient gradient = linears_.gradient(d, p, in, scratch);
  if (shard_.tp == 1) {
    linears_.backward_input(g.d_norm_in, gradient, p, scratch);
    linears_.backward_weight(gradient, in, in.x, p, scratch);
    linears_.release_gradient(gradient, scratch);
    return;
  }
  const bool sp = shard_.sequence_parallel;
  const TpPending gather = sp ? tp_->start_all_gather(gathered, in.x) : TpPending{};
  linears_.backward_input(g.d_norm_in, gradient, p, scratch);
  tp_->wait(gather);
  const TpPending reduced =
      sp ? tp_->start_reduce_scatter(g.d_norm, g.d_norm_in) : tp_->start_all_reduce(g.d_norm);
  linears_.backward_weight(gradient, in, sp ? gathered : in.x, p, scratch);
  tp_->wait(reduced);
  linears_.release_gradient(gradient, scratch);
}

void DecoderModel::layer_backward(const ModelTensors& w, const MicroBatch& batch, int64_t l, Activations& a,
                                  const BackwardBuffers& g, TensorAllocator& scratch) {
  const int64_t t = batch.ids.numel(), nq = heads_.q_heads, nh = heads_.total_heads(), hd = heads_.head_dim;
  LayerActivations& x = layer_of(a, l);
  // Each output gradient is written by the op before its linear layer in the backward
  // (swiglu, a norm's backward, the q/k norm + RoPE backward) with the slot that travels with
  // it. down's, the residual stream's, was written by the input norm's backward of the layer
  // above; a stage's top layer has none (it comes from the final norm or the next stage).
  const LinearGradientSlots& slots = g.amax_slots;
  if (config_.sparse_layer(l)) {
    const size_t i = static_cast<size_t>(l - shard_.layer_begin);
    experts_backward(w, batch, l, x, g.d_residual, g, a.routing.empty() ? nullptr : &a.routing[i], scratch);
  } else {
    gather_d_residual(g);
    row_parallel_backward(w, g.d_act,
                          linears_.output_gradient(l, ParamKind::down, g.d_stream_in,
                                                   l + 1 < shard_.layer_end ? slots : LinearGradientSlots{}),
                          x.down_in, scratch);
    const LinearOutputGrad d_gate_up = linears_.output_gradient(l, ParamKind::gate_up, g.d_gate_up, slots);
    ops_.swiglu_backward(g.d_gate_up, g.d_act, x.gate_up, d_gate_up.amax);
    column_parallel_backward(w, d_gate_up, x.gate_up_in, a.gathered, g, scratch);
  }
  const LinearOutputGrad d_o_proj = linears_.output_gradient(l, ParamKind::o_proj, g.d_stream_in, slots);
  ops_.rmsnorm_backward(g.d_residual, grad(w, ParamKind::post_attn_norm, l), g.d_norm, x.residual_mid,
                        param(w, ParamKind::post_attn_norm, l), x.rstd2, d_o_proj.amax);
  if (recompute_.granularity == RecomputePolicy::Granularity::selective)
    attention_core_forward(w, batch, l, x, scratch);
  gather_d_residual(g);
  row_parallel_backward(w, g.d_attn.reshaped({t, nq * hd}), d_o_proj, x.o_proj_in, scratch);
  if (cp_ && ring_size_ > 0)
    context_ring_backward(batch, x, g.d_qkv, g.d_attn, scratch);
  else if (cp_)
    context_attention_backward(batch, x, g.d_qkv, g.d_attn, scratch);
  else
    ops_.attention_backward(g.d_qkv, g.d_attn, x.attn, x.lse, x.qkv_rot, batch.rows, heads_);
  const LinearOutputGrad d_qkv =
      linears_.output_gradient(l, ParamKind::qkv, g.d_qkv.reshaped({t, nh * hd}), slots);
  const bool norm = config_.qk_norm;
  ops_.qk_norm_rope_backward(g.d_qkv, norm ? grad(w, ParamKind::q_norm, l) : Tensor{},
                             norm ? grad(w, ParamKind::k_norm, l) : Tensor{}, g.d_qkv, x.qkv,
                             norm ? param(w, ParamKind::q_norm, l) : Tensor{},
                             norm ? param(w, ParamKind::k_norm, l) : Tensor{}, x.qk_rstd, batch.rows, heads_,
                             rope_, d_qkv.amax);
  if (config_.qkv_bias && !w.grads.empty()) ops_.bias_backward(grad(w, ParamKind::qkv_bias, l), d_qkv.d_out);
  column_parallel_backward(w, d_qkv, x.qkv_in, a.gathered, g, scratch);
  // The residual stream's gradient goes on to the down projection of the layer below.
  const Tensor d_down_below_amax =
      l > shard_.layer_begin ? linears_.output_gradient(l - 1, ParamKind::down, g.d_residual, slots).amax
                             : Tensor{};
  ops_.rmsnorm_backward(g.d_residual, grad(w, ParamKind::input_norm, l), g.d_norm, x.residual_in,
                        param(w, ParamKind::input_norm, l), x.rstd1, d_down_below_amax);
}

void DecoderModel::input_backward(const ModelTensors& w, const MicroBatch& batch, const BackwardBuffers& g,
                                  Tensor* d_input) {
  if (!shard_.first_stage) {
    *d_input = g.d_residual;
  } else if (w.grads.empty()) {
    // A frozen embedding: its gradient is not formed.
  } else if (shard_.tp == 1) {
    ops_.embedding_backward(grad(w, ParamKind::embedding), batch.ids, g.d_residual);
  } else {
    gather_d_residual(g);
    ops_.embedding_backward_shard(grad(w, ParamKind::embedding), batch.ids, g.d_stream_in,
                                  shard_vocab_begin(config_, shard_.tp, shard_.tp_rank));
  }
}

}  // namespace loom
