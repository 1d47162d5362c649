// The decoder of every supported family (config.h), forward and backward, written against
// the op interface only.
//
// Per block (docs/numerics.md):  h = rmsnorm(x);  x += o_proj(attn(rope(qk_norm(qkv(h) + b))));
//                            h = rmsnorm(x);  x += down(silu(gate(h)) · up(h)).
// qk_norm only where the config has it (Qwen3), the bias b only where it has q/k/v biases
// (Qwen2), rope as the config's RoPE type says (default or llama3).
// Then the final norm and the lm_head with the shifted, masked loss. The residual add is
// fused into the following norm (residual_rmsnorm_forward), so a block's last add happens
// at the start of the next block, and the final one in front of the final norm.
#pragma once

#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/linear.h"
#include "model/lora.h"
#include "model/param_table.h"
#include "model/recompute.h"
#include "model/routing.h"
#include "ops/activation_offload.h"
#include "ops/ops.h"
#include "parallel/ep_collectives.h"
#include "parallel/tp_collectives.h"

namespace loom {

// A micro-batch: whole rows laid end to end. targets[t] is the token position t predicts
// (tokens[t + 1] of the same row) when loss_mask[t + 1] is 1, else -1.
//
// A position without a target adds nothing to the loss or its gradient, so where there are
// such positions (prompts under the loss mask, padding) the lm_head and loss run on the rows
// with a target alone (train/rows.h loss_rows_build): loss_positions holds those positions
// in order, then position 0 as padding up to a multiple of kLossRowsGranule rows (GEMM
// shapes from a small set, each tuned once; at least one granule), and loss_targets their
// targets (-1 on the padding). Empty when every position has a target, or when the padded
// rows would not be fewer than T.
struct MicroBatch {
  Tensor ids;      // i32[T]
  Tensor targets;  // i32[T]
  RowSpans rows;
  Tensor loss_positions;  // i32[R], R < T a multiple of the granule; or empty
  Tensor loss_targets;    // i32[R]
  int64_t loss_rows = 0;  // the positions with a target among loss_positions (the rest pad)
  // LoRA dropout's masks (model/lora.h): what they are drawn from in a training micro-batch of
  // a run with train.lora.dropout; inactive otherwise.
  LoraDropoutBatch lora_dropout;
  // Mixture of experts (model/routing.h): whether the sparse layers take their routing census
  // (host copies of each layer's routed tokens and probability sums; a training micro-batch
  // does, an evaluation's does not), and the weight of the micro-batch's load-balancing term
  // in the step's objective as the backward forms it (grad_scale · (Σ nll + weight · term)).
  bool routing_census = false;
  double aux_loss_weight = 0.0;
  // Context parallelism (parallel/context_split.h; empty at cp = 1): the tensors above hold
  // this CP rank's tokens (two chunks of each row; rows.positions their true positions);
  // `context` each one's keys among the whole micro-batch's, and the two orders an all-gather
  // over the CP group moves between, i32[T·cp] each: cp_row_order[t] the gathered index of the
  // micro-batch's token t, cp_rank_order[g] the micro-batch index of gathered token g.
  ContextSpans context;
  Tensor cp_row_order, cp_rank_order;
};
constexpr int64_t kLossRowsGranule = 512;

// The weights and main grads of a model, one view per ParamTable entry.
struct ModelTensors {
  ModelTensors() = default;
  ModelTensors(std::vector<Tensor> params_, std::vector<Tensor> grads_)
      : params(std::move(params_)), grads(std::move(grads_)) {}
  std::vector<Tensor> params;
  std::vector<Tensor> grads;  // fp32 main grads; empty for forward-only use
  // LoRA (model/lora.h, DecoderModel::set_lora): the adapters' weights and fp32 grads, one
  // view per entry of the adapter table (adapter_grads empty for forward-only use).
  std::vector<Tensor> adapters, adapter_grads;
};

// Views of a flat buffer laid out by the table (ParamSpec::offset).
std::vector<Tensor> param_views(const ParamTable& table, float* flat);
// The same over a flat buffer of `dtype` elements on `device` (the CUDA engines' bf16
// weights and fp32 grads).
std::vector<Tensor> param_views(const ParamTable& table, void* flat, DType dtype, Device device);

// The part of the model one rank runs (docs/parallel.md; the split's rules are
// model/shard_spec.h's). The default is the whole model.
//
// Tensor parallel over tp ranks (Megatron's): qkv and gate_up are column-parallel (this
// rank's q heads, its k/v heads, its slice of the gate rows and of the up rows), o_proj and
// down row-parallel (the matching input columns; their outputs are partial sums, reduced
// over TP), the embedding and lm_head vocab-parallel (vocabulary rows [rank·V/tp, ...)),
// the norms replicated. KV heads are split when kv_heads ≥ tp, else each rank keeps the one
// its q heads use (tp / kv_heads ranks share it). With sequence_parallel the residual
// stream and the norms hold this rank's T/tp tokens: all-gather along the sequence in front
// of the column-parallel linears and the lm_head, reduce-scatter behind the row-parallel
// ones and the embedding (instead of all-reduce).
// Pipeline parallel: this stage's layers [layer_begin, layer_end); the first stage embeds,
// the last has the final norm, the lm_head and the loss.
// Expert parallel over ep ranks (carved out of DP, parallel/groups.h): this rank holds experts
// [ep_rank·E/ep, (ep_rank+1)·E/ep) of each sparse layer; the rows its tokens route to other
// ranks' experts go there and back by all-to-all (docs/parallel.md, "Expert parallelism").
// The model adds each rank's own weight grads; where a replicated tensor's grad is a partial
// sum (the norms under SP, the q/k norms, shared KV rows, a tied embedding on two stages),
// reducing it is the engine's (train/engine.cpp).
struct ModelShard {
  int64_t tp = 1;
  int64_t tp_rank = 0;
  bool sequence_parallel = false;
  int64_t layer_begin = 0;
  int64_t layer_end = -1;  // -1: through the model's last layer
  bool first_stage = true;
  bool last_stage = true;
  int64_t ep = 1;
  int64_t ep_rank = 0;
};

class DecoderModel {
 public:
  // `table` holds the shard's tensors (the whole model's for the default shard): the same
  // kinds and layer numbers, each of its local shape. `tp` is required when shard.tp > 1,
  // `ep` when shard.ep > 1.
  DecoderModel(const ModelConfig& config, const ParamTable& table, Ops& ops, RecomputePolicy recompute = {},
               ModelShard shard = {}, TpCollectives* tp = nullptr, EpCollectives* ep = nullptr);

