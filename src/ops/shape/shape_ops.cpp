#include "ops/shape/shape_ops.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"
#include "ops/op_workspace.h"
#include "ops/thd_groups.h"

namespace loom {
namespace {

constexpr DType kAct = DType::bf16;

void check_fp8_format(const char* op, DType format) {
  if (format != DType::e4m3 && format != DType::e5m2) throw_runtime_failure(op, "format is not FP8");
}

void check_fp8_operands(const char* op, const Tensor& a, const Tensor& b) {
  const auto fp8 = [](DType d) { return d == DType::e4m3 || d == DType::e5m2; };
  if (!fp8(a.dtype) || !fp8(b.dtype) || (a.dtype == DType::e5m2 && b.dtype == DType::e5m2))
    throw_runtime_failure(op, "a and b must be FP8, not both e5m2");
}

void check_block_scales(const char* op, const char* name, const Tensor& scale_inv, Fp8Blocks blocks,
                        int64_t rows, int64_t cols) {
  const Shape shape = fp8_block_scales_shape(blocks, rows, cols);
  check_tensor(op, name, scale_inv, DType::f32, {shape[0], shape[1]});
}

// The CUDA backend's block-scaled kernels and cuBLASLt's GEMMs take whole 128-blocks only.
void require_blocks(const char* op, const std::string& shapes, std::initializer_list<int64_t> dims) {
  for (int64_t d : dims)
    if (d % kFp8BlockSize != 0)
      throw_runtime_failure(op, shapes + ": block-scaled FP8 on CUDA needs these dims in multiples of 128");
}

void check_amax(const char* op, const Tensor& out_amax) {
  if (out_amax.data) check_tensor(op, "out_amax", out_amax, DType::f32, {1});
}

void check_lm_head(const char* op, const Tensor& hidden, const Tensor& weight, const Tensor& targets) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1];
  check_tensor(op, "hidden", hidden, kAct, {t, h});
  check_tensor(op, "weight", weight, kAct, {weight.shape[0], h});
  check_tensor(op, "targets", targets, DType::i32, {t});
}

void check_lm_head_grads(const char* op, const Tensor& d_hidden, const Tensor& d_weight, const Tensor& hidden,
                         const Tensor& weight) {
  if (!d_hidden.data) throw_runtime_failure(op, "d_hidden is null");
  check_tensor(op, "d_hidden", d_hidden, kAct, {hidden.shape[0], hidden.shape[1]});
  if (d_weight.data) check_tensor(op, "d_weight", d_weight, DType::f32, {weight.shape[0], weight.shape[1]});
}

// The bytes of the tensors an op reads or writes (those it is given).
double io(std::initializer_list<Tensor> tensors) {
  double bytes = 0;
  for (const Tensor& t : tensors)
    if (t.data) bytes += static_cast<double>(t.nbytes());
  return bytes;
}

// Causal SDPA forward: QKᵀ and PV, 2 FLOPs a multiply-add, over half of each row's square,
// per query head.
double attention_flops(const RowSpans& rows, const HeadLayout& heads) {
  double squares = 0;
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const double n = rows.offsets[static_cast<size_t>(r + 1)] - rows.offsets[static_cast<size_t>(r)];
    squares += n * n;
  }
  return 2.0 * squares * static_cast<double>(heads.head_dim * heads.q_heads);
}

// One GEMM of the lm_head: the hidden rows by the weight's vocabulary rows.
double lm_head_flops(const Tensor& hidden, const Tensor& weight) {
  return 2.0 * static_cast<double>(hidden.shape[0] * hidden.shape[1] * weight.shape[0]);
}

}  // namespace

int64_t sdpa_backward_workspace_bytes(int64_t rows, int64_t row_tokens, int64_t q_heads, int64_t head_dim,
                                      double dq_units) {
  // A head narrower than 128 takes a 128-wide dQ: fitted to one peak (Llama-3.2-1B, head_dim
  // 64, on an H100: 49.82 GiB, bench/results/2026-12-06-h100-isolated-families-fp8-block.json,
  // 4.1 GiB above 33 units of its own dQ), unverified against cuDNN's own figure.
  const double dq_accumulator =
      4.0 * static_cast<double>(rows * row_tokens * q_heads * std::max<int64_t>(head_dim, 128));
  return static_cast<int64_t>(dq_units * dq_accumulator);
}

ShapeOps::ShapeOps(ShapeOpsOptions options) : options_(options) {
  tables_.allocate_bytes(sizeof(double), "reduction result");  // CudaOps's constructor
}

void ShapeOps::workspace_request(int64_t bytes, const char* what) {
  workspace_.release_all();
  if (bytes > 0) workspace_.allocate_bytes(bytes, what);
}

void ShapeOps::record(OpWork work, double flops, double bytes) {
  counts_[work].flops += flops;
  counts_[work].bytes += bytes;
}

void ShapeOps::record_cast(const Tensor& x, double bytes) {
  const auto begin = reinterpret_cast<uintptr_t>(weights_.data), at = reinterpret_cast<uintptr_t>(x.data);
  const bool weight = begin != 0 && at >= begin && at < begin + weights_.nbytes();
  record(weight ? OpWork::fp8_weight_cast : OpWork::fp8_cast, 0, bytes);
}

void ShapeOps::tables_for(const RowSpans& rows, int64_t head_dim) {
  const int64_t t = rows.tokens();
  if (t > positions_capacity_) {
    tables_.allocate_bytes(t * 4, "token positions");
    positions_capacity_ = t;
  }
  int64_t longest = 0;
  for (int64_t r = 0; r < rows.rows(); ++r)
    longest = std::max<int64_t>(
        longest, rows.offsets[static_cast<size_t>(r + 1)] - rows.offsets[static_cast<size_t>(r)]);
  if (longest > rope_positions_) {  // cos and sin of each position and frequency, fp32
    tables_.allocate_bytes(2 * longest * (head_dim / 2) * 4, "rope cos/sin table");
    rope_positions_ = longest;
  }
}

