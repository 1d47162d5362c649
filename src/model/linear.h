// The decoder block's four linear layers (qkv, o_proj, gate_up, down) at the run's
// precision (docs/numerics.md, "FP8 linear layers"). BlockLinears alone knows a layer's
// precision: the decoder asks it for each layer's input buffer (LinearInput), lets the op
// before the layer write it and its amax slot, and passes that one value to the forward and
// to the backward; in the backward likewise for the output gradient (LinearOutputGrad).
// Whether FP8 runs under tensor or block scaling, which inputs are kept as FP8 transposes,
// the amax reductions over TP and the FP8 census are decided here; the operands are
// QuantizedTensor values (core/quantized_tensor.h) that Ops::quantize makes and Ops::gemm
// reads.
//
// In bf16 (fp32 on the CPU) a layer is ops.linear_forward / linear_backward. In FP8 each of
// its three GEMMs reads FP8 operands under tensor-wise current scaling (core/fp8.h):
//   forward        out  = x · Wᵀ        x  e4m3 [T, K],   W  e4m3 [N, K]    fast accumulation
//   input grad     d_x  = d_out · W      d_out  [T, N],    Wᵀ e4m3 [K, N]
//   weight grad    d_W += d_outᵀ · x     d_outᵀ [N, T],    xᵀ e4m3 [K, T]    into the fp32 main grad
// (Hopper's FP8 GEMMs read both operands K-contiguous, hence the transposed copies; d_out
// is e5m2 by default.) W and Wᵀ are cast once after each change of the weights (the
// optimizer step, a load), not per micro-batch. The forward keeps x's amax and scale, and
// its cast writes xᵀ too where that replaces keeping x (qkv, gate_up and down without SP: x
// then lives in a buffer the layers share); else (o_proj, whose x the attention's backward
// reads; SP, whose backward gathers x again) the backward casts xᵀ from x under the same
// scale. Either way the weight gradient sees the values the forward multiplied.
//
// Under tensor parallelism a scale is that of the whole tensor, as on one rank: the amax of
// a sharded tensor (every weight; x of the row-parallel o_proj and down, sharded along K;
// d_out of the column-parallel qkv and gate_up, sharded along N) is the max over the TP
// group. A gathered or replicated tensor has the same amax on every rank already.
//
// Block scaling (DeepSeek-V3's; ops.h fp8_cast_rows and the rest) quantizes each block of 128
// values (1 × 128 for x and d_out, 128 × 128 for W) under its own power-of-two scale, found by
// the cast; no amax pass, full accumulation in every GEMM:
//   forward        x 1 × 128 along K,   W 128 × 128
//   input grad     d_out 1 × 128 along N,   Wᵀ 128 × 128 (W's blocks, transposed)
//   weight grad    d_outᵀ [N, T'] and xᵀ [K, T'], 1 × 128 along the tokens: cast from the bf16
//                  d_out and x along their columns, T' the tokens padded with zeros to 128
//                  on the GPU (the CPU twin takes a partial last block: the same values)
// The wgrad's operands are another quantization of x than the forward's, so the layer keeps
// the bf16 x (no FP8 transposes from the forward). Under TP the blocks are counted within each
// rank's shard and no amax crosses ranks: where every shard's sharded dimension is a multiple
// of 128 (what `loom train` requires of block scaling under TP, and the CUDA backend of every
// dim), a rank's blocks are exactly one rank's blocks of the whole tensor, so TP ranks quantize
// what one rank does. (Shards of other widths, as the CPU's tiny models have, put their blocks
// elsewhere than one rank does: a valid quantization, not one rank's. And where TP > the KV
// heads, the ranks sharing a KV head each quantize their share of its output gradient, as
// under tensor scaling.)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/quantized_tensor.h"
#include "model/lora.h"
#include "model/param_table.h"
#include "ops/ops.h"
#include "parallel/tp_collectives.h"