  // The linear layers' precision (bf16 unless set; model/linear.h). FP8 keeps its FP8 weights
  // in `weight_cache`; weights_changed() after each change of the weights casts them again.
  void set_linear_precision(const LinearPrecision& precision, TensorAllocator* weight_cache);
  void weights_changed() { linears_.weights_changed(); }
  // FP8 statistics of the casts between the two calls (BlockLinears::census_begin).
  void fp8_census_begin() { linears_.census_begin(); }
  Fp8Stats fp8_census_end() { return linears_.census_end(); }
  // A mixture of experts' load-balancing loss (none unless set).
  void set_moe_aux_loss(const MoeAuxLoss& aux) { aux_ = aux; }
  // LoRA adapters beside the decoder layers' linear modules (none unless set): `adapters` is
  // lora_table_build's table (of this shard), which ModelTensors::adapters views; it must
  // outlive the model.
  void set_lora(const LoraConfig& lora, const ParamTable& adapters) {
    lora_ = lora;
    lora_table_ = &adapters;
    linears_.set_adapted();
  }
  // The routing of the micro-batches that take the census (MicroBatch::routing_census),
  // counted once each in their backward: this stage's sparse layers' tokens per expert and
  // the aux loss's reported terms (RoutingStats).
  // Context parallelism (none unless set): `cp` carries the collectives over this rank's CP
  // group (all-gather and reduce-scatter along the sequence, as TP's); the micro-batches then
  // hold this rank's chunks of their rows (MicroBatch::context). It must outlive the model.
  void set_context_parallel(TpCollectives* cp) { cp_ = cp; }
  // layout.activation_offload (ops/activation_offload.h): under full recompute, every chunk's
  // kept input but the stage's own (the first chunk's, the stage input) goes to host memory
  // after the layer before writes it and comes back before its chunk is recomputed; the same
  // bits. Null: kept in the micro-batch's arena. One micro-batch at a time (pp = 1, the recipe
  // rules): its slots are the model's, not a micro-batch's.
  void set_activation_offload(ActivationOffload* offload) { offload_ = offload; }
  // The ring form of it (docs/parallel.md, "The ring form"; the all-gather form unless set):
  // this rank is `cp_rank` of a CP group of `cp_size`, and its attention passes K/V blocks
  // around the group (TpCollectives::shift on set_context_parallel's hook) instead of
  // gathering the whole rows.
  void set_context_ring(int64_t cp_size, int64_t cp_rank) {
    ring_size_ = cp_size;
    ring_rank_ = cp_rank;
  }
  void routing_census_begin();
  RoutingStats routing_census_end();

