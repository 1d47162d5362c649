// Launchers of loom's own CUDA kernels, one .cu file per op family, forward and backward
// side by side. Each takes device pointers, sizes and a stream, and checks its launch.
// Activations are bf16, statistics and main grads fp32 (ops.h states the formulas).
//
// Determinism: no kernel here uses atomics on floating-point values. Reductions over tokens
// (norm weight gradients, the embedding gradient, sums) go through per-block partials that
// a second kernel adds in a fixed order, so a run gives the same bits every time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace loom::cuda {

using bf16 = __nv_bfloat16;

// Scratch a kernel pair needs for its partials: the caller gives `bytes` of device memory.
struct Scratch {
  void* data = nullptr;
  int64_t bytes = 0;
};

// rmsnorm.cu
// out = x·rstd·w; rstd[t] = 1/sqrt(mean(x[t]²) + eps). With residual: residual_out =
// bf16(residual + delta) first, and the norm reads residual_out (what backward gets as x).
// amax (may be null, here and in the backward): *amax = max |out| as stored (of d_x in the
// backward; ops.h out_amax).
void rmsnorm_forward(bf16* out, float* rstd, float* amax, const bf16* x, const bf16* weight, int64_t tokens,
                     int64_t hidden, float eps, cudaStream_t stream);
void residual_rmsnorm_forward(bf16* residual_out, bf16* out, float* rstd, float* amax, const bf16* residual,
                              const bf16* delta, const bf16* weight, int64_t tokens, int64_t hidden,
                              float eps, cudaStream_t stream);
// d_x += rstd·(w·dy − x̂·mean(w·dy·x̂)), x̂ = x·rstd; d_weight += Σ_t dy·x̂.
int64_t rmsnorm_backward_scratch_bytes(int64_t tokens, int64_t hidden);
void rmsnorm_backward(bf16* d_x, float* d_weight, float* amax, const bf16* d_out, const bf16* x,
                      const bf16* weight, const float* rstd, int64_t tokens, int64_t hidden, Scratch scratch,
                      cudaStream_t stream);

// qk_norm_rope.cu. qkv [T, nq + 2 nkv, hd]; positions i32[T] (restarting per row);
// rope f32x2[max_position + 1, hd / 2]: (cos, sin) of position · inv_freq[i], computed on the
// host as the CPU twin computes them (a table read is cheaper than sincosf per element).
// Null q_weight (and k_weight, rstd, d_q_weight, d_k_weight): no q/k norm, RoPE alone.
void qk_norm_rope_forward(bf16* qkv_out, float* rstd, const bf16* qkv, const bf16* q_weight,
                          const bf16* k_weight, const int32_t* positions, const float2* rope, int64_t tokens,
                          int64_t q_heads, int64_t kv_heads, int64_t head_dim, float eps,
                          cudaStream_t stream);
int64_t qk_norm_rope_backward_scratch_bytes(int64_t tokens, int64_t head_dim);
// d_qkv may be d_qkv_out (in place: the v heads are not written). amax (may be null): *amax =
// max |d_qkv| as stored, v heads included (ops.h out_amax).
void qk_norm_rope_backward(bf16* d_qkv, float* d_q_weight, float* d_k_weight, float* amax,
                           const bf16* d_qkv_out, const bf16* qkv, const bf16* q_weight, const bf16* k_weight,
                           const float* rstd, const int32_t* positions, const float2* rope, int64_t tokens,
                           int64_t q_heads, int64_t kv_heads, int64_t head_dim, Scratch scratch,
                           cudaStream_t stream);

// bias.cu. A linear layer's bias: out[t] += bias (out [T, N], fp32 sum rounded once);
// d_bias += Σ_t d_out[t] over row chunks, their partials added in a fixed order.
void bias_add_forward(bf16* out, const bf16* bias, int64_t tokens, int64_t width, cudaStream_t stream);
int64_t bias_backward_scratch_bytes(int64_t tokens, int64_t width);
void bias_backward(float* d_bias, const bf16* d_out, int64_t tokens, int64_t width, Scratch scratch,
                   cudaStream_t stream);