namespace loom {

struct LinearPrecision {
  bool fp8 = false;
  DType gradient_format = DType::e5m2;  // d_out's FP8 format; e4m3 is the other choice
  // The first and last decoder layers of the model that stay in bf16.
  int64_t bf16_first_layers = 0, bf16_last_layers = 0;
  Fp8Scaling scaling = Fp8Scaling::tensor;
};

// How a layer is split under TP: column-parallel (qkv, gate_up: x whole, W's rows and d_out's
// columns sharded) or row-parallel (o_proj, down: x and W sharded along K).
enum class LinearSplit : uint8_t { column, row };
// The split of linear layer `kind` (qkv, o_proj, gate_up or down).
LinearSplit linear_split(ParamKind kind);

// FP8 statistics of a step (docs/numerics.md, "FP8 statistics"; train.fp8_stats_every): for
// each tensor kind, i.e. the input, the weight and the output gradient of each of the four
// linear layers, over every FP8 cast of the step: the largest magnitude, the values cast, and
// how many the cast flushed to zero or clamped (Ops::fp8_census). A value counts once over a
// layout: a tensor every TP rank casts whole (the input of qkv and gate_up, the output
// gradient of o_proj and down) is counted by TP rank 0, a weight by DP rank 0 (the engine's
// reduction), a recomputed forward not again.
struct Fp8TensorStats {
  float amax = 0;
  int64_t values = 0, flushed = 0, clamped = 0;
};
struct Fp8Stats {
  static constexpr int kLayers = 4;  // qkv, o_proj, gate_up, down
  static constexpr int kKinds = 3 * kLayers;
  enum Role : int { input = 0, weight = 1, output_grad = 2 };
  std::array<Fp8TensorStats, kKinds> kinds;
  // "qkv.input", "down.output_grad", ...: kind = 3 · layer + role.
  static std::string kind_name(int kind);
  // Every kind and role of linear layer `kind` (qkv, o_proj, gate_up or down).
  static int kind_of(ParamKind layer, Role role);
};

// The parameters of one linear layer of one decoder layer.
struct LinearParams {
  Tensor weight, bias;  // bias: Qwen2's q/k/v, else empty
  Tensor grad;          // the weight's fp32 main grad (the backward adds into it); empty: frozen
  int index = 0;        // the weight's index in the model's table: its FP8 copy's key
  // LoRA (model/lora.h): the layer's targets' A's stacked [J·r, K] with their fp32 grad, each
  // target's B with its grad and output columns, and PEFT's scale; lora_a empty without one.
  Tensor lora_a, lora_a_grad;
  std::vector<LoraUp> lora_up;
  std::vector<LoraTarget> lora_targets;  // lora_up[j]'s target (its dropout mask's)
  float lora_scale = 0;
  bool adapted() const { return lora_a.data != nullptr; }
};

// A linear layer's input: the buffer the op producing it writes (x) and the slot where that
// op writes x's amax (ops.h out_amax; empty unless an FP8 cast reads it), then what the layer
// keeps of it for its weight gradient. BlockLinears::input makes one; the decoder passes it
// from the producer to the forward and keeps it for the backward.
struct LinearInput {
  Tensor x;
  Tensor amax;
  int64_t layer = 0;
  ParamKind kind = ParamKind::qkv;
  // Tensor scaling: x's amax and scale (amax's memory), and where the layer keeps xᵀ in FP8
  // instead of x (x then lives in a buffer the stage's layers share).
  QuantizedTensor kept;
  // LoRA: the targets' down-projections x · A_jᵀ side by side [T, J·r], kept for the backward;
  // under dropout each target's dropout_j(x) · A_jᵀ [T, r] a block of its own, [J, ≥ T·r].
  Tensor lora_t;
  // LoRA dropout: the micro-batch's (forward sets it; inactive without dropout), for the
  // backward to draw the forward's masks again.
  LoraDropoutBatch lora_dropout;
};

// The buffers a stage's layers share for the inputs their FP8 layers keep as FP8 transposes
// (BlockLinears::input): the bf16 input lives only until its GEMM has read it.
struct LinearSharedInputs {
  Tensor hidden;  // [T, H]: the norm outputs, qkv's and gate_up's inputs
  Tensor ffn;     // [T, F]: the SwiGLU output, down's input
};

// A linear layer's output gradient as the op producing it writes it: the tensor and the slot
// for its amax (empty where no FP8 cast reads it, or where no op wrote it).
struct LinearOutputGrad {
  Tensor d_out;
  Tensor amax;
  int64_t layer = 0;
  ParamKind kind = ParamKind::qkv;
};

// Where the ops producing the backward's output gradients write their amax, one slot per
// gradient buffer the layers share: d_gate_up, the residual stream's gradient (o_proj's and
// down's d_out) and d_qkv. Empty where no layer of the stage casts to FP8 under tensor scaling.
struct LinearGradientSlots {
  Tensor gate_up, residual, qkv;
};

class BlockLinears {
 public:
  // `layers`: the model's decoder layers; `tp` is required when tp_size > 1, tp_rank being
  // this rank's place in it; `sequence_parallel`: the column-parallel inputs are all-gathered
  // from the ranks' parts (and kept as those parts).
  BlockLinears(Ops& ops, LinearPrecision precision, int64_t layers, TpCollectives* tp, int64_t tp_size,
               int64_t tp_rank, bool sequence_parallel);