ShapeOps::CallShape ShapeOps::attention_call(const RowSpans& rows) {
  const int64_t n = rows.rows() > 0 ? rows.offsets[1] - rows.offsets[0] : 0;
  int64_t longest = 0;
  bool equal = true;
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const int64_t len = rows.offsets[static_cast<size_t>(r + 1)] - rows.offsets[static_cast<size_t>(r)];
    equal = equal && len == n;
    longest = std::max(longest, len);
  }
  if (equal) return {rows.rows(), n, false};
  using op_workspace::power_of_two_at_least;
  const CallShape call{power_of_two_at_least(rows.rows(), op_workspace::kThdMinSequences),
                       power_of_two_at_least(longest, op_workspace::kThdMinSequenceTokens), true};
  const int64_t values = 4 * call.rows + 3;  // lengths, then the qkv, out and lse offsets
  if (values > ragged_capacity_) {
    tables_.allocate_bytes(values * 4, "THD lengths and offsets");
    ragged_capacity_ = values;
  }
  return call;
}

void ShapeOps::embedding_forward(Tensor out, Tensor ids, Tensor table) {
  embedding_forward_shard(out, ids, table, 0);
}

void ShapeOps::embedding_backward(Tensor d_table, Tensor ids, Tensor d_out) {
  embedding_backward_shard(d_table, ids, d_out, 0);
}

void ShapeOps::embedding_forward_shard(Tensor out, Tensor ids, Tensor table, int64_t) {
  const int64_t t = ids.numel(), v = table.shape[0], h = table.shape[1];
  check_tensor("embedding_forward", "ids", ids, DType::i32, {t});
  check_tensor("embedding_forward", "table", table, kAct, {v, h});
  check_tensor("embedding_forward", "out", out, kAct, {t, h});
  // Gathers t rows of the table.
  record(OpWork::elementwise, 0, io({ids, out}) + static_cast<double>(out.nbytes()));
}

void ShapeOps::embedding_backward_shard(Tensor d_table, Tensor ids, Tensor d_out, int64_t) {
  const int64_t t = ids.numel(), v = d_table.shape[0], h = d_table.shape[1];
  check_tensor("embedding_backward", "ids", ids, DType::i32, {t});
  check_tensor("embedding_backward", "d_table", d_table, DType::f32, {v, h});
  check_tensor("embedding_backward", "d_out", d_out, kAct, {t, h});
  workspace_request(op_workspace::embedding_backward_bytes(t, op_workspace::embedding_sort_bytes_estimate(t)),
                    "embedding sort");
  // Adds t rows into the fp32 table gradient (each read and written).
  record(OpWork::elementwise, 0, io({ids, d_out}) + 2.0 * static_cast<double>(t * h) * 4.0);
}

void ShapeOps::linear_forward(Tensor out, Tensor x, Tensor weight, Tensor bias) {
  const int64_t t = x.shape[0], k = x.shape[1], n = weight.shape[0];
  check_tensor("linear_forward", "x", x, kAct, {t, k});
  check_tensor("linear_forward", "weight", weight, kAct, {n, k});
  check_tensor("linear_forward", "out", out, kAct, {t, n});
  if (bias.data) check_tensor("linear_forward", "bias", bias, kAct, {n});
  record(OpWork::gemm_forward, 2.0 * static_cast<double>(t * n * k), io({out, x, weight, bias}));
}

void ShapeOps::lora_up_forward(Tensor out, Tensor t, const std::vector<LoraUp>& adapters, float scale) {
  (void)scale;
  const int64_t r = lora_up_check("lora_up_forward", out, t, adapters, kAct, kAct, false);
  double flops = 0;
  for (const LoraUp& a : adapters) flops += 2.0 * static_cast<double>(out.shape[0] * a.b.shape[0] * r);
  record(OpWork::gemm_forward, flops, io({out, t}));
}

void ShapeOps::lora_up_backward(Tensor d_t, Tensor d_out, Tensor t, const std::vector<LoraUp>& adapters,
                                float scale) {
  (void)scale;
  const int64_t r = lora_up_check("lora_up_backward", d_out, d_t, adapters, kAct, kAct, true);
  check_tensor("lora_up_backward", "t", t, kAct, {d_t.shape[0], d_t.shape[1]});
  double flops = 0;
  for (const LoraUp& a : adapters) flops += 4.0 * static_cast<double>(d_out.shape[0] * a.b.shape[0] * r);
  record(OpWork::gemm_backward, flops, io({d_t, d_out, t}));
}

void ShapeOps::lora_dropout(Tensor out, Tensor x, const LoraDropoutMask& mask, bool accumulate) {
  lora_dropout_check(out, x, mask, kAct);
  // x and the tokens read, out written (and read where it accumulates).
  record(OpWork::elementwise, 0,
         io({out, x, mask.tokens}) + (accumulate ? static_cast<double>(out.nbytes()) : 0.0));
}

void ShapeOps::linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight) {
  const int64_t t = d_out.shape[0], k = weight.shape[1], n = weight.shape[0];
  check_tensor("linear_backward", "d_out", d_out, kAct, {t, n});
  if (d_x.data) check_tensor("linear_backward", "d_x", d_x, kAct, {t, k});
  if (d_weight.data) {
    check_tensor("linear_backward", "d_weight", d_weight, DType::f32, {n, k});
    check_tensor("linear_backward", "x", x, kAct, {t, k});
  }
  const double gemms = (d_x.data ? 1.0 : 0.0) + (d_weight.data ? 1.0 : 0.0);
  record(OpWork::gemm_backward, gemms * 2.0 * static_cast<double>(t * n * k),
         io({d_x, d_weight, d_out, x, weight}));
}

void ShapeOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float, Tensor out_amax) {
  const int64_t t = x.shape[0], h = x.shape[1];
  check_tensor("rmsnorm_forward", "x", x, kAct, {t, h});
  check_tensor("rmsnorm_forward", "out", out, kAct, {t, h});
  check_tensor("rmsnorm_forward", "rstd", rstd, DType::f32, {t});
  check_tensor("rmsnorm_forward", "weight", weight, kAct, {h});
  check_amax("rmsnorm_forward", out_amax);
  record(OpWork::elementwise, 0, io({out, rstd, x, weight}));
}

