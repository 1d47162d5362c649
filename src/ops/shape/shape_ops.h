// ShapeOps: the op interface (ops/ops.h) on no device at all, for `loom plan`'s dry run
// (plan/dry_run.h). It stands for the CUDA backend (device cuda, bf16 activations): every
// op checks its tensors' shapes and dtypes as CudaOps does and does no math; the ops that
// take op workspace ask this backend's workspace arena for what the CUDA kernels ask for
// (ops/op_workspace.h, the functions they size their scratch with), and the position, RoPE
// and THD tables go into a tables arena as CudaOps keeps them. Both arenas count
// (CountingArena): after a dry run they hold what the engine's "op workspace" and "position
// and rope tables" arenas reserve.
//
// Every op also counts its work (OpWork): its FLOPs and the bytes of the tensors it reads and
// writes, by the class of work the time model rates apart (plan/time_model.cpp), so that the
// plan's time, like its memory, follows the model's own ops.
//
// cuDNN sizes its SDPA workspaces from its graph on the GPU, which a dry run cannot build:
// sdpa_backward_workspace_bytes is the model of it (a GUESS calibrated on measured peaks;
// plan/plan_constants.h) and the one place that says how big it is.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ops/ops.h"
#include "ops/shape/counting_arena.h"

namespace loom {

// The classes of work the time model rates apart: GEMMs by their rate (bf16 forward and
// backward, FP8 tensor-scaled forward and backward, FP8 block-scaled), SDPA forward and
// backward, the lm_head + loss, the HBM-bound kernels, and the FP8 amax passes and casts of
// the linear layers' operands; their weights' casts apart, as the FP8 weight cache (model/
// linear.h) casts a weight once a step, not once a micro-batch.
enum class OpWork {
  gemm_forward,
  gemm_backward,
  fp8_gemm_forward,
  fp8_gemm_backward,
  fp8_block_gemm,
  attention_forward,
  attention_backward,
  lm_head,
  elementwise,
  fp8_cast,
  fp8_weight_cast,
  count
};

struct OpCount {
  double flops = 0, bytes = 0;
};

// What a pass's ops did, summed by class (indexed by OpWork).
struct OpCounts {
  std::array<OpCount, static_cast<size_t>(OpWork::count)> by_class{};
  const OpCount& operator[](OpWork w) const { return by_class[static_cast<size_t>(w)]; }
  OpCount& operator[](OpWork w) { return by_class[static_cast<size_t>(w)]; }
};

struct ShapeOpsOptions {
  int64_t multiprocessors = 132;           // the GPU's (the kernels' grids are blocks a multiprocessor)
  int64_t loss_chunk_tokens = 8192;        // CudaOps(loss_chunk_tokens)
  bool attention_backward_by_row = false;  // CudaOps::set_attention_backward_by_row
  // cuDNN's SDPA workspaces: the backward's in fp32 dQ accumulators of one call's rows, the
  // forward's in bytes (plan/plan_constants.h says where the figures come from).
  double sdpa_backward_dq_units = 33.0;
  int64_t sdpa_forward_workspace_bytes = 0;
  // Context parallelism's ring form: each of the cp K/V blocks holds 1/cp of the rows' keys.
  int64_t cp = 1;
};

// cuDNN's deterministic SDPA backward workspace for one call over `rows` sequences of
// `row_tokens` tokens (after THD bucketing), modelled as dq_units fp32 dQ accumulators (of
// heads at least 128 wide).
int64_t sdpa_backward_workspace_bytes(int64_t rows, int64_t row_tokens, int64_t q_heads, int64_t head_dim,
                                      double dq_units);

class ShapeOps final : public Ops {
 public:
  explicit ShapeOps(ShapeOpsOptions options);

  Device device() const override { return Device::cuda; }
  DType activation_dtype() const override { return DType::bf16; }
  CountingArena& workspace() { return workspace_; }
  CountingArena& tables() { return tables_; }
  // The largest SDPA backward workspace asked for (0 before any backward).
  int64_t sdpa_backward_bytes() const { return sdpa_backward_bytes_; }
  // The ops' work so far.
  const OpCounts& counts() const { return counts_; }
  // The bf16 weights (the parameter store's buffer): an FP8 cast or amax of them is a weight's.
  void set_weights(Tensor weights) { weights_ = weights; }