  // Forward and backward of one micro-batch. Returns Σ nll over its targets (unscaled);
  // adds the gradient of grad_scale · Σ nll to tensors.grads. Activations live in
  // `scratch`, released by the caller after the call.
  double forward_backward(const ModelTensors& tensors, const MicroBatch& batch, TensorAllocator& scratch,
                          float grad_scale);
  // Logits [T, V] of the micro-batch (tests and checks; the training path never forms them).
  // Whole model, tp = 1.
  void forward_logits(const ModelTensors& tensors, const MicroBatch& batch, TensorAllocator& scratch,
                      Tensor logits);

  // What a sparse layer's mixture of experts keeps for its backward (ops.h, "Mixture of
  // experts"): the router's logits and probs, each token's experts and weights, the dispatch
  // order and each expert's first row, the experts' gate/up outputs and down outputs in that
  // order. The permuted input and the SwiGLU output are made again in the backward (a gather
  // and an elementwise pass) rather than kept: 3 · T · k · (hidden + F / 2) bytes a layer.
  //
  // Under expert parallelism (ep > 1) the dispatch order's rows of EP rank r's experts go to
  // rank r, which receives every rank's in rank order (each in its expert order) and regroups
  // them by local expert (expert, then source rank, then the source's order): `local` are
  // those R rows as the grouped GEMMs read them (kept: making them again would be another
  // all-to-all), `local_offsets` each local expert's first, `regroup` i32[R] the received row
  // of each local row, send_rows / recv_rows the rows to and from each EP rank. gate_up is
  // then [R, 2F] in the local order, y [T·k, H] in the dispatch order again, back from the
  // experts' ranks. Each row runs through the same expert weights as on one rank, and the
  // combine reads them in the same slot order, so a token's output is one rank's bit for bit.
  struct ExpertActivations {
    Tensor logits, probs, ids, weights, positions, offsets, gate_up, y;
    Tensor local, local_offsets, regroup;
    std::vector<int64_t> send_rows, recv_rows;
  };
  struct LayerActivations {
    Tensor residual_in, rstd1, qkv, qkv_rot, qk_rstd, attn, lse;
    Tensor residual_mid, rstd2, gate_up, down;
    ExpertActivations experts;  // sparse layers (gate_up then empty)
    // The linear layers' inputs as their weight gradients read them (model/linear.h): the
    // input norm's output (qkv's), the attention output (o_proj's), the post-attention
    // norm's output (gate_up's) and the SwiGLU output (down's).
    LinearInput qkv_in, o_proj_in, gate_up_in, down_in;
  };
  // Under selective recompute every layer's attention core lives in these buffers, shared by
  // the layers and refilled in the backward.
  struct AttentionCore {
    Tensor qkv_rot, attn, lse;
  };
  // The outputs of o_proj and down: each is added into the residual stream by the op after
  // it and never read by the backward, so every layer writes both into this one pair
  // instead of keeping its own (4 bytes a token and hidden unit a layer: 9 GiB for
  // Qwen3-8B at 16,384 tokens). partial [T, H] is the GEMM's output; reduced is its sum
  // over TP, [T_s, H] under SP, else partial itself.
  struct ResidualDelta {
    Tensor partial, reduced;
  };
  // A micro-batch's activations in this stage. Residual-stream tensors are [T_s, H]: T_s =
  // T / tp under sequence parallel, else T. layers[i] is layer layer_begin + i.
  struct Activations {
    Tensor embed;  // the stage's input: the embedding output, or the previous stage's output
    std::vector<LayerActivations> layers;
    Tensor residual_final, final_norm, final_rstd;  // last stage
    Tensor output;                                  // other stages: what the next one receives
    AttentionCore core;
    ResidualDelta delta;
    // Under sequence parallel: the [T, H] all-gather of a norm output, the input of the
    // column-parallel linears, shared by every layer and gathered again in backward for the
    // weight gradients (Megatron's re-gather): keeping each layer's would cost 2 (T − T_s) H
    // a layer (15 GiB for Qwen3-32B's first stage at TP4 × PP2, two micro-batches in flight).
    Tensor gathered;
    // The linear layers' input buffers the layers share (BlockLinears::shared_inputs).
    LinearSharedInputs linear_inputs;
    // Under the routing census: each sparse layer's (routing[i] is layer layer_begin + i),
    // host values that outlive a recompute chunk's freed tensors.
    std::vector<LayerRouting> routing;
  };