// swiglu.cu. gate_up [T, 2F] = [gate | up] per token, out [T, F]. amax (may be null): *amax =
// max |output| as stored (ops.h out_amax).
void swiglu_forward(bf16* out, float* amax, const bf16* gate_up, int64_t tokens, int64_t ffn,
                    cudaStream_t stream);
void swiglu_backward(bf16* d_gate_up, float* amax, const bf16* d_out, const bf16* gate_up, int64_t tokens,
                     int64_t ffn, cudaStream_t stream);

// add.cu. out = a + b over n bf16 values (fp32 sum, rounded once); any n, any alignment (16-
// byte aligned pointers take the vectorised path).
void add(bf16* out, const bf16* a, const bf16* b, int64_t n, cudaStream_t stream);

// lora_dropout.cu. LoRA dropout over x [rows, width] (ops.h LoraDropoutMask; the draws of
// ops/lora_dropout.h from `seed`, the mask's stream): out = x ⊙ m · scale, or with
// `accumulate` out += x ⊙ m · scale (fp32, rounded once). tokens i32[rows, 2].
void lora_dropout(bf16* out, const bf16* x, const int32_t* tokens, uint64_t seed, uint32_t threshold,
                  float scale, int64_t feature_begin, int64_t rows, int64_t width, bool accumulate,
                  cudaStream_t stream);

// rows.cu. Rows of `width` bf16 values by position, for i < n: gather out[i] = x[index[i]];
// scatter out[index[i]] = x[i] (the other rows of out untouched).
void gather_rows(bf16* out, const bf16* x, const int32_t* index, int64_t n, int64_t width,
                 cudaStream_t stream);
void scatter_rows(bf16* out, const bf16* x, const int32_t* index, int64_t n, int64_t width,
                  cudaStream_t stream);

// context_kv.cu. Context parallelism's pieces' keys (context_attention.h): kv_pieces[p] [2
// nkv, hd] = the k and v heads of whole[source[p]] (whole [·, nq + 2 nkv, hd]), p < packed.
void context_kv_gather(bf16* kv_pieces, const bf16* whole, const int32_t* source, int64_t packed,
                       int64_t q_heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream);
// Its d_whole [tokens, nq + 2 nkv, hd] from the pieces'
// blocks d_kv_pieces [·, 2 nkv, hd] (context_attention.h): token j's q heads 0, its k and v
// heads Σ_s d_kv_pieces[cover[j, s]] over s < cover_width in order (fp32, rounded once),
// stopping at the first −1. head_dim a multiple of 8.
void context_kv_sum(bf16* d_whole, const bf16* d_kv_pieces, const int32_t* cover, int64_t cover_width,
                    int64_t tokens, int64_t q_heads, int64_t kv_heads, int64_t head_dim, cudaStream_t stream);

// embedding.cu. On the table's rows [vocab_begin, vocab_begin + vocab) (the whole table:
// vocab_begin 0, vocab its rows; a tensor-parallel shard: its rows): out[t] = table[ids[t] −
// vocab_begin], 0 for ids outside. The backward adds d_out[t] to d_table[ids[t] −
// vocab_begin] for ids inside: it sorts (row, position) pairs with a stable radix sort and
// adds each row's tokens in position order.
void embedding_forward(bf16* out, const int32_t* ids, const bf16* table, int64_t tokens, int64_t hidden,
                       int64_t vocab_begin, int64_t vocab, cudaStream_t stream);
int64_t embedding_backward_scratch_bytes(int64_t tokens);
void embedding_backward(float* d_table, const int32_t* ids, const bf16* d_out, int64_t tokens, int64_t hidden,
                        int64_t vocab_begin, int64_t vocab, Scratch scratch, cudaStream_t stream);