  void embedding_forward(Tensor out, Tensor ids, Tensor table) override;
  void embedding_backward(Tensor d_table, Tensor ids, Tensor d_out) override;
  void linear_forward(Tensor out, Tensor x, Tensor weight, Tensor bias) override;
  void linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight) override;
  void lora_up_forward(Tensor out, Tensor t, const std::vector<LoraUp>& adapters, float scale) override;
  void lora_up_backward(Tensor d_t, Tensor d_out, Tensor t, const std::vector<LoraUp>& adapters,
                        float scale) override;
  void lora_dropout(Tensor out, Tensor x, const LoraDropoutMask& mask, bool accumulate) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Tensor out_amax) override;
  void residual_rmsnorm_forward(Tensor residual_out, Tensor out, Tensor rstd, Tensor residual, Tensor delta,
                                Tensor weight, float eps, Tensor out_amax) override;
  void rmsnorm_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight, Tensor rstd,
                        Tensor out_amax) override;
  void qk_norm_rope_forward(Tensor qkv_out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                            const RowSpans& rows, const HeadLayout& heads, float eps,
                            const RopeSpec& rope) override;
  void qk_norm_rope_backward(Tensor d_qkv, Tensor d_q_weight, Tensor d_k_weight, Tensor d_qkv_out, Tensor qkv,
                             Tensor q_weight, Tensor k_weight, Tensor rstd, const RowSpans& rows,
                             const HeadLayout& heads, const RopeSpec& rope, Tensor out_amax) override;
  void bias_add_forward(Tensor out, Tensor bias) override;
  void bias_backward(Tensor d_bias, Tensor d_out) override;
  void attention_forward(Tensor out, Tensor lse, Tensor qkv, const RowSpans& rows,
                         const HeadLayout& heads) override;
  void attention_backward(Tensor d_qkv, Tensor d_out, Tensor out, Tensor lse, Tensor qkv,
                          const RowSpans& rows, const HeadLayout& heads) override;
  // Context parallelism's attention, the all-gather form: this rank's queries by the keys of
  // their spans (ContextSpans), as attention_forward counts a row's.
  void attention_context_forward(Tensor out, Tensor lse, Tensor qkv, Tensor whole, const ContextSpans& spans,
                                 const HeadLayout& heads) override;
  void attention_context_backward(Tensor d_qkv, Tensor d_whole, Tensor d_out, Tensor out, Tensor lse,
                                  Tensor qkv, Tensor whole, const ContextSpans& spans,
                                  const HeadLayout& heads) override;
  // The ring form's blocks: 1/cp of the keys of the queries' spans each (over the cp steps,
  // what attention_context_* count).
  void attention_block_forward(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor keys,
                               const ContextSpans& spans, const HeadLayout& heads) override;
  void attention_block_merge(Tensor out, Tensor lse, Tensor block_out, Tensor block_lse) override;
  void attention_block_backward(Tensor d_qkv, Tensor d_kv, Tensor d_out, Tensor out, Tensor lse, Tensor qkv,
                                Tensor kv, Tensor keys, const ContextSpans& spans,
                                const HeadLayout& heads) override;
  void amax(Tensor amax, Tensor x) override;
  void fp8_cast(Tensor out, Tensor out_t, Tensor scale_inv, Tensor x, Tensor amax, DType format) override;
  void fp8_gemm(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, bool accumulate,
                bool fast_accumulation) override;
  void fp8_cast_rows(Tensor out, Tensor scale_inv, Tensor x, DType format) override;
  void fp8_cast_columns(Tensor out_t, Tensor scale_inv, Tensor x, DType format) override;
  void fp8_cast_blocks(Tensor out, Tensor out_t, Tensor scale_inv, Tensor scale_inv_t, Tensor w,
                       DType format) override;
  void fp8_gemm_blocks(Tensor out, Tensor a, Tensor a_scale_inv, Fp8Blocks a_blocks, Tensor b,
                       Tensor b_scale_inv, Fp8Blocks b_blocks, bool accumulate) override;
  void fp8_census(Tensor counts, Tensor amax, Tensor x, Tensor q, Tensor scale_inv,
                  std::optional<Fp8Blocks> blocks) override;
  void swiglu_forward(Tensor out, Tensor gate_up, Tensor out_amax) override;
  void swiglu_backward(Tensor d_gate_up, Tensor d_out, Tensor gate_up, Tensor out_amax) override;
  void lm_head_loss(Tensor nll, Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                    Tensor targets, float grad_scale) override;
  void embedding_forward_shard(Tensor out, Tensor ids, Tensor table, int64_t vocab_begin) override;
  void embedding_backward_shard(Tensor d_table, Tensor ids, Tensor d_out, int64_t vocab_begin) override;
  void lm_head_shard_forward(Tensor lse, Tensor target_logit, Tensor hidden, Tensor weight, Tensor targets,
                             int64_t vocab_begin) override;
  void lm_head_shard_backward(Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight, Tensor targets,
                              Tensor lse, int64_t vocab_begin, float grad_scale) override;
  void lm_head_shard_combine(Tensor nll, Tensor lse, Tensor lse_parts, Tensor target_logit,
                             Tensor targets) override;
  void add(Tensor out, Tensor a, Tensor b) override;
  void fill_zero(Tensor x) override;
  void gather_rows(Tensor out, Tensor x, Tensor index) override;
  void scatter_rows(Tensor out, Tensor x, Tensor index) override;
  void moe_route_forward(Tensor expert_ids, Tensor weights, Tensor probs, Tensor logits,
                         bool normalize) override;
  void moe_route_backward(Tensor d_logits, Tensor d_weights, Tensor d_probs_per_expert, Tensor probs,
                          Tensor expert_ids, Tensor weights, bool normalize) override;
  void moe_sort(Tensor positions, Tensor offsets, Tensor expert_ids) override;
  void moe_permute(Tensor sorted, Tensor x, Tensor positions) override;
  void moe_permute_backward(Tensor d_x, Tensor d_sorted, Tensor positions, bool accumulate) override;
  void moe_combine_forward(Tensor out, Tensor y, Tensor positions, Tensor weights) override;
  void moe_combine_backward(Tensor d_y, Tensor d_weights, Tensor d_out, Tensor y, Tensor positions,
                            Tensor weights) override;
  void grouped_linear_forward(Tensor out, Tensor x, Tensor weight, Tensor offsets) override;
  void grouped_linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                               Tensor offsets) override;
  void column_sum(Tensor out, Tensor x) override;
  // No values: 0, and zeros copied out.
  double sum(Tensor x) override;
  void copy_to_host(void* out, Tensor x) override;
  void copy_from_host(Tensor x, const void* in) override;

 private:
  // CudaOps's workspace_restart and one request of `bytes` (none when 0).
  void workspace_request(int64_t bytes, const char* what);
  // CudaOps::positions and rope_table: kept tables, a larger batch's in a new slot.
  void tables_for(const RowSpans& rows, int64_t head_dim);
  // The shape of one attention call (CudaOps::attention_shape) and, for THD, its arrays.
  struct CallShape {
    int64_t rows = 0, row_tokens = 0;
    bool ragged = false;
  };
  CallShape attention_call(const RowSpans& rows);
  void lm_head_chunks(int64_t tokens, int64_t vocab);
  void record(OpWork work, double flops, double bytes);
  // An FP8 amax pass or cast of x: a weight's or an activation's.
  void record_cast(const Tensor& x, double bytes);

  ShapeOpsOptions options_;
  CountingArena workspace_{"op workspace"};
  CountingArena tables_{"position and rope tables"};
  int64_t positions_capacity_ = 0, rope_positions_ = 0, ragged_capacity_ = 0, thd_calls_capacity_ = 0;
  int64_t sdpa_backward_bytes_ = 0;
  OpCounts counts_;
  Tensor weights_;
};

}  // namespace loom