  // The two halves of a pipeline stage (forward_backward is the two on the whole model).
  // stage_forward: `input` [T_s, H] is the previous stage's output (ignored on the first).
  Activations stage_forward(const ModelTensors& tensors, const MicroBatch& batch, Tensor input,
                            TensorAllocator& scratch);
  // stage_backward: `d_output` is the gradient of a.output (not on the last stage; it is
  // overwritten: it becomes the residual stream's gradient). Adds this stage's grads, returns
  // Σ nll on the last stage (0 elsewhere) and, except on the first stage, the gradient of the
  // stage's input (a tensor of `scratch` or d_output's memory).
  double stage_backward(const ModelTensors& tensors, const MicroBatch& batch, Activations& a, Tensor d_output,
                        TensorAllocator& scratch, float grad_scale, Tensor* d_input);

  // Held-out evaluation: Σ nll of the micro-batch from stage_forward's activations, the
  // lm_head and loss forward only (no gradient formed, tensors.grads unused); 0 except on
  // the last stage. Collective over TP like the training loss.
  double stage_loss(const ModelTensors& tensors, const MicroBatch& batch, const Activations& a,
                    TensorAllocator& scratch);

  // Tokens of the residual stream of a micro-batch of `tokens` tokens on this rank.
  int64_t stream_tokens(int64_t tokens) const;