// moe.cu. The mixture-of-experts ops of ops.h, T tokens each routed to k of E experts.
// Route: a warp a token, softmax in fp32 over E ≤ 512 logits (bf16 [T, E]), top-k ≤ 32 by
// repeated warp maxima (equal probs: the lower id), as the CPU twin selects; the backward
// through the softmax of d_weights (and d_probs_per_expert f32[E], may be null), d_logits bf16.
constexpr int64_t kMoeMaxExperts = 512, kMoeMaxTopK = 32;
void moe_route_forward(int32_t* expert_ids, float* weights, float* probs, const bf16* logits, int64_t tokens,
                       int64_t experts, int64_t k, bool normalize, cudaStream_t stream);
void moe_route_backward(bf16* d_logits, const float* d_weights, const float* d_probs_per_expert,
                        const float* probs, const int32_t* expert_ids, const float* weights, int64_t tokens,
                        int64_t experts, int64_t k, bool normalize, cudaStream_t stream);
// A stable counting sort of the `pairs` expert ids (ids i32[T·k], (token, slot) order) on the
// device: positions i32[pairs], offsets i32[experts + 1]. Ids outside [0, experts) (a caller's
// bug, which the CPU twin throws for) sort after offsets[experts], inside the arrays.
constexpr int64_t kMoeSortMaxExperts = 1024;
int64_t moe_sort_scratch_bytes(int64_t pairs, int64_t experts);
void moe_sort(int32_t* positions, int32_t* offsets, const int32_t* expert_ids, int64_t pairs, int64_t experts,
              Scratch scratch, cudaStream_t stream);
// Rows of `hidden` bf16 values, a block a token, fp32 sums over the slots in order rounded
// once: permute sorted[positions[t, j]] = x[t]; its backward d_x[t] (+)= Σ_j
// d_sorted[positions[t, j]]; combine out[t] = Σ_j weights[t, j] · y[positions[t, j]]; its
// backward, a warp a pair, d_y[positions[t, j]] = weights[t, j] · d_out[t] and d_weights[t, j]
// = d_out[t] · y[positions[t, j]] (a warp's fixed-order sum).
void moe_permute(bf16* sorted, const bf16* x, const int32_t* positions, int64_t tokens, int64_t k,
                 int64_t hidden, cudaStream_t stream);
void moe_permute_backward(bf16* d_x, const bf16* d_sorted, const int32_t* positions, int64_t tokens,
                          int64_t k, int64_t hidden, bool accumulate, cudaStream_t stream);
void moe_combine_forward(bf16* out, const bf16* y, const int32_t* positions, const float* weights,
                         int64_t tokens, int64_t k, int64_t hidden, cudaStream_t stream);
void moe_combine_backward(bf16* d_y, float* d_weights, const bf16* d_out, const bf16* y,
                          const int32_t* positions, const float* weights, int64_t tokens, int64_t k,
                          int64_t hidden, cudaStream_t stream);
// out f32[cols] = Σ_r x[r] over x f32[rows, cols]: fp64 sums of 256-row chunks, added in order.
int64_t column_sum_scratch_bytes(int64_t rows, int64_t cols);
void column_sum(float* out, const float* x, int64_t rows, int64_t cols, Scratch scratch, cudaStream_t stream);

// grouped_linear.cu. The experts' GEMMs over rows grouped by expert (ops.h grouped_linear_*):
// rows [offsets[e], offsets[e + 1]) of the [rows, ·] operands go with weight[e] (weight bf16
// [experts, n, k]); offsets i32[experts + 1] is read on the device. fp32 sums, deterministic:
// each output element is one thread's sum in a fixed order (no atomics). Tiled CUDA-core
// kernels for the shapes CUTLASS's grouped kernel (grouped_gemm.h) cannot take: n or k not a
// multiple of 8 (cuda_ops.cpp grouped_linear_forward / _backward).
// forward: out [rows, n] = x [rows, k] · weight[e]ᵀ.
void grouped_linear_forward(bf16* out, const bf16* x, const bf16* weight, const int32_t* offsets,
                            int64_t experts, int64_t rows, int64_t n, int64_t k, cudaStream_t stream);
// backward_input: d_x [rows, k] = d_out [rows, n] · weight[e].
void grouped_linear_backward_input(bf16* d_x, const bf16* d_out, const bf16* weight, const int32_t* offsets,
                                   int64_t experts, int64_t rows, int64_t n, int64_t k, cudaStream_t stream);
