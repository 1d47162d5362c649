// The op interface: what a Qwen3 block is made of, at the granularity the CUDA backend
// fuses at. Model code calls only these; it is written once and runs on either backend.
//
//   cpu/   fp32 reference, plain loops and threads: the numerical truth for tests.
//   cuda/  production, bf16 activations and weights, fp32 main grads.
//
// Conventions. T = tokens of a micro-batch (its rows laid end to end), H = hidden,
// nq / nkv = query / key-value heads, hd = head_dim, F = ffn, V = vocab. Activations and
// weights have the backend's activation dtype (fp32 on the CPU, bf16 on CUDA); statistics
// kept for backward (rstd, lse) and main grads (d_weight arguments) are always fp32.
// Every backward that takes a d_weight ADDS into it (main grads accumulate over
// micro-batches). Where a backward takes d_x it overwrites it unless it says "+=".
// Shapes are checked at the boundary; a mismatch throws naming the op and the tensor.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "ops/rope.h"

namespace loom {

// The rows of a micro-batch: row r spans tokens [offsets[r], offsets[r+1]). Attention is
// causal within a row and never crosses one; RoPE positions restart at 0 at each row, unless
// `positions` gives each token's (context parallelism: a CP rank's tokens are chunks of rows
// at their true positions, parallel/context_split.h).
struct RowSpans {
  std::vector<int32_t> offsets;         // size rows + 1, offsets[0] = 0, offsets.back() = T
  std::vector<int32_t> positions = {};  // empty, or T: each token's RoPE position
  int64_t rows() const { return static_cast<int64_t>(offsets.size()) - 1; }
  int64_t tokens() const { return offsets.empty() ? 0 : offsets.back(); }
};

// Context parallelism (parallel/context_split.h): a CP rank's queries against the keys of the
// whole micro-batch (every CP rank's tokens in the rows' order). Query i attends to the keys
// [key_begin[i], key_end[i]): its span (row, or sample under isolated packing) up to and
// including itself.
struct ContextSpans {
  std::vector<int32_t> key_begin, key_end;  // per query; empty: no context parallelism
  bool empty() const { return key_begin.empty(); }
};

// Attention geometry shared by qk_norm_rope and attention. The fused qkv activation is
// [T, nq + 2 nkv, hd]: heads 0..nq-1 are q, then nkv k heads, then nkv v heads.
struct HeadLayout {
  int64_t q_heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t total_heads() const { return q_heads + 2 * kv_heads; }
};

// One LoRA adapter's up-projection B [N_j, r] (model/lora.h) and its fp32 grad d_b (empty in
// a forward), adding into the linear layer's output columns [column, column + N_j).
struct LoraUp {
  Tensor b;
  Tensor d_b;
  int64_t column = 0;
};

// lora_up_forward / lora_up_backward's shapes, the backends' one check: out (or d_out) [T, N]
// and t (or d_t) [T, J·r] of `act`, each B_j [N_j, r] of `weight` whose columns fit in N,
// each d_b (where `grads`) f32 [N_j, r]. Returns r. InputError naming the argument otherwise.
int64_t lora_up_check(const char* op, Tensor out, Tensor t, const std::vector<LoraUp>& adapters, DType act,
                      DType weight, bool grads);

// LoRA dropout's mask over an adapter's input x [T, K] (ops/lora_dropout.h): value (t, c) is
// kept where lora_dropout_kept(lora_dropout_token(stream, tokens[t, 0], tokens[t, 1]),
// feature_begin + c, threshold), and then scaled by `scale` = 1 / (1 − p).
struct LoraDropoutMask {
  uint64_t stream = 0;        // lora_dropout_stream(train.seed, step, layer, target)
  uint32_t threshold = 0;     // lora_dropout_threshold(p)
  float scale = 1.0f;         // 1 / (1 − p)
  Tensor tokens;              // i32[T, 2]: each token's row in the step's global batch, its index there
  int64_t feature_begin = 0;  // x's first column in the whole layer's input (a TP shard's offset)
};

// lora_dropout's shapes, the backends' one check: out and x [T, K] of `act`, mask.tokens
// i32[T, 2] on x's device, feature_begin ≥ 0. InputError naming the argument otherwise.
void lora_dropout_check(Tensor out, Tensor x, const LoraDropoutMask& mask, DType act);

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual DType activation_dtype() const = 0;

