// The CPU backend: fp32 everywhere, plain loops over threads (core/parallel.h).
//
// It is the numerical truth the CUDA backend is tested against and what the golden tests
// compare with Hugging Face transformers, so it favours clarity and determinism over
// speed: reductions that cross threads (weight gradients, norms' weight gradients) are
// split into fixed-size blocks of tokens summed in block order, so results do not depend
// on the number of threads.
#pragma once

#include "ops/ops.h"

namespace loom {

// Not final: tests derive from it to watch what the model asks of its ops (test_fp8_amax).
class CpuOps : public Ops {
 public:
  Device device() const override { return Device::cpu; }
  DType activation_dtype() const override { return DType::f32; }

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
  void attention_context_forward(Tensor out, Tensor lse, Tensor qkv, Tensor whole, const ContextSpans& spans,
                                 const HeadLayout& heads) override;
  void attention_context_backward(Tensor d_qkv, Tensor d_whole, Tensor d_out, Tensor out, Tensor lse,
                                  Tensor qkv, Tensor whole, const ContextSpans& spans,
                                  const HeadLayout& heads) override;
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
  void fp8_census(Tensor counts, Tensor amax, Tensor x, Tensor q, Tensor scale_inv,
                  std::optional<Fp8Blocks> blocks) override;
  void fp8_cast_rows(Tensor out, Tensor scale_inv, Tensor x, DType format) override;
  void fp8_cast_columns(Tensor out_t, Tensor scale_inv, Tensor x, DType format) override;
  void fp8_cast_blocks(Tensor out, Tensor out_t, Tensor scale_inv, Tensor scale_inv_t, Tensor w,
                       DType format) override;
  void fp8_gemm_blocks(Tensor out, Tensor a, Tensor a_scale_inv, Fp8Blocks a_blocks, Tensor b,
                       Tensor b_scale_inv, Fp8Blocks b_blocks, bool accumulate) override;
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
  double sum(Tensor x) override;
  void copy_to_host(void* out, Tensor x) override;
  void copy_from_host(Tensor x, const void* in) override;
};

}  // namespace loom