// backward_weight: d_weight[e] (f32 [experts, n, k]) += d_out rowsᵀ · x rows.
void grouped_linear_backward_weight(float* d_weight, const bf16* d_out, const bf16* x, const int32_t* offsets,
                                    int64_t experts, int64_t rows, int64_t n, int64_t k, cudaStream_t stream);

// loss.cu. On one chunk of bf16 logits [rows, V]: nll[r] = lse − logit[target] in fp32
// (0 where target < 0); with `write_grad`, the logits are overwritten by
// grad_scale·(softmax − onehot(target)) in bf16 (0 rows where target < 0).
void softmax_xent_inplace(bf16* logits, float* nll, const int32_t* targets, int64_t rows, int64_t vocab,
                          float grad_scale, bool write_grad, cudaStream_t stream);
// The vocab-parallel halves, on a chunk of a shard's logits [rows, V_shard] (the shard holds
// vocabulary rows [vocab_begin, vocab_begin + V_shard)). Forward: lse[r] = log Σ exp(logits[r])
// and target_logit[r] = logits[r, targets[r] − vocab_begin] when the target is in the shard,
// else 0; both 0 where targets[r] < 0.
void shard_logsumexp(float* lse, float* target_logit, const bf16* logits, const int32_t* targets,
                     int64_t rows, int64_t vocab, int64_t vocab_begin, cudaStream_t stream);
// Backward, given the whole vocabulary's lse f32[rows]: the logits are overwritten by
// grad_scale·(exp(logits − lse) − onehot(targets − vocab_begin)) in bf16 (0 rows where
// targets[r] < 0).
void shard_xent_grad_inplace(bf16* logits, const float* lse, const int32_t* targets, int64_t rows,
                             int64_t vocab, int64_t vocab_begin, float grad_scale, cudaStream_t stream);
// Over the shards' lse_parts f32[parts, tokens]: lse[t] = log Σ_p exp(lse_parts[p, t]) (around
// the largest part), nll[t] = lse[t] − target_logit[t]; both 0 where targets[t] < 0.
void shard_combine(float* nll, float* lse, const float* lse_parts, const float* target_logit,
                   const int32_t* targets, int64_t parts, int64_t tokens, cudaStream_t stream);

// reduce.cu. Σ x (or Σ x² with `square`) over n fp32 values, in a fixed order, into
// *result (fp64, device).
int64_t reduce_scratch_bytes();
void reduce_sum(double* result, const float* x, int64_t n, bool square, Scratch scratch, cudaStream_t stream);
// x *= scale, then Σ x² into *result, in one pass: bit for bit scale_inplace followed by
// reduce_sum(square), x included.
void scale_reduce_sum_squares(double* result, float* x, int64_t n, float scale, Scratch scratch,
                              cudaStream_t stream);
// x *= scale over n fp32 values.
void scale_inplace(float* x, int64_t n, float scale, cudaStream_t stream);
// counts[ranges[r].slot] += the values of x[offset, offset + numel) that are NaN or ±inf (by
// their exponent bits, whatever the compiler's float flags), for each of the `count` ranges
// (device array; max_numel: the largest range's numel, which sizes the grid). counts is
// added into: zero it first. Integer atomics, one a warp: the counts are exact, whatever the
// order (the failure path of a non-finite grad norm: which tensors hold the non-finite grads).
struct CountRange {
  int64_t offset;
  int64_t numel;
  int32_t slot;
};
void count_nonfinite(unsigned long long* counts, const float* x, const CountRange* ranges, int count,
                     int64_t max_numel, cudaStream_t stream);