  // out[t] = table[ids[t]].  ids i32[T], table [V, H], out [T, H].
  virtual void embedding_forward(Tensor out, Tensor ids, Tensor table) = 0;
  // d_table[ids[t]] += d_out[t], deterministic (fixed order per row of the table).
  virtual void embedding_backward(Tensor d_table, Tensor ids, Tensor d_out) = 0;

  // out = x · Wᵀ (+ bias).  x [T, K], weight [N, K], out [T, N]; bias [N] or empty (Qwen2's
  // q/k/v): added to the fp32 sum before the one rounding to bf16 (on CUDA in the GEMM's
  // epilogue).
  virtual void linear_forward(Tensor out, Tensor x, Tensor weight, Tensor bias) = 0;
  // d_x = d_out · W (skipped when d_x.data is null); d_weight += d_outᵀ · x (skipped when
  // d_weight.data is null; x is then not read and may be empty). The two halves called one
  // after the other give the whole call's bits: TP's backward runs a collective between them.
  virtual void linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight) = 0;

  // LoRA's up-projections beside a linear layer (model/lora.h): t [T, J·r] holds the layer's J
  // adapters' down-projections x · A_jᵀ side by side (one linear_forward over the A's stacked),
  // t_j its columns [j·r, (j+1)·r). Adapter j adds scale · t_j · B_jᵀ into its columns of the
  // layer's output out [T, N] (fp32 sums; on CUDA added to the bf16 output in the GEMM).
  virtual void lora_up_forward(Tensor out, Tensor t, const std::vector<LoraUp>& adapters, float scale) = 0;
  // With d_out_j d_out's columns of adapter j: d_t_j = scale · d_out_j · B_j (written, d_t as
  // t), d_B_j += scale · d_out_jᵀ · t_j (fp32).
  virtual void lora_up_backward(Tensor d_t, Tensor d_out, Tensor t, const std::vector<LoraUp>& adapters,
                                float scale) = 0;
  // LoRA dropout (LoraDropoutMask): out = x ⊙ m · scale, or with `accumulate` out += x ⊙ m ·
  // scale (fp32; on CUDA rounded once to bf16). Its own backward: the adapter's input gradient
  // is d_x += (d_t · A) ⊙ m · scale, the same mask.
  virtual void lora_dropout(Tensor out, Tensor x, const LoraDropoutMask& mask, bool accumulate) = 0;

  // An `out_amax` argument (here and below; may be empty) is an f32[1] that receives the
  // amax of the op's output as written (ops.amax of it, the same bits), for the FP8 cast of
  // a GEMM operand the op produces: it saves the cast a pass over the tensor.
  //
  // out = x / sqrt(mean(x²) + eps) · weight, statistics in fp32; rstd f32[T] kept for backward.
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps,
                               Tensor out_amax) = 0;
  // The residual add fused in front of the norm: residual_out = residual + delta, then
  // out = rmsnorm(residual_out).
  virtual void residual_rmsnorm_forward(Tensor residual_out, Tensor out, Tensor rstd, Tensor residual,
                                        Tensor delta, Tensor weight, float eps, Tensor out_amax) = 0;
  // d_x += ∂out/∂x ᵀ d_out (d_x holds the residual stream's gradient, so this is the fused
  // residual backward); d_weight += Σ_t d_out · x · rstd (skipped when d_weight.data is null:
  // a frozen norm). x is the norm's input.
  // out_amax: of d_x after the add.
  virtual void rmsnorm_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                                Tensor rstd, Tensor out_amax) = 0;

  // On the fused qkv [T, nq + 2 nkv, hd]: RMSNorm over hd of every q head (q_weight) and k
  // head (k_weight), then rotate-half RoPE with positions restarting per row, inv_freq
  // from rope_inv_freq(rope, hd); v heads are copied. rstd f32[T, nq + nkv]. Without q/k
  // norm (Llama, Qwen2: q_weight and k_weight empty) it is RoPE alone and rstd is not used.
  virtual void qk_norm_rope_forward(Tensor qkv_out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                                    const RowSpans& rows, const HeadLayout& heads, float eps,
                                    const RopeSpec& rope) = 0;
  // d_qkv = the input gradient of the above; d_q_weight, d_k_weight += (all four norm
  // tensors empty without q/k norm; the two grads empty for frozen norms). d_qkv may be d_qkv_out (in place):
  // the v heads' gradient is then already where it belongs. out_amax: of all of d_qkv, v heads included.
  virtual void qk_norm_rope_backward(Tensor d_qkv, Tensor d_q_weight, Tensor d_k_weight, Tensor d_qkv_out,
                                     Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor rstd,
                                     const RowSpans& rows, const HeadLayout& heads, const RopeSpec& rope,
                                     Tensor out_amax) = 0;

  // The bias of a linear layer added after its GEMM (an FP8 GEMM's; linear_forward takes it
  // in its own): out[t] += bias (out [T, N], bias [N]; the CUDA backend adds in fp32 and
  // rounds once to bf16).
  virtual void bias_add_forward(Tensor out, Tensor bias) = 0;
  // d_bias += Σ_t d_out[t] (d_out [T, N], d_bias f32[N]), summed in a fixed order.
  virtual void bias_backward(Tensor d_bias, Tensor d_out) = 0;

  // Causal GQA attention within each row, scale 1/sqrt(hd), softmax in fp32.
  // qkv [T, nq + 2 nkv, hd] (after qk_norm_rope), out [T, nq, hd], lse f32 of nq·T values
  // (the log-sum-exp of each query's scaled scores, kept for backward), allocated [nq, T]
  // but ordered row by row: row r's block [nq, len_r] starts at offsets[r]·nq, so for
  // equal rows it is the packed [rows, nq, row_tokens] tensor cuDNN's SDPA reads. (Rows of
  // unequal lengths run on CUDA as THD, whose blocks are [len_r, nq]: only the backend's own
  // backward reads lse.)
  virtual void attention_forward(Tensor out, Tensor lse, Tensor qkv, const RowSpans& rows,
                                 const HeadLayout& heads) = 0;
  // d_qkv [T, nq + 2 nkv, hd]: all three parts written.
  virtual void attention_backward(Tensor d_qkv, Tensor d_out, Tensor out, Tensor lse, Tensor qkv,
                                  const RowSpans& rows, const HeadLayout& heads) = 0;

  // Context parallelism's attention (ContextSpans), the all-gather form: this CP rank's T
  // queries, qkv [T, nq + 2 nkv, hd] after qk_norm_rope (its q heads read), against `whole`
  // [T_all, nq + 2 nkv, hd], every CP rank's qkv in the rows' order (its k and v heads read).
  // out [T, nq, hd], lse f32 [nq, T] (this backend's own layout). Softmax as attention_forward,
  // the keys summed in the rows' order: one rank's bits for each query (on CUDA through cuDNN,
  // ops/cuda/context_attention.h). The default refuses: `loom plan`'s shape backend prices CP
  // as its own rows' attention at cp times the keys and never calls it.
  virtual void attention_context_forward(Tensor out, Tensor lse, Tensor qkv, Tensor whole,
                                         const ContextSpans& spans, const HeadLayout& heads);
  // Its backward: d_qkv's q heads written and its k and v heads zeroed; d_whole [T_all, ...]
  // this rank's queries' part of every key's and value's gradient in its k and v heads, its q
  // heads zeroed (the CP ranks' parts are summed by a reduce-scatter, decoder.cpp).
  virtual void attention_context_backward(Tensor d_qkv, Tensor d_whole, Tensor d_out, Tensor out, Tensor lse,
                                          Tensor qkv, Tensor whole, const ContextSpans& spans,
                                          const HeadLayout& heads);

  // Context parallelism's ring form (docs/parallel.md, "The ring form"): the same attention,
  // one block of keys at a time. A block kv [T_b, 2 nkv, hd] is a CP rank's k heads then v
  // heads (its tokens in its order), and keys i32 [T_b] the micro-batch index of each of its
  // keys (MicroBatch::cp_rank_order's part for that rank). Query i of this rank (qkv
  // [T, nq + 2 nkv, hd], its q heads read) attends to the block's keys in [key_begin[i],
  // key_end[i]). out [T, nq, hd] and lse f32 [nq, T] (attention_context_forward's layout) are
  // the softmax over those keys alone; a query with none gets out 0 and lse −inf. The
  // defaults refuse: the CPU backend alone has them so far.
  virtual void attention_block_forward(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor keys,
                                       const ContextSpans& spans, const HeadLayout& heads);
  // Two softmaxes over disjoint keys made one (the online-softmax rule), in place on out and
  // lse: lse' = log(e^lse + e^block_lse), out' = out · e^(lse − lse') + block_out · e^(block_lse
  // − lse'). A side whose lse is −inf adds nothing. Shapes as attention_block_forward's.
  virtual void attention_block_merge(Tensor out, Tensor lse, Tensor block_out, Tensor block_lse);
  // The block's part of attention_context_backward, under the softmax over every block (out
  // and lse the merged ones): d_qkv's q heads += this block's part of dQ (its k and v heads are
  // not touched); d_kv [T_b, 2 nkv, hd] += this rank's queries' part of the block's dK and dV.
  virtual void attention_block_backward(Tensor d_qkv, Tensor d_kv, Tensor d_out, Tensor out, Tensor lse,
                                        Tensor qkv, Tensor kv, Tensor keys, const ContextSpans& spans,
                                        const HeadLayout& heads);

  // FP8 GEMM pieces (docs/numerics.md, "FP8 linear layers"; core/fp8.h). A tensor's FP8 form
  // is round(x · scale) in an FP8 dtype with scale = fp8_scale(amax(x)), and a GEMM of two
  // such operands multiplies its fp32 sum by both 1/scale. model/linear.h puts them together.
  //
  // amax f32[1] = max |x| over x (activation dtype or f32); NaN is passed over (the scale
  // rule keeps an infinite amax finite; a NaN reaches the GEMM and the loss as NaN).
  virtual void amax(Tensor amax, Tensor x) = 0;
  // The FP8 form of x [R, C] (activation dtype) under amax f32[1]: out [R, C] and out_t
  // [C, R'] (its transpose, for a GEMM that needs the other orientation; R' ≥ R, the columns
  // from R on written 0: a GEMM over R' then sums over R, as FP8 GEMMs need their K in
  // multiples of 16), either may be null, both of `format`; scale_inv f32[1] = 1 / scale.
  virtual void fp8_cast(Tensor out, Tensor out_t, Tensor scale_inv, Tensor x, Tensor amax, DType format) = 0;
  // out[M, N] = (a[M, K] · a_scale_inv) · (b[N, K] · b_scale_inv)ᵀ with fp32 sums: written
  // to an activation-dtype out, added to an f32 out (the main grads) when `accumulate`. a and
  // b FP8 (not both e5m2), scale_invs f32[1]. `fast_accumulation`: Hopper's FP8 accumulation
  // that folds partial sums into fp32 less often (the forward's; the CPU sums one way).
  virtual void fp8_gemm(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv,
                        bool accumulate, bool fast_accumulation) = 0;

  // Block scaling (core/fp8.h fp8_block_scale; docs/numerics.md): every block of 1 × 128
  // (activations, gradients) or 128 × 128 (weights) values has its own power-of-two scale from
  // its own amax, which the cast computes; no separate amax pass. An operand of a block-scaled
  // GEMM, viewed as the row-major [R, K] the GEMM reads, carries its inverse scales (value =
  // fp8 · scale_inv) as f32 in one of cuBLASLt's sm_90 layouts (core/quantized_tensor.h
  // Fp8Blocks, fp8_block_scales_shape). The CPU backend takes any dims, a last block shorter
  // than 128 being a block of its own; the CUDA backend needs 128-multiples where cuBLASLt
  // does (it refuses the others by shape).
  //
  // x [R, C] → out [R, C] in vec128 blocks along C; scale_inv [ceil(C/128), R].
  virtual void fp8_cast_rows(Tensor out, Tensor scale_inv, Tensor x, DType format) = 0;
  // x [R, C] → out_t = xᵀ [C, R'] in vec128 blocks along R (out_t's rows, x's columns), R' ≥ R,
  // out_t's columns from R on written 0; scale_inv [ceil(R'/128), C]. The weight gradient's
  // operands, blocked along the tokens they sum over.
  virtual void fp8_cast_columns(Tensor out_t, Tensor scale_inv, Tensor x, DType format) = 0;
  // w [R, C] → out [R, C] and out_t = wᵀ [C, R] under the same 128 × 128 blocks; scale_inv is
  // out's block128x128 layout [ceil(R/128), S(C)], scale_inv_t out_t's [ceil(C/128), S(R)].
  virtual void fp8_cast_blocks(Tensor out, Tensor out_t, Tensor scale_inv, Tensor scale_inv_t, Tensor w,
                               DType format) = 0;
  // out[M, N] = Σ over K's 128-blocks of (a's block · b's block) · their scale_invs, a [M, K]
  // and b [N, K] FP8 (not both e5m2) in the given layouts, not both block128x128; fp32 sums,
  // full accumulation (no fast accumulation with block scales). out as fp8_gemm's.
  virtual void fp8_gemm_blocks(Tensor out, Tensor a, Tensor a_scale_inv, Fp8Blocks a_blocks, Tensor b,
                               Tensor b_scale_inv, Fp8Blocks b_blocks, bool accumulate) = 0;

  // The census of one FP8 cast (docs/numerics.md, "FP8 statistics"): x [R, C] (activation
  // dtype) and q [R, C], its FP8 form, under scale_inv: f32[1] when `blocks` is empty (tensor
  // scaling), else in that block layout (fp8_block_scales_shape(blocks, R, C)). amax f32[1] =
  // max(amax, max |x|) (NaN passed over); counts i64[2] += (flushed: values x ≠ 0 whose FP8
  // form is ±0; clamped: |x| > fp8_clamp_bound(format) · scale_inv, infinities included), NaN
  // being neither. It reads the cast's operands again: for the steps that take statistics.
  virtual void fp8_census(Tensor counts, Tensor amax, Tensor x, Tensor q, Tensor scale_inv,
                          std::optional<Fp8Blocks> blocks) = 0;

  // The two calls a linear layer makes of the FP8 kernels above (model/linear.h), on the
  // value they share (core/quantized_tensor.h).
  //
  // q (its tensors allocated: quantized_allocate) made from x [R, C] of the activation dtype.
  // Tensor scaling: q.amax is x's amax where `amax_written` (the op producing x wrote it, ops.h
  // out_amax, and the caller reduced it over TP where x is sharded), else a pass computes it;
  // then one cast writes q.data and / or q.data_t under its scale. Block scaling: a weight's
  // 128 × 128 blocks in both orientations in one cast (fp8_cast_blocks); else q.data in 1 × 128
  // blocks along C (fp8_cast_rows) and q.data_t in 1 × 128 blocks along R (fp8_cast_columns).
  void quantize(QuantizedTensor& q, Tensor x, bool amax_written);
  // out[M, N] = a[M, K] · b[N, K]ᵀ with fp32 sums, written to an activation-dtype out or, with
  // `accumulate`, added to an f32 out (the main grads). Both operands plain (activation dtype,
  // linear_forward without a bias; never accumulating) or both quantized: tensor-scaled
  // through fp8_gemm (`fast_accumulation`: the forward's), block-scaled through
  // fp8_gemm_blocks (always full accumulation).
  void gemm(Tensor out, const GemmOperand& a, const GemmOperand& b, bool accumulate, bool fast_accumulation);

  // out = silu(gate) · up, gate_up [T, 2F] = [gate | up] per token, out [T, F]. out_amax
  // as for residual_rmsnorm_forward (of out; of d_gate_up in the backward).
  virtual void swiglu_forward(Tensor out, Tensor gate_up, Tensor out_amax) = 0;
  virtual void swiglu_backward(Tensor d_gate_up, Tensor d_out, Tensor gate_up, Tensor out_amax) = 0;

  // Mixture of experts (docs/numerics.md, "Mixture of experts"). A sparse layer's MLP sends
  // each of T tokens to k of E experts and sums their outputs weighted by the router: route,
  // sort the T·k (token, slot) pairs by expert, permute the tokens into that order, run each
  // expert's rows through its weights (grouped_linear), combine the rows back per token.
  //
  // From the router's logits [T, E] (activation dtype): probs f32[T, E] = softmax in fp32;
  // expert_ids i32[T, k] the k most probable experts, most probable first (equal probs: the
  // lower id first); weights f32[T, k] their probs, divided by the k probs' sum when
  // `normalize` (Qwen3's norm_topk_prob).
  virtual void moe_route_forward(Tensor expert_ids, Tensor weights, Tensor probs, Tensor logits,
                                 bool normalize) = 0;
  // d_logits [T, E] (activation dtype, written): the gradient through the softmax of d_weights
  // f32[T, k] (through the top-k and the normalization; the choice of experts is not
  // differentiated) plus, when d_probs_per_expert f32[E] is given, that much for every token's
  // probs[t, e] (a load-balancing loss's gradient, the same for every token).
  virtual void moe_route_backward(Tensor d_logits, Tensor d_weights, Tensor d_probs_per_expert, Tensor probs,
                                  Tensor expert_ids, Tensor weights, bool normalize) = 0;
  // The dispatch order: the T·k pairs (t, j) sorted stably by expert_ids[t, j], so by expert,
  // then token, then slot. positions i32[T, k]: each pair's place in that order; offsets
  // i32[E + 1]: where each expert's rows begin (offsets[E] = T·k).
  virtual void moe_sort(Tensor positions, Tensor offsets, Tensor expert_ids) = 0;
  // sorted[positions[t, j]] = x[t] (x [T, H], sorted [≥ T·k, H], activation dtype).
  virtual void moe_permute(Tensor sorted, Tensor x, Tensor positions) = 0;
  // Its backward: d_x[t] (+)= Σ_j d_sorted[positions[t, j]], summed in fp32 over j in order
  // (onto d_x's value when `accumulate`) and rounded once.
  virtual void moe_permute_backward(Tensor d_x, Tensor d_sorted, Tensor positions, bool accumulate) = 0;
  // out[t] = Σ_j weights[t, j] · y[positions[t, j]] in fp32 over j in order, rounded once
  // (y [≥ T·k, H], out [T, H]).
  virtual void moe_combine_forward(Tensor out, Tensor y, Tensor positions, Tensor weights) = 0;
  // d_y[positions[t, j]] = weights[t, j] · d_out[t]; d_weights f32[T, k] = Σ_h d_out[t, h] ·
  // y[positions[t, j], h] in fp32.
  virtual void moe_combine_backward(Tensor d_y, Tensor d_weights, Tensor d_out, Tensor y, Tensor positions,
                                    Tensor weights) = 0;
  // The experts' linear layers, one call for all: rows [offsets[e], offsets[e + 1]) of x [R, K]
  // through weight[e] (weight [E, N, K]): out[r] = x[r] · weight[e]ᵀ (out [R, N]), fp32 sums.
  // offsets i32[E + 1] stays on the device (no host wait); offsets[E] ≤ R, the rows past it
  // are neither read nor written; an expert may have no rows.
  virtual void grouped_linear_forward(Tensor out, Tensor x, Tensor weight, Tensor offsets) = 0;
  // As linear_backward per expert: d_x rows = d_out rows · weight[e] (skipped when d_x.data is
  // null); d_weight[e] += d_out rowsᵀ · x rows (f32 [E, N, K]; skipped when null; an expert
  // without rows adds nothing).
  virtual void grouped_linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                                       Tensor offsets) = 0;
  // out f32[C] = Σ_r x[r, c] over x f32[R, C], in a fixed order (the router's probs per
  // expert, for the load-balancing losses).
  virtual void column_sum(Tensor out, Tensor x) = 0;

  // The lm_head and the loss, fused so that full fp32 logits never exist. For each token t
  // with targets[t] >= 0: nll[t] = −log softmax(hidden[t] · Wᵀ)[targets[t]] (fp32), else 0.
  // When d_hidden.data is non-null, the gradient of grad_scale · Σ_t nll[t] is written to
  // d_hidden [T, H] and added to d_weight [V, H] (unless d_weight.data is null: a frozen
  // lm_head).  targets i32[T], nll f32[T].
  virtual void lm_head_loss(Tensor nll, Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                            Tensor targets, float grad_scale) = 0;

  // Tensor-parallel pieces (the vocab-parallel embedding, lm_head and loss of a model split
  // over TP ranks, Megatron's VocabParallelEmbedding and VocabParallelCrossEntropy; and the
  // residual add at a pipeline stage boundary). This rank holds vocabulary rows [vocab_begin,
  // vocab_begin + V_shard) of the table / weight. Both backends have them (the CUDA one chunks
  // the shard's logits as lm_head_loss does); decoder.cpp calls them under TP on CPU and GPU
  // ranks alike.
  //
  // out[t] = table[ids[t] − vocab_begin] for ids in the shard, else 0 (summed over TP it is
  // the embedding).  table [V_shard, H].
  virtual void embedding_forward_shard(Tensor out, Tensor ids, Tensor table, int64_t vocab_begin) = 0;
  // d_table[ids[t] − vocab_begin] += d_out[t] for ids in the shard.
  virtual void embedding_backward_shard(Tensor d_table, Tensor ids, Tensor d_out, int64_t vocab_begin) = 0;
  // The loss's forward over the shard's logits z = hidden · Wᵀ [T, V_shard]: lse[t] =
  // log Σ_v exp(z[t, v]) and target_logit[t] = z[t, targets[t] − vocab_begin] when the
  // target is in the shard, else 0; both 0 where targets[t] < 0.  lse, target_logit f32[T].
  virtual void lm_head_shard_forward(Tensor lse, Tensor target_logit, Tensor hidden, Tensor weight,
                                     Tensor targets, int64_t vocab_begin) = 0;
  // Its backward, given the log-sum-exp over the whole vocabulary: d z = grad_scale ·
  // (exp(z − lse) − onehot(target)) on the shard (0 where targets[t] < 0); d_hidden = d z · W
  // (this shard's part of the input gradient, written), d_weight += d zᵀ · hidden (skipped
  // when d_weight.data is null).
  virtual void lm_head_shard_backward(Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                                      Tensor targets, Tensor lse, int64_t vocab_begin, float grad_scale) = 0;
  // The shards' halves put together: lse[t] = log Σ_r exp(lse_parts[r, t]) over the TP
  // ranks' shard_forward lse (all-gathered, lse_parts [tp, T]), nll[t] = lse[t] −
  // target_logit[t] (target_logit summed over TP); both 0 where targets[t] < 0.
  virtual void lm_head_shard_combine(Tensor nll, Tensor lse, Tensor lse_parts, Tensor target_logit,
                                     Tensor targets) = 0;
  // out = a + b (as many values each, activation dtype; the CUDA backend adds in fp32 and
  // rounds once to bf16).
  virtual void add(Tensor out, Tensor a, Tensor b) = 0;

  // x = 0 (any dtype). Activations come from arenas that do not clear memory.
  virtual void fill_zero(Tensor x) = 0;

  // Rows by position (activation dtype; the lm_head's rows with a target, decoder.cpp):
  // gather out[i] = x[index[i]] (out [n, H], x [T, H]); scatter out[index[i]] = x[i] for each
  // i of index (x [≥ n, H], out [T, H]), leaving out's other rows as they are. index i32[n],
  // each in [0, T); scatter's are distinct.
  virtual void gather_rows(Tensor out, Tensor x, Tensor index) = 0;
  virtual void scatter_rows(Tensor out, Tensor x, Tensor index) = 0;

  // Σ x over an f32 tensor in a fixed order, returned to the host (waits for the device).
  virtual double sum(Tensor x) = 0;
  // x's bytes copied to host memory `out` (x.numel() · dtype_size(x.dtype) of them); waits
  // for the device.
  virtual void copy_to_host(void* out, Tensor x) = 0;
  // x's bytes from host memory `in` (x.numel() · dtype_size(x.dtype) of them): a few values
  // the host computed, such as a load-balancing loss's gradient. In stream order; `in` may be
  // reused once the call returns.
  virtual void copy_from_host(Tensor x, const void* in) = 0;
};

}  // namespace loom