void ShapeOps::residual_rmsnorm_forward(Tensor residual_out, Tensor out, Tensor rstd, Tensor residual,
                                        Tensor delta, Tensor weight, float, Tensor out_amax) {
  const int64_t t = residual.shape[0], h = residual.shape[1];
  check_tensor("residual_rmsnorm_forward", "residual", residual, kAct, {t, h});
  check_tensor("residual_rmsnorm_forward", "delta", delta, kAct, {t, h});
  check_tensor("residual_rmsnorm_forward", "residual_out", residual_out, kAct, {t, h});
  check_tensor("residual_rmsnorm_forward", "out", out, kAct, {t, h});
  check_tensor("residual_rmsnorm_forward", "rstd", rstd, DType::f32, {t});
  check_tensor("residual_rmsnorm_forward", "weight", weight, kAct, {h});
  check_amax("residual_rmsnorm_forward", out_amax);
  record(OpWork::elementwise, 0, io({residual_out, out, rstd, residual, delta, weight}));
}

void ShapeOps::rmsnorm_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                                Tensor rstd, Tensor out_amax) {
  const int64_t t = x.shape[0], h = x.shape[1];
  check_tensor("rmsnorm_backward", "d_x", d_x, kAct, {t, h});
  if (d_weight.data) check_tensor("rmsnorm_backward", "d_weight", d_weight, DType::f32, {h});
  check_tensor("rmsnorm_backward", "d_out", d_out, kAct, {t, h});
  check_tensor("rmsnorm_backward", "weight", weight, kAct, {h});
  check_tensor("rmsnorm_backward", "rstd", rstd, DType::f32, {t});
  check_amax("rmsnorm_backward", out_amax);
  workspace_request(op_workspace::rmsnorm_backward_bytes(t, h, options_.multiprocessors), "rmsnorm partials");
  record(OpWork::elementwise, 0, io({d_x, d_weight, d_out, x, weight, rstd}));
}

void ShapeOps::qk_norm_rope_forward(Tensor qkv_out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                                    const RowSpans& rows, const HeadLayout& heads, float, const RopeSpec&) {
  const int64_t t = rows.tokens(), hd = heads.head_dim;
  check_tensor("qk_norm_rope_forward", "qkv", qkv, kAct, {t, heads.total_heads(), hd});
  check_tensor("qk_norm_rope_forward", "qkv_out", qkv_out, kAct, {t, heads.total_heads(), hd});
  if (q_weight.data) {
    check_tensor("qk_norm_rope_forward", "rstd", rstd, DType::f32, {t, heads.q_heads + heads.kv_heads});
    check_tensor("qk_norm_rope_forward", "q_weight", q_weight, kAct, {hd});
    check_tensor("qk_norm_rope_forward", "k_weight", k_weight, kAct, {hd});
  }
  tables_for(rows, hd);
  record(OpWork::elementwise, 0, io({qkv_out, rstd, qkv}));
}

void ShapeOps::qk_norm_rope_backward(Tensor d_qkv, Tensor d_q_weight, Tensor d_k_weight, Tensor d_qkv_out,
                                     Tensor qkv, Tensor q_weight, Tensor, Tensor, const RowSpans& rows,
                                     const HeadLayout& heads, const RopeSpec&, Tensor out_amax) {
  const int64_t t = rows.tokens(), hd = heads.head_dim;
  check_tensor("qk_norm_rope_backward", "d_qkv", d_qkv, kAct, {t, heads.total_heads(), hd});
  check_tensor("qk_norm_rope_backward", "d_qkv_out", d_qkv_out, kAct, {t, heads.total_heads(), hd});
  check_tensor("qk_norm_rope_backward", "qkv", qkv, kAct, {t, heads.total_heads(), hd});
  if (q_weight.data && d_q_weight.data) {
    check_tensor("qk_norm_rope_backward", "d_q_weight", d_q_weight, DType::f32, {hd});
    check_tensor("qk_norm_rope_backward", "d_k_weight", d_k_weight, DType::f32, {hd});
  }
  check_amax("qk_norm_rope_backward", out_amax);
  tables_for(rows, hd);
  workspace_request(op_workspace::qk_norm_rope_backward_bytes(t, hd, options_.multiprocessors),
                    "q/k norm partials");
  record(OpWork::elementwise, 0, io({d_qkv, d_qkv_out, qkv}));
}

void ShapeOps::bias_add_forward(Tensor out, Tensor bias) {
  const int64_t t = out.shape[0], n = bias.numel();
  check_tensor("bias_add_forward", "out", out, kAct, {t, n});
  check_tensor("bias_add_forward", "bias", bias, kAct, {n});
  record(OpWork::elementwise, 0, 2.0 * static_cast<double>(out.nbytes()));
}

void ShapeOps::bias_backward(Tensor d_bias, Tensor d_out) {
  const int64_t t = d_out.shape[0], n = d_bias.numel();
  check_tensor("bias_backward", "d_out", d_out, kAct, {t, n});
  check_tensor("bias_backward", "d_bias", d_bias, DType::f32, {n});
  workspace_request(op_workspace::bias_backward_bytes(t, n), "bias gradient partials");
  record(OpWork::elementwise, 0, io({d_bias, d_out}));
}

void ShapeOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, const RowSpans& rows,
                                 const HeadLayout& heads) {
  const int64_t t = rows.tokens();
  attention_call(rows);
  check_tensor("attention_forward", "qkv", qkv, kAct, {t, heads.total_heads(), heads.head_dim});
  check_tensor("attention_forward", "out", out, kAct, {t, heads.q_heads, heads.head_dim});
  check_tensor("attention_forward", "lse", lse, DType::f32, {heads.q_heads, t});
  workspace_request(options_.sdpa_forward_workspace_bytes, "SDPA forward workspace");
  record(OpWork::attention_forward, attention_flops(rows, heads), io({out, lse, qkv}));
}