// fp8.cu (ops.h amax and fp8_cast; core/fp8.h). amax: *result = max |x| (NaN passed over),
// the one kernel here with an atomic, an integer max whose result does not depend on order.
// fp8_cast: out [rows, cols] and/or out_t [cols, out_t_rows] (null to skip; out_t_rows ≥ rows,
// the columns from rows on written 0) in e4m3 (or e5m2), scale from *amax, *scale_inv =
// 1/scale; cols and out_t_rows multiples of 8, x 16-byte aligned.
void amax(float* result, const bf16* x, int64_t n, cudaStream_t stream);
void amax(float* result, const float* x, int64_t n, cudaStream_t stream);
void fp8_cast(uint8_t* out, uint8_t* out_t, int64_t out_t_rows, float* scale_inv, const bf16* x,
              const float* amax, int64_t rows, int64_t cols, bool e5m2, cudaStream_t stream);
// Block scaling (ops.h fp8_cast_rows, fp8_cast_columns, fp8_cast_blocks; core/fp8.h
// fp8_block_scale), each block's amax found in the kernel. rows: scale_inv [cols/128, rows],
// cols a multiple of 128. columns: out_t [cols, out_t_rows] and scale_inv
// [out_t_rows/128, cols], out_t_rows a multiple of 128 ≥ rows, cols a multiple of 64.
// blocks: out [rows, cols], out_t [cols, rows], scale_inv [rows/128, ld], scale_inv_t
// [cols/128, ld_t] (the row strides, their padding written 0), rows and cols multiples of 128.
void fp8_cast_rows(uint8_t* out, float* scale_inv, const bf16* x, int64_t rows, int64_t cols, bool e5m2,
                   cudaStream_t stream);
void fp8_cast_columns(uint8_t* out_t, int64_t out_t_rows, float* scale_inv, const bf16* x, int64_t rows,
                      int64_t cols, bool e5m2, cudaStream_t stream);
void fp8_cast_blocks(uint8_t* out, uint8_t* out_t, float* scale_inv, int64_t ld, float* scale_inv_t,
                     int64_t ld_t, const bf16* w, int64_t rows, int64_t cols, bool e5m2, cudaStream_t stream);
// ops.h fp8_census; scale_layout 0 (one scale), 1 (vec128) or 2 (block128x128, rows of
// scale_ld), cols a multiple of 8, x 16-byte and q 8-byte aligned.
void fp8_census(int64_t* counts, float* amax, const bf16* x, const uint8_t* q, const float* scale_inv,
                int scale_layout, int64_t scale_ld, int64_t rows, int64_t cols, bool e5m2,
                cudaStream_t stream);

// A 64-bit fingerprint of `bytes` (even) bytes into *result (device): equal bits give equal
// fingerprints, different ones differ but with probability ~2⁻⁶⁴ (GEMM tuning's check that a
// candidate algorithm computes the heuristic's bits).
void fingerprint(unsigned long long* result, const void* data, int64_t bytes, cudaStream_t stream);

// adam.cu. The precision-aware AdamW (docs/numerics.md, TE FusedAdam with
// store_param_remainders): per element, the fp32 master is rebuilt from the bf16 weight and
// its int16 remainder, updated operation for operation as the CPU reference
// (src/optim/adamw.cpp, no FMA contraction), and split back. Tensors are ranges of one flat
// buffer: chunks[i] = {offset, numel, decay} in elements. The update's grad is
// grad[i] · grad_scale rounded to fp32: bit for bit scale_inplace(grad, grad_scale) first
// (the step's grad clip, without a pass of its own); 1 changes no bit.
struct AdamChunk {
  int64_t offset;
  int64_t numel;
  int32_t decay;
};
struct AdamScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction1, bias_correction2, eps, lr,
      weight_decay;
};
void adamw_bf16_remainder(uint16_t* param_bits, int16_t* remainder, const float* grad, float* m, float* v,
                          const AdamChunk* chunks, int64_t chunk_count, AdamScalars scalars, float grad_scale,
                          cudaStream_t stream);
// The same update on explicit fp32 masters (master[i] in place of the rebuilt one): the
// baseline of `loom check optimizer --device cuda`, equal bit for bit to the CPU's adamw_step.
void adamw_fp32(float* master, const float* grad, float* m, float* v, const AdamChunk* chunks,
                int64_t chunk_count, AdamScalars scalars, cudaStream_t stream);

}  // namespace loom::cuda