  // FP8 keeps its FP8 weights in `weight_cache` (2 bytes a weight, allocated on first use and
  // kept; required with precision.fp8).
  void set_precision(const LinearPrecision& precision, TensorAllocator* weight_cache);
  // The weights changed: their FP8 forms are cast again where next used.
  void weights_changed() { ++generation_; }
  // LoRA adapters beside the layers (DecoderModel::set_lora): their A gradients read the
  // layers' inputs in bf16, so no layer keeps an FP8 transpose in their place.
  void set_adapted() { adapted_ = true; }

  // FP8 statistics (Fp8Stats): from census_begin every FP8 cast is counted, until census_end
  // returns this rank's counts. census_begin casts the weights again where next used (the
  // same bits) so that the step counts them. While paused (a recomputed forward), nothing is
  // counted.
  void census_begin();
  Fp8Stats census_end();
  void census_pause(bool paused) { census_paused_ = paused; }

  // The stage's shared input buffers ([tokens, hidden] and [tokens, ffn]) where one of its
  // layers [layer_begin, layer_end) keeps FP8 transposes of its inputs, else empty.
  LinearSharedInputs shared_inputs(int64_t layer_begin, int64_t layer_end, int64_t tokens, int64_t hidden,
                                   int64_t ffn, TensorAllocator& scratch);
  // The input of linear layer `kind` (qkv, o_proj, gate_up or down) of layer `layer`, [rows,
  // cols] (this rank's part of the stream under SP), for its producer to write: a buffer of
  // `shared` where the layer keeps the FP8 transpose instead, else its own from scratch.
  LinearInput input(int64_t layer, ParamKind kind, int64_t rows, int64_t cols,
                    const LinearSharedInputs& shared, TensorAllocator& scratch, const char* what);
  // An input an op made without an amax slot (o_proj's, the attention output; a norm output a
  // recompute chunk made): an FP8 layer takes x's amax with a pass of its own.
  LinearInput input_of(int64_t layer, ParamKind kind, Tensor x, TensorAllocator& scratch);

  // out = x · Wᵀ (+ bias) (+ LoRA's scale · (x · Aᵀ) · Bᵀ, lora_t kept in `in`) for `in`, whose
  // producer has written x (and its amax slot); with `dropout` active, each adapter j reads
  // dropout_j(x) (model/lora.h), made in scratch one adapter at a time and released, so the
  // J adapters of a fused layer take J GEMMs of [T, K] · [K, r] where they share one without.
  // `gemm_x` is the tensor the GEMM reads: in.x, or its all-gather under SP. A bf16 layer adds
  // the bias in its GEMM's epilogue, an FP8 one after its GEMM. In FP8 the layer keeps in `in`
  // what its backward reads. Temporaries come from scratch and are released.
  void forward(Tensor out, LinearInput& in, Tensor gemm_x, const LinearParams& p,
               const LoraDropoutBatch& dropout, TensorAllocator& scratch);

  // The backward's gradient slots for a stage's layers [layer_begin, layer_end).
  LinearGradientSlots gradient_slots(int64_t layer_begin, int64_t layer_end, TensorAllocator& scratch);
  // Linear layer (layer, kind)'s output gradient `d_out` with its slot of `slots` (an FP8
  // layer's under tensor scaling; the residual stream's for o_proj and down), for the op
  // making d_out to write its amax into.
  LinearOutputGrad output_gradient(int64_t layer, ParamKind kind, Tensor d_out,
                                   const LinearGradientSlots& slots) const;