void ShapeOps::attention_backward(Tensor d_qkv, Tensor d_out, Tensor out, Tensor lse, Tensor qkv,
                                  const RowSpans& rows, const HeadLayout& heads) {
  const int64_t t = rows.tokens();
  const CallShape call = attention_call(rows);
  check_tensor("attention_backward", "d_qkv", d_qkv, kAct, {t, heads.total_heads(), heads.head_dim});
  check_tensor("attention_backward", "d_out", d_out, kAct, {t, heads.q_heads, heads.head_dim});
  check_tensor("attention_backward", "out", out, kAct, {t, heads.q_heads, heads.head_dim});
  check_tensor("attention_backward", "lse", lse, DType::f32, {heads.q_heads, t});
  check_tensor("attention_backward", "qkv", qkv, kAct, {t, heads.total_heads(), heads.head_dim});
  // ops/cuda/attention.h: one row a call when asked; THD in the CUDA ops' groups of calls
  // (ops/thd_groups.h), each sized here with the plan's dQ units.
  int64_t bytes = 0;
  if (call.ragged) {
    const std::vector<ThdGroup> groups = thd_backward_groups(rows.offsets, thd_workspace_model(heads));
    int64_t values = 0;
    for (const ThdGroup& g : groups) {
      values += 4 * g.sequences + 3;
      bytes = std::max(bytes, sdpa_backward_workspace_bytes(g.sequences, g.sequence_tokens, heads.q_heads,
                                                            heads.head_dim, options_.sdpa_backward_dq_units));
    }
    if (values > thd_calls_capacity_) {
      tables_.allocate_bytes(values * 4, "THD lengths and offsets");
      thd_calls_capacity_ = values;
    }
  } else {
    const int64_t rows_a_call = options_.attention_backward_by_row ? 1 : call.rows;
    bytes = sdpa_backward_workspace_bytes(rows_a_call, call.row_tokens, heads.q_heads, heads.head_dim,
                                          options_.sdpa_backward_dq_units);
  }
  sdpa_backward_bytes_ = std::max(sdpa_backward_bytes_, bytes);
  workspace_request(bytes, "SDPA backward workspace");
  // The backward's FLOPs: 2.5 × the forward's (dQ, dK, dV and the recomputed scores).
  record(OpWork::attention_backward, 2.5 * attention_flops(rows, heads), io({d_qkv, d_out, out, lse, qkv}));
}

namespace {

// Context parallelism's attention: 2 FLOPs a multiply-add for QKᵀ and for PV, per query
// head, over each query's keys (its span up to itself: the causal half of a row, as
// attention_flops counts), times `share` of them.
double context_flops(const ContextSpans& spans, const HeadLayout& heads, double share) {
  double pairs = 0;
  for (size_t i = 0; i < spans.key_begin.size(); ++i) pairs += spans.key_end[i] - spans.key_begin[i];
  return 4.0 * pairs * share * static_cast<double>(heads.head_dim * heads.q_heads);
}

void check_block_shapes(const char* op, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                        const Tensor& kv, const Tensor& keys, const HeadLayout& heads) {
  const int64_t t = qkv.shape[0];
  check_tensor(op, "qkv", qkv, kAct, {t, heads.total_heads(), heads.head_dim});
  check_tensor(op, "kv", kv, kAct, {-1, 2 * heads.kv_heads, heads.head_dim});
  check_tensor(op, "keys", keys, DType::i32, {kv.shape[0]});
  check_tensor(op, "out", out, kAct, {t, heads.q_heads, heads.head_dim});
  check_tensor(op, "lse", lse, DType::f32, {heads.q_heads, t});
}

}  // namespace

void ShapeOps::attention_context_forward(Tensor out, Tensor lse, Tensor qkv, Tensor whole,
                                         const ContextSpans& spans, const HeadLayout& heads) {
  const int64_t t = qkv.shape[0];
  check_tensor("attention_context_forward", "qkv", qkv, kAct, {t, heads.total_heads(), heads.head_dim});
  check_tensor("attention_context_forward", "whole", whole, kAct, {-1, heads.total_heads(), heads.head_dim});
  check_tensor("attention_context_forward", "out", out, kAct, {t, heads.q_heads, heads.head_dim});
  check_tensor("attention_context_forward", "lse", lse, DType::f32, {heads.q_heads, t});
  workspace_request(options_.sdpa_forward_workspace_bytes, "SDPA forward workspace");
  record(OpWork::attention_forward, context_flops(spans, heads, 1.0), io({out, lse, qkv, whole}));
}

void ShapeOps::attention_context_backward(Tensor d_qkv, Tensor d_whole, Tensor d_out, Tensor out, Tensor lse,
                                          Tensor qkv, Tensor whole, const ContextSpans& spans,
                                          const HeadLayout& heads) {
  const int64_t t = qkv.shape[0];
  check_tensor("attention_context_backward", "d_qkv", d_qkv, kAct, {t, heads.total_heads(), heads.head_dim});
  check_tensor("attention_context_backward", "d_whole", d_whole, kAct,
               {whole.shape[0], heads.total_heads(), heads.head_dim});
  check_tensor("attention_context_backward", "d_out", d_out, kAct, {t, heads.q_heads, heads.head_dim});
  check_tensor("attention_context_backward", "out", out, kAct, {t, heads.q_heads, heads.head_dim});
  check_tensor("attention_context_backward", "lse", lse, DType::f32, {heads.q_heads, t});
  // Modelled as one SDPA backward call over the rank's T queries.
  const int64_t bytes =
      sdpa_backward_workspace_bytes(1, t, heads.q_heads, heads.head_dim, options_.sdpa_backward_dq_units);
  sdpa_backward_bytes_ = std::max(sdpa_backward_bytes_, bytes);
  workspace_request(bytes, "SDPA backward workspace");
  record(OpWork::attention_backward, 2.5 * context_flops(spans, heads, 1.0),
         io({d_qkv, d_whole, d_out, out, lse, qkv, whole}));
}