 private:
  // Layer l's forward into x. Its input: x.residual_in with qkv's input (the input norm's
  // output) already computed, or x.residual_in alone (the norm is computed here), or neither:
  // then the residual add of the previous layer `prev` is fused in front of the norm.
  void layer_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l, LayerActivations& x,
                     const LayerActivations* prev, Activations& a, TensorAllocator& scratch,
                     const AttentionCore* core);
  void attention_core_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l, LayerActivations& x,
                              TensorAllocator& scratch);
  // Context parallelism's attention (set_context_parallel), the all-gather form: every CP
  // rank's qkv_rot gathered and put in the rows' order (`whole`, a tensor of scratch), this
  // rank's queries against it; in the backward the whole micro-batch's k and v gradients of
  // this rank's queries reduce-scattered back to the ranks that hold those tokens, added into
  // g.d_qkv. Their scratch is released before they return.
  Tensor context_whole(const MicroBatch& batch, Tensor qkv_rot, TensorAllocator& scratch);
  void context_attention_forward(const MicroBatch& batch, LayerActivations& x, TensorAllocator& scratch);
  void context_attention_backward(const MicroBatch& batch, const LayerActivations& x, Tensor d_qkv,
                                  Tensor d_attn, TensorAllocator& scratch);
  // The ring form (set_context_ring): cp steps of context_ring_schedule, each this rank's
  // queries against the K/V block it holds, the next block's shift begun before the block's
  // attention; the forward merges the blocks' (out, lse), the backward sends each block's
  // dK/dV on with it, back to its owner after the last step. context_kv_rows: the rows of
  // qkv [T, nh, hd] viewed [T·nh, hd] that hold its k and v heads, i32 [T·2·nkv] in scratch
  // (what gather_rows takes a block from, scatter_rows puts its gradient back with).
  Tensor context_kv_rows(int64_t tokens, TensorAllocator& scratch);
  void context_ring_forward(const MicroBatch& batch, LayerActivations& x, TensorAllocator& scratch);
  void context_ring_backward(const MicroBatch& batch, const LayerActivations& x, Tensor d_qkv, Tensor d_attn,
                             TensorAllocator& scratch);
  // stage_forward's parts: the stage's input (the embedding on the first stage, else
  // `input`); the buffers its layers share and its output, allocated before the layers;
  // the layers; a chunk of full recompute among them (chunks_[index]: its layers, then the
  // next layer's input or the stage's end, then all but its input freed); and the stage's
  // last residual add, into the final norm (`norm`, `rstd`) or into a.output.
  Tensor input_forward(const ModelTensors& w, const MicroBatch& batch, Tensor input,
                       TensorAllocator& scratch);
  void stage_buffers_allocate(Activations& a, int64_t tokens, TensorAllocator& scratch);
  void layers_forward(const ModelTensors& w, const MicroBatch& batch, Activations& a,
                      TensorAllocator& scratch);
  void recompute_chunk_forward(const ModelTensors& w, const MicroBatch& batch, size_t index, Activations& a,
                               TensorAllocator& scratch);
  void stage_output_forward(const ModelTensors& w, const LayerActivations& last, Activations& a, Tensor norm,
                            Tensor rstd);
  // Layer l's activations in a.
  LayerActivations& layer_of(Activations& a, int64_t l) const;
  // Full recompute: chunk `c`'s layers from its stored input, in the forward (whose tensors
  // are freed once the next layer's input is stored) and again before the chunk's backward.
  void chunk_forward(const ModelTensors& w, const MicroBatch& batch, const LayerChunk& c, Activations& a,
                     TensorAllocator& scratch);
  const Tensor& param(const ModelTensors& tensors, ParamKind kind, int64_t layer = -1) const;
  // The main grad of (kind, layer); empty where the base is frozen (ModelTensors::grads empty).
  Tensor grad(const ModelTensors& tensors, ParamKind kind, int64_t layer = -1) const;
  // The TP glue around the column- and row-parallel pieces (nothing at tp = 1):
  // the input of a column-parallel op from the stream's [T_s, H] `x` ([T, H]; x itself
  // unless SP), and the reduction of a row-parallel op's partial [T, H] into the stream's
  // [T_s, H] (in place unless SP).
  Tensor gather_sequence(Tensor x, TensorAllocator& scratch, const char* what);
  // The same into `full` (Activations::gathered); x itself unless SP.
  Tensor gather_sequence_into(Tensor x, Tensor full);
  Tensor reduce_partial(Tensor partial, TensorAllocator& scratch, const char* what);
  // The same into `reduced` ([T_s, H] under SP; unused otherwise).
  Tensor reduce_partial_into(Tensor partial, Tensor reduced);
  // The lm_head and the loss, forward and backward, on the micro-batch's loss rows where it
  // has them (MicroBatch), else on every position: sets *nll (f32 [R] or [T]; 0 where there
  // is no target) and returns the gradient of the final norm's output [T_s, H].
  Tensor head_backward(const ModelTensors& w, const MicroBatch& batch, const Activations& a, Tensor* nll,
                       TensorAllocator& scratch, float grad_scale);
  // Its vocab-parallel middle at tp > 1, on the rows `hidden` [R, H] of every TP rank: nll [R]
  // and d_hidden [R, H], this rank's vocabulary shard's partial sums.
  void head_backward_tp(const ModelTensors& w, Tensor hidden, Tensor targets, Tensor nll, Tensor d_hidden,
                        TensorAllocator& scratch, float grad_scale);
  // The gradients stage_backward's layers share.
  struct BackwardBuffers {
    Tensor d_residual;  // the residual stream's [T_s, H]; the norm backwards add into it
    Tensor d_act, d_gate_up, d_norm, d_attn;
    // The attention's input gradient, turned into the qkv projection's in place by
    // qk_norm_rope_backward (the v heads pass through untouched).
    Tensor d_qkv;
    // Under TP the column-parallel input gradients are partial sums over [T, H], reduced
    // into d_norm (all-reduce in place at T_s = T: d_norm itself; reduce-scatter under SP).
    Tensor d_norm_in;
    // The row-parallel outputs were reduce-scattered under SP: their gradient is
    // d_residual gathered along the sequence (d_residual itself otherwise).
    Tensor d_stream_in;
    // Where the ops making d_gate_up, d_residual and d_qkv write their amax for the linear
    // layers reading them (BlockLinears::output_gradient).
    LinearGradientSlots amax_slots;
  };
  // A sparse layer's MLP: the experts' forward from x.gate_up_in.x (the post-attention norm's
  // output, [T_s, H]: the experts run on the rank's own tokens) into x.down; and its backward
  // from d_out (the residual stream's gradient) into g.d_norm, written.
  void experts_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l, LayerActivations& x,
                       Activations& a, TensorAllocator& scratch);
  // `routing`: the layer's census with the load-balancing loss's gradient (null: none).
  void experts_backward(const ModelTensors& w, const MicroBatch& batch, int64_t l, const LayerActivations& x,
                        Tensor d_out, const BackwardBuffers& g, const LayerRouting* routing,
                        TensorAllocator& scratch);
  // A sparse layer's census of the micro-batch from its router's outputs: summed over the TP
  // ranks' tokens under sequence parallel (each rank routes its own), its own otherwise.
  LayerRouting routing_census(const ExpertActivations& m, TensorAllocator& scratch);
  // Before a micro-batch's backward: its census added to routing_stats_ (tokens per expert,
  // the aux loss's reported terms) and each sparse layer's aux gradient set (LayerRouting::
  // d_probs). Once per micro-batch: a recompute's forward takes no census again.
  void aux_loss_backward(const MicroBatch& batch, Activations& a, float grad_scale);
  // The [E_local, N, K] view of a sparse layer's expert weight (or its grad), stored
  // [E_local · N, K]: this EP rank's E / ep experts.
  Tensor experts_view(const Tensor& stored) const;
  // Expert parallelism's exchanges (ExpertActivations): the plan of a micro-batch's dispatch
  // from its dispatch order's offsets (every EP rank's counts gathered); the dispatch order's
  // rows `sorted` [T·k, H] to the local order (into m.local's shape, `local`); and the local
  // rows back to the dispatch order `sorted`. The backward runs the same two the other way.
  void expert_dispatch_plan(ExpertActivations& m, TensorAllocator& scratch);
  void expert_dispatch(const ExpertActivations& m, Tensor local, Tensor sorted, TensorAllocator& scratch);
  void expert_return(const ExpertActivations& m, Tensor sorted, Tensor local, TensorAllocator& scratch);
  // stage_backward's parts: the gradient of the stage's output as the residual stream's
  // (through the head, the loss and the final norm on the last stage; sets *nll there);
  // the shared buffers; one layer; and the stage's input (the embedding's grad on the first
  // stage, else *d_input).
  Tensor output_backward(const ModelTensors& w, const MicroBatch& batch, const Activations& a,
                         Tensor d_output, Tensor* nll, TensorAllocator& scratch, float grad_scale);
  void backward_buffers_allocate(BackwardBuffers& g, int64_t tokens, TensorAllocator& scratch);
  void layer_backward(const ModelTensors& w, const MicroBatch& batch, int64_t l, Activations& a,
                      const BackwardBuffers& g, TensorAllocator& scratch);
  void input_backward(const ModelTensors& w, const MicroBatch& batch, const BackwardBuffers& g,
                      Tensor* d_input);
  // The backward of a column-parallel linear (qkv, gate_up) from its output gradient d: its
  // input gradient reduced into g.d_norm, its weight gradient from its input `in`, a norm
  // output (re-gathered along the sequence into `gathered` under SP).
  void column_parallel_backward(const ModelTensors& w, const LinearOutputGrad& d, const LinearInput& in,
                                Tensor gathered, const BackwardBuffers& g, TensorAllocator& scratch);
  // The linear layers' forward (`gemm_x`: what the GEMM reads, in.x or its all-gather) and the
  // backward of a row-parallel one (o_proj, down), at the layer's precision (linear.h).
  void linear_forward(const ModelTensors& w, const MicroBatch& batch, Tensor out, LinearInput& in,
                      Tensor gemm_x, TensorAllocator& scratch);
  void row_parallel_backward(const ModelTensors& w, Tensor d_x, const LinearOutputGrad& d,
                             const LinearInput& in, TensorAllocator& scratch);
  LinearParams linear_params(const ModelTensors& w, ParamKind kind, int64_t layer) const;
  int param_index(ParamKind kind, int64_t layer) const;
  // g.d_stream_in from g.d_residual under SP (nothing otherwise).
  void gather_d_residual(const BackwardBuffers& g);

  ModelConfig config_;
  const ParamTable& table_;
  Ops& ops_;
  ModelShard shard_;
  TpCollectives* tp_;
  EpCollectives* ep_;
  TpCollectives* cp_ = nullptr;            // set_context_parallel
  int64_t ring_size_ = 0, ring_rank_ = 0;  // set_context_ring; 0: the all-gather form
  ActivationOffload* offload_ = nullptr;   // set_activation_offload
  // Whether chunk `index`'s input is offloaded: a chunk that starts where the one before ends.
  bool offloaded(size_t index) const;
  int64_t local_experts_;  // E / ep
  HeadLayout heads_;
  int64_t ffn_;  // this rank's gate (and up) rows
  RecomputePolicy recompute_;
  std::vector<LayerChunk> chunks_;  // of full recompute; empty otherwise
  float eps_;
  RopeSpec rope_;
  BlockLinears linears_;
  MoeAuxLoss aux_;
  LoraConfig lora_;
  const ParamTable* lora_table_ = nullptr;
  RoutingStats routing_stats_;
};

}  // namespace loom