  // The backward's d_out as both of its GEMMs read it (in FP8: d_out and d_outᵀ quantized),
  // made once for the two halves, which TP runs with collectives between them. Allocated in
  // scratch at `mark`: release_gradient frees it (nothing allocated after it may be kept).
  struct Gradient {
    Tensor d_out;
    QuantizedTensor q;
    Tensor lora_d_t;  // LoRA: d(x · Aᵀ) as lora_t is laid out, the B grads added by gradient()
    LoraDropoutBatch lora_dropout;  // the forward's (LinearInput::lora_dropout)
    int64_t layer = 0;
    ParamKind kind = ParamKind::qkv;
    size_t mark = 0;
  };
  // d.amax, where not empty, holds d_out's amax as its producer wrote it. With LoRA (p
  // adapted) also the adapters' d_t and their B grads, from the lora_t `in` kept.
  Gradient gradient(const LinearOutputGrad& d, const LinearParams& p, const LinearInput& in,
                    TensorAllocator& scratch);
  // d_x = d_out · W (+ LoRA's d_t · A; under dropout Σ_j dropout_j(d_t_j · A_j), the forward's
  // masks drawn again).
  void backward_input(Tensor d_x, const Gradient& g, const LinearParams& p, TensorAllocator& scratch);
  // p.grad += d_outᵀ · x (not for a frozen weight: p.grad empty), x as the forward had it
  // (`gemm_x`: what its GEMM read, in.x or its all-gather again), or the FP8 transpose `in`
  // keeps; LoRA's A grad += d_tᵀ · x (under dropout A_j's += d_t_jᵀ · dropout_j(x), made again in
  // scratch one adapter at a time).
  void backward_weight(const Gradient& g, const LinearInput& in, Tensor gemm_x, const LinearParams& p,
                       TensorAllocator& scratch);
  void release_gradient(const Gradient& g, TensorAllocator& scratch) { scratch.release_to(g.mark); }

 private:
  // LoRA dropout in layer (layer, kind): adapter j's mask over the layer's input of `columns`
  // on this rank, and its dropped input dropout_j(x) in scratch (the caller releases it).
  LoraDropoutMask lora_mask(const LoraDropoutBatch& dropout, int64_t layer, ParamKind kind,
                            const LinearParams& p, size_t j, int64_t columns) const;
  Tensor lora_dropped_input(const LoraDropoutBatch& dropout, int64_t layer, ParamKind kind,
                            const LinearParams& p, size_t j, Tensor x, TensorAllocator& scratch);
  // The frozen or trained weight's part of forward (bf16 or FP8).
  void base_forward(Tensor out, LinearInput& in, Tensor gemm_x, const LinearParams& p,
                    TensorAllocator& scratch);
  bool fp8(int64_t layer) const;
  // FP8 layer `layer` under tensor scaling: the ops producing its operands give their amax,
  // and (without SP) it keeps the FP8 transposes of qkv's, gate_up's and down's inputs for
  // their weight gradients instead of the inputs; block scaling quantizes otherwise (above).
  bool tensor_scaled(int64_t layer) const { return fp8(layer) && precision_.scaling == Fp8Scaling::tensor; }
  bool keeps_fp8_input(int64_t layer, ParamKind kind) const;
  bool block_scaled() const { return precision_.scaling == Fp8Scaling::block; }
  // Whether this rank holds only its part of the layer's input (TP shards it along K, or SP
  // gathers it from the ranks' parts), or of its output gradient: the amax of a part is
  // reduced over TP.
  bool input_is_rank_part(ParamKind kind) const;
  bool output_grad_is_rank_part(ParamKind kind) const;
  // W and Wᵀ in FP8, cast again after weights_changed().
  const QuantizedTensor& fp8_weight(const LinearParams& p, ParamKind kind, TensorAllocator& scratch);
  // Counts one cast into kind `kind` of the census when it is on (Ops::fp8_census's
  // arguments); `replicated`: every TP rank casts the whole tensor, so rank 0 alone counts it.
  void census(int kind, bool replicated, Tensor x, Tensor q, Tensor scale_inv,
              std::optional<Fp8Blocks> blocks);
  // amax over the TP group, in place.
  void reduce_amax(Tensor amax, TensorAllocator& scratch);
  // The amax of x, a tensor this rank holds part of (and no op wrote it): a pass, then the max
  // over the TP group. Where x is whole and no op wrote its amax, Ops::quantize takes the pass.
  void sharded_amax(Tensor amax, Tensor x, TensorAllocator& scratch);

  Ops& ops_;
  LinearPrecision precision_;
  int64_t layers_;
  TensorAllocator* weight_cache_ = nullptr;
  TpCollectives* tp_;
  int64_t tp_size_, tp_rank_;
  bool sequence_parallel_;
  bool adapted_ = false;
  uint64_t generation_ = 1;
  // The census (census_begin): on, paused, its device counters (amax f32[kKinds], counts
  // i64[kKinds, 2]: flushed, clamped) and the values counted on the host.
  bool census_on_ = false, census_paused_ = false;
  Tensor census_amax_, census_counts_;
  std::array<int64_t, Fp8Stats::kKinds> census_values_{};
  struct Fp8Weight {
    QuantizedTensor q;
    uint64_t generation = 0;
  };
  std::vector<Fp8Weight> weights_;  // by param index
};

}  // namespace loom