void ShapeOps::attention_block_forward(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor keys,
                                       const ContextSpans& spans, const HeadLayout& heads) {
  check_block_shapes("attention_block_forward", out, lse, qkv, kv, keys, heads);
  workspace_request(options_.sdpa_forward_workspace_bytes, "SDPA forward workspace");
  record(OpWork::attention_forward, context_flops(spans, heads, 1.0 / static_cast<double>(options_.cp)),
         io({out, lse, qkv, kv, keys}));
}

void ShapeOps::attention_block_merge(Tensor out, Tensor lse, Tensor block_out, Tensor block_lse) {
  check_tensor("attention_block_merge", "block_out", block_out, kAct,
               {out.shape[0], out.shape[1], out.shape[2]});
  check_tensor("attention_block_merge", "block_lse", block_lse, DType::f32, {lse.shape[0], lse.shape[1]});
  record(OpWork::elementwise, 0, 2 * io({out, lse}) + io({block_out, block_lse}));
}

void ShapeOps::attention_block_backward(Tensor d_qkv, Tensor d_kv, Tensor d_out, Tensor out, Tensor lse,
                                        Tensor qkv, Tensor kv, Tensor keys, const ContextSpans& spans,
                                        const HeadLayout& heads) {
  check_block_shapes("attention_block_backward", out, lse, qkv, kv, keys, heads);
  check_tensor("attention_block_backward", "d_qkv", d_qkv, kAct,
               {qkv.shape[0], heads.total_heads(), heads.head_dim});
  check_tensor("attention_block_backward", "d_out", d_out, kAct,
               {qkv.shape[0], heads.q_heads, heads.head_dim});
  check_tensor("attention_block_backward", "d_kv", d_kv, kAct,
               {kv.shape[0], 2 * heads.kv_heads, heads.head_dim});
  // Modelled as one SDPA backward call over the rank's T queries (a block has as many keys).
  const int64_t bytes = sdpa_backward_workspace_bytes(1, qkv.shape[0], heads.q_heads, heads.head_dim,
                                                      options_.sdpa_backward_dq_units);
  sdpa_backward_bytes_ = std::max(sdpa_backward_bytes_, bytes);
  workspace_request(bytes, "SDPA backward workspace");
  record(OpWork::attention_backward,
         2.5 * context_flops(spans, heads, 1.0 / static_cast<double>(options_.cp)),
         io({d_qkv, d_kv, d_out, out, lse, qkv, kv, keys}));
}

void ShapeOps::amax(Tensor amax, Tensor x) {
  check_tensor("amax", "amax", amax, DType::f32, {1});
  if (x.dtype != DType::f32 && x.dtype != kAct)
    throw_runtime_failure("amax", "x is " + dtype_name(x.dtype) + ", expected BF16 or F32");
  record_cast(x, static_cast<double>(x.nbytes()));
}

void ShapeOps::fp8_cast(Tensor out, Tensor out_t, Tensor scale_inv, Tensor x, Tensor amax, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  check_fp8_format("fp8_cast", format);
  check_tensor("fp8_cast", "x", x, kAct, {r, c});
  check_tensor("fp8_cast", "amax", amax, DType::f32, {1});
  check_tensor("fp8_cast", "scale_inv", scale_inv, DType::f32, {1});
  if (out.data) check_tensor("fp8_cast", "out", out, format, {r, c});
  if (out_t.data) check_tensor("fp8_cast", "out_t", out_t, format, {c, -1});
  const int64_t ld = out_t.data ? out_t.shape[1] : r;
  if (c % 8 != 0 || ld < r || (out_t.data && ld % 8 != 0))
    throw_runtime_failure("fp8_cast",
                          "x is " + x.shape.str() + ", out_t " + out_t.shape.str() +
                              "; the FP8 cast needs columns in multiples of 8, and out_t's rows at "
                              "least x's rows, a multiple of 8");
  record_cast(x, io({out, out_t, x}));
}

void ShapeOps::fp8_gemm(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv,
                        bool accumulate, bool fast_accumulation) {
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[0];
  check_fp8_operands("fp8_gemm", a, b);
  check_tensor("fp8_gemm", "b", b, b.dtype, {n, k});
  check_tensor("fp8_gemm", "a_scale_inv", a_scale_inv, DType::f32, {1});
  check_tensor("fp8_gemm", "b_scale_inv", b_scale_inv, DType::f32, {1});
  check_tensor("fp8_gemm", "out", out, accumulate ? DType::f32 : kAct, {m, n});
  if (n % 16 != 0 || k % 16 != 0)
    throw_runtime_failure("fp8_gemm", "m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                          " k=" + std::to_string(k) +
                                          "; cuBLASLt's FP8 GEMMs need n and k in multiples of 16");
  // The linear layers' forward GEMMs accumulate fast (model/linear.cpp), their backward ones do not.
  record(fast_accumulation ? OpWork::fp8_gemm_forward : OpWork::fp8_gemm_backward,
         2.0 * static_cast<double>(m * n * k), io({out, a, b}));
}

void ShapeOps::fp8_cast_rows(Tensor out, Tensor scale_inv, Tensor x, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  check_fp8_format("fp8_cast_rows", format);
  check_tensor("fp8_cast_rows", "x", x, kAct, {r, c});
  check_tensor("fp8_cast_rows", "out", out, format, {r, c});
  check_block_scales("fp8_cast_rows", "scale_inv", scale_inv, Fp8Blocks::vec128, r, c);
  require_blocks("fp8_cast_rows", "x " + x.shape.str() + " (its columns)", {c});
  record_cast(x, io({out, x}));
}

void ShapeOps::fp8_cast_columns(Tensor out_t, Tensor scale_inv, Tensor x, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  check_fp8_format("fp8_cast_columns", format);
  check_tensor("fp8_cast_columns", "x", x, kAct, {r, c});
  check_tensor("fp8_cast_columns", "out_t", out_t, format, {c, -1});
  const int64_t ld = out_t.shape[1];
  if (ld < r)
    throw_runtime_failure("fp8_cast_columns", "out_t " + out_t.shape.str() + " is narrower than x's rows");
  check_block_scales("fp8_cast_columns", "scale_inv", scale_inv, Fp8Blocks::vec128, c, ld);
  require_blocks("fp8_cast_columns",
                 "x " + x.shape.str() + ", out_t " + out_t.shape.str() + " (both of out_t's dims)", {c, ld});
  record_cast(x, io({out_t, x}));
}

void ShapeOps::fp8_cast_blocks(Tensor out, Tensor out_t, Tensor scale_inv, Tensor scale_inv_t, Tensor w,
                               DType format) {
  const int64_t r = w.shape[0], c = w.shape[1];
  check_fp8_format("fp8_cast_blocks", format);
  check_tensor("fp8_cast_blocks", "w", w, kAct, {r, c});
  check_tensor("fp8_cast_blocks", "out", out, format, {r, c});
  check_tensor("fp8_cast_blocks", "out_t", out_t, format, {c, r});
  check_block_scales("fp8_cast_blocks", "scale_inv", scale_inv, Fp8Blocks::block128x128, r, c);
  check_block_scales("fp8_cast_blocks", "scale_inv_t", scale_inv_t, Fp8Blocks::block128x128, c, r);
  require_blocks("fp8_cast_blocks", "w " + w.shape.str(), {r, c});
  record_cast(w, io({out, out_t, w}));
}

void ShapeOps::fp8_gemm_blocks(Tensor out, Tensor a, Tensor a_scale_inv, Fp8Blocks a_blocks, Tensor b,
                               Tensor b_scale_inv, Fp8Blocks b_blocks, bool accumulate) {
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[0];
  check_fp8_operands("fp8_gemm_blocks", a, b);
  if (a_blocks == Fp8Blocks::block128x128 && b_blocks == Fp8Blocks::block128x128)
    throw_runtime_failure("fp8_gemm_blocks", "a and b are both 128x128-blocked; cuBLASLt needs one 1x128");
  check_tensor("fp8_gemm_blocks", "b", b, b.dtype, {n, k});
  check_block_scales("fp8_gemm_blocks", "a_scale_inv", a_scale_inv, a_blocks, m, k);
  check_block_scales("fp8_gemm_blocks", "b_scale_inv", b_scale_inv, b_blocks, n, k);
  check_tensor("fp8_gemm_blocks", "out", out, accumulate ? DType::f32 : kAct, {m, n});
  require_blocks("fp8_gemm_blocks",
                 "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k), {m, n, k});
  record(OpWork::fp8_block_gemm, 2.0 * static_cast<double>(m * n * k), io({out, a, b}));
}

// Not counted: the statistics run on the steps that take them (train.fp8_stats), not on each.
void ShapeOps::fp8_census(Tensor counts, Tensor amax, Tensor x, Tensor q, Tensor scale_inv,
                          std::optional<Fp8Blocks> blocks) {
  const int64_t r = x.shape[0], c = x.shape[1];
  check_tensor("fp8_census", "counts", counts, DType::i64, {2});
  check_tensor("fp8_census", "amax", amax, DType::f32, {1});
  check_tensor("fp8_census", "x", x, kAct, {r, c});
  check_fp8_format("fp8_census", q.dtype);
  check_tensor("fp8_census", "q", q, q.dtype, {r, c});
  if (blocks)
    check_block_scales("fp8_census", "scale_inv", scale_inv, *blocks, r, c);
  else
    check_tensor("fp8_census", "scale_inv", scale_inv, DType::f32, {1});
}

void ShapeOps::swiglu_forward(Tensor out, Tensor gate_up, Tensor out_amax) {
  const int64_t t = gate_up.shape[0], f = gate_up.shape[1] / 2;
  check_tensor("swiglu_forward", "out", out, kAct, {t, f});
  check_tensor("swiglu_forward", "gate_up", gate_up, kAct, {t, 2 * f});
  check_amax("swiglu_forward", out_amax);
  record(OpWork::elementwise, 0, io({out, gate_up}));
}

void ShapeOps::swiglu_backward(Tensor d_gate_up, Tensor d_out, Tensor gate_up, Tensor out_amax) {
  const int64_t t = gate_up.shape[0], f = gate_up.shape[1] / 2;
  check_tensor("swiglu_backward", "d_gate_up", d_gate_up, kAct, {t, 2 * f});
  check_tensor("swiglu_backward", "d_out", d_out, kAct, {t, f});
  check_amax("swiglu_backward", out_amax);
  record(OpWork::elementwise, 0, io({d_gate_up, d_out, gate_up}));
}

void ShapeOps::lm_head_chunks(int64_t tokens, int64_t vocab) {
  workspace_.release_all();
  workspace_.allocate_bytes(op_workspace::lm_head_logits_bytes(tokens, vocab, options_.loss_chunk_tokens),
                            "lm_head logits chunk");
}

void ShapeOps::lm_head_loss(Tensor nll, Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                            Tensor targets, float) {
  check_lm_head("lm_head_loss", hidden, weight, targets);
  check_tensor("lm_head_loss", "nll", nll, DType::f32, {hidden.shape[0]});
  if (d_hidden.data) check_lm_head_grads("lm_head_loss", d_hidden, d_weight, hidden, weight);
  lm_head_chunks(hidden.shape[0], weight.shape[0]);
  // Logits, then with gradients the hidden's and the weight's (not a frozen one's): a GEMM each.
  const double gemms = 1.0 + (d_hidden.data ? 1.0 : 0.0) + (d_hidden.data && d_weight.data ? 1.0 : 0.0);
  record(OpWork::lm_head, gemms * lm_head_flops(hidden, weight), io({d_hidden, d_weight, hidden, weight}));
}

void ShapeOps::lm_head_shard_forward(Tensor lse, Tensor target_logit, Tensor hidden, Tensor weight,
                                     Tensor targets, int64_t) {
  const int64_t t = hidden.shape[0];
  check_lm_head("lm_head_shard_forward", hidden, weight, targets);
  check_tensor("lm_head_shard_forward", "lse", lse, DType::f32, {t});
  check_tensor("lm_head_shard_forward", "target_logit", target_logit, DType::f32, {t});
  lm_head_chunks(t, weight.shape[0]);
  record(OpWork::lm_head, lm_head_flops(hidden, weight), io({hidden, weight}));
}

void ShapeOps::lm_head_shard_backward(Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                                      Tensor targets, Tensor lse, int64_t, float) {
  check_lm_head("lm_head_shard_backward", hidden, weight, targets);
  check_tensor("lm_head_shard_backward", "lse", lse, DType::f32, {hidden.shape[0]});
  check_lm_head_grads("lm_head_shard_backward", d_hidden, d_weight, hidden, weight);
  lm_head_chunks(hidden.shape[0], weight.shape[0]);
  // The logits again, then the hidden's and the weight's (not a frozen one's) gradients.
  record(OpWork::lm_head, (d_weight.data ? 3.0 : 2.0) * lm_head_flops(hidden, weight),
         io({d_hidden, d_weight, hidden, weight}));
}

void ShapeOps::lm_head_shard_combine(Tensor nll, Tensor lse, Tensor lse_parts, Tensor target_logit,
                                     Tensor targets) {
  const int64_t t = targets.numel(), parts = lse_parts.shape[0];
  check_tensor("lm_head_shard_combine", "targets", targets, DType::i32, {t});
  check_tensor("lm_head_shard_combine", "lse_parts", lse_parts, DType::f32, {parts, t});
  check_tensor("lm_head_shard_combine", "target_logit", target_logit, DType::f32, {t});
  check_tensor("lm_head_shard_combine", "lse", lse, DType::f32, {t});
  check_tensor("lm_head_shard_combine", "nll", nll, DType::f32, {t});
  record(OpWork::elementwise, 0, io({nll, lse, lse_parts, target_logit, targets}));
}

void ShapeOps::add(Tensor out, Tensor a, Tensor b) {
  const int64_t n = a.numel();
  for (const Tensor* x : {&out, &a, &b})
    if (x->dtype != kAct || x->numel() != n || x->device != Device::cuda)
      throw_runtime_failure("add", "a tensor is not a CUDA bf16 tensor of " + std::to_string(n) +
                                       " values (a's size): " + dtype_name(x->dtype) + " " + x->shape.str());
  record(OpWork::elementwise, 0, io({out, a, b}));
}

void ShapeOps::fill_zero(Tensor x) {
  if (x.device != Device::cuda) throw_runtime_failure("fill_zero", "x is not a CUDA tensor");
  record(OpWork::elementwise, 0, static_cast<double>(x.nbytes()));
}

void ShapeOps::gather_rows(Tensor out, Tensor x, Tensor index) {
  const int64_t n = index.numel(), h = x.shape[1];
  check_tensor("gather_rows", "index", index, DType::i32, {n});
  check_tensor("gather_rows", "x", x, kAct, {-1, h});
  check_tensor("gather_rows", "out", out, kAct, {n, h});
  record(OpWork::elementwise, 0, io({out, index}) + static_cast<double>(out.nbytes()));
}

void ShapeOps::scatter_rows(Tensor out, Tensor x, Tensor index) {
  const int64_t n = index.numel(), h = out.shape[1];
  check_tensor("scatter_rows", "index", index, DType::i32, {n});
  check_tensor("scatter_rows", "out", out, kAct, {-1, h});
  check_tensor("scatter_rows", "x", x, kAct, {-1, h});
  LOOM_ASSERT(x.shape[0] >= n, "scatter_rows: fewer rows than positions");
  record(OpWork::elementwise, 0,
         static_cast<double>(index.nbytes()) + 2.0 * static_cast<double>(n * h * dtype_size(kAct)));
}

void ShapeOps::moe_route_forward(Tensor expert_ids, Tensor weights, Tensor probs, Tensor logits, bool) {
  const int64_t t = logits.shape[0], e = logits.shape[1], k = expert_ids.shape[1];
  check_tensor("moe_route_forward", "logits", logits, kAct, {t, e});
  check_tensor("moe_route_forward", "probs", probs, DType::f32, {t, e});
  check_tensor("moe_route_forward", "expert_ids", expert_ids, DType::i32, {t, k});
  check_tensor("moe_route_forward", "weights", weights, DType::f32, {t, k});
  record(OpWork::elementwise, 0, io({expert_ids, weights, probs, logits}));
}

void ShapeOps::moe_route_backward(Tensor d_logits, Tensor d_weights, Tensor d_probs_per_expert, Tensor probs,
                                  Tensor expert_ids, Tensor weights, bool) {
  const int64_t t = probs.shape[0], e = probs.shape[1], k = expert_ids.shape[1];
  check_tensor("moe_route_backward", "d_logits", d_logits, kAct, {t, e});
  check_tensor("moe_route_backward", "d_weights", d_weights, DType::f32, {t, k});
  check_tensor("moe_route_backward", "probs", probs, DType::f32, {t, e});
  check_tensor("moe_route_backward", "weights", weights, DType::f32, {t, k});
  if (d_probs_per_expert.data)
    check_tensor("moe_route_backward", "d_probs_per_expert", d_probs_per_expert, DType::f32, {e});
  record(OpWork::elementwise, 0, io({d_logits, d_weights, probs, expert_ids, weights}));
}

void ShapeOps::moe_sort(Tensor positions, Tensor offsets, Tensor expert_ids) {
  const int64_t t = expert_ids.shape[0], k = expert_ids.shape[1];
  check_tensor("moe_sort", "expert_ids", expert_ids, DType::i32, {t, k});
  check_tensor("moe_sort", "positions", positions, DType::i32, {t, k});
  check_tensor("moe_sort", "offsets", offsets, DType::i32, {offsets.numel()});
  workspace_request(op_workspace::moe_sort_bytes(t * k, offsets.numel() - 1), "moe_sort counts");
  record(OpWork::elementwise, 0, io({positions, offsets, expert_ids}));
}

void ShapeOps::moe_permute(Tensor sorted, Tensor x, Tensor positions) {
  const int64_t t = x.shape[0], h = x.shape[1], k = positions.shape[1];
  check_tensor("moe_permute", "x", x, kAct, {t, h});
  check_tensor("moe_permute", "positions", positions, DType::i32, {t, k});
  check_tensor("moe_permute", "sorted", sorted, kAct, {-1, h});
  record(OpWork::elementwise, 0, io({x, positions}) + static_cast<double>(t * k * h * dtype_size(kAct)));
}

void ShapeOps::moe_permute_backward(Tensor d_x, Tensor d_sorted, Tensor positions, bool accumulate) {
  const int64_t t = d_x.shape[0], h = d_x.shape[1], k = positions.shape[1];
  check_tensor("moe_permute_backward", "d_x", d_x, kAct, {t, h});
  check_tensor("moe_permute_backward", "positions", positions, DType::i32, {t, k});
  check_tensor("moe_permute_backward", "d_sorted", d_sorted, kAct, {-1, h});
  record(OpWork::elementwise, 0,
         io({positions}) + static_cast<double>((t * k + (accumulate ? 2 : 1) * t) * h * dtype_size(kAct)));
}

void ShapeOps::moe_combine_forward(Tensor out, Tensor y, Tensor positions, Tensor weights) {
  const int64_t t = out.shape[0], h = out.shape[1], k = positions.shape[1];
  check_tensor("moe_combine_forward", "out", out, kAct, {t, h});
  check_tensor("moe_combine_forward", "positions", positions, DType::i32, {t, k});
  check_tensor("moe_combine_forward", "weights", weights, DType::f32, {t, k});
  check_tensor("moe_combine_forward", "y", y, kAct, {-1, h});
  record(OpWork::elementwise, 0,
         io({out, positions, weights}) + static_cast<double>(t * k * h * dtype_size(kAct)));
}

void ShapeOps::moe_combine_backward(Tensor d_y, Tensor d_weights, Tensor d_out, Tensor y, Tensor positions,
                                    Tensor weights) {
  const int64_t t = d_out.shape[0], h = d_out.shape[1], k = positions.shape[1];
  check_tensor("moe_combine_backward", "d_out", d_out, kAct, {t, h});
  check_tensor("moe_combine_backward", "positions", positions, DType::i32, {t, k});
  check_tensor("moe_combine_backward", "weights", weights, DType::f32, {t, k});
  check_tensor("moe_combine_backward", "d_weights", d_weights, DType::f32, {t, k});
  check_tensor("moe_combine_backward", "y", y, kAct, {-1, h});
  check_tensor("moe_combine_backward", "d_y", d_y, kAct, {-1, h});
  record(
      OpWork::elementwise, 0,
      io({d_out, positions, weights, d_weights}) + 2.0 * static_cast<double>(t * k * h * dtype_size(kAct)));
}

void ShapeOps::grouped_linear_forward(Tensor out, Tensor x, Tensor weight, Tensor offsets) {
  const int64_t r = x.shape[0], e = weight.shape[0], n = weight.shape[1], k = weight.shape[2];
  check_tensor("grouped_linear_forward", "weight", weight, kAct, {e, n, k});
  check_tensor("grouped_linear_forward", "x", x, kAct, {r, k});
  check_tensor("grouped_linear_forward", "out", out, kAct, {r, n});
  check_tensor("grouped_linear_forward", "offsets", offsets, DType::i32, {e + 1});
  // CUTLASS's per-expert arguments (none where the CUDA-core kernels run), as cuda_ops.cpp asks.
  workspace_request(op_workspace::grouped_linear_bytes(e, n, k, options_.multiprocessors),
                    "grouped GEMM arguments");
  // Every row is some expert's (the rows are the dispatch's, offsets[E] = R).
  record(OpWork::gemm_forward, 2.0 * static_cast<double>(r * n * k), io({out, x, weight}));
}

void ShapeOps::grouped_linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                                       Tensor offsets) {
  const int64_t r = d_out.shape[0], e = weight.shape[0], n = weight.shape[1], k = weight.shape[2];
  check_tensor("grouped_linear_backward", "weight", weight, kAct, {e, n, k});
  check_tensor("grouped_linear_backward", "d_out", d_out, kAct, {r, n});
  check_tensor("grouped_linear_backward", "offsets", offsets, DType::i32, {e + 1});
  if (d_x.data) check_tensor("grouped_linear_backward", "d_x", d_x, kAct, {r, k});
  if (d_weight.data) {
    check_tensor("grouped_linear_backward", "d_weight", d_weight, DType::f32, {e, n, k});
    check_tensor("grouped_linear_backward", "x", x, kAct, {r, k});
  }
  // One workspace for both GEMMs, as cuda_ops.cpp asks.
  workspace_request(op_workspace::grouped_linear_bytes(e, n, k, options_.multiprocessors),
                    "grouped GEMM arguments");
  const double gemms = (d_x.data ? 1.0 : 0.0) + (d_weight.data ? 1.0 : 0.0);
  record(OpWork::gemm_backward, gemms * 2.0 * static_cast<double>(r * n * k),
         io({d_x, d_weight, d_out, x, weight}));
}

void ShapeOps::column_sum(Tensor out, Tensor x) {
  check_tensor("column_sum", "x", x, DType::f32, {-1, -1});
  check_tensor("column_sum", "out", out, DType::f32, {x.shape[1]});
  workspace_request(op_workspace::column_sum_bytes(x.shape[0], x.shape[1]), "column_sum partials");
  record(OpWork::elementwise, 0, io({out, x}));
}

double ShapeOps::sum(Tensor x) {
  check_tensor("sum", "x", x, DType::f32, {x.numel()});
  record(OpWork::elementwise, 0, static_cast<double>(x.nbytes()));
  workspace_request(op_workspace::reduce_bytes(options_.multiprocessors), "reduction partials");
  return 0.0;
}

void ShapeOps::copy_from_host(Tensor x, const void*) {
  if (x.device != Device::cuda) throw_runtime_failure("copy_from_host", "x is not a CUDA tensor");
  record(OpWork::elementwise, 0, static_cast<double>(x.nbytes()));
}

void ShapeOps::copy_to_host(void* out, Tensor x) {
  if (x.device != Device::cuda) throw_runtime_failure("copy_to_host", "x is not a CUDA tensor");
  std::memset(out, 0, x.nbytes());
}

}  // namespace loom
