// The parameter table: every trainable tensor of a model (config.h's families), its place in the flat
// parameter buffer, and the HF tensors it is made of.
//
// loom keeps q/k/v as one fused [q_dim + 2·kv_dim, hidden] weight and gate/up as one
// [2·ffn, hidden] weight, so each is one GEMM. The HF tensors are contiguous row ranges of
// these (q rows, then k, then v; gate rows, then up), so loading and saving are copies of
// row ranges with no conversion step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace loom {

enum class ParamKind : uint8_t {
  embedding,       // model.embed_tokens.weight [vocab, hidden]
  input_norm,      // per layer [hidden]
  qkv,             // per layer [q_dim + 2 kv_dim, hidden]
  q_norm,          // per layer [head_dim]; only with q/k norm (Qwen3)
  k_norm,          // per layer [head_dim]; only with q/k norm (Qwen3)
  qkv_bias,        // per layer [q_dim + 2 kv_dim], rows as qkv's; only with q/k/v biases (Qwen2)
  o_proj,          // per layer [hidden, q_dim]
  post_attn_norm,  // per layer [hidden]
  gate_up,         // per layer [2 ffn, hidden]
  down,            // per layer [hidden, ffn]
  // A sparse layer's mixture of experts (config.h) in place of gate_up and down: E experts
  // of FFN size F, each expert's weights one block of rows, so that an expert is a contiguous
  // [2F, hidden] or [hidden, F] slice of the grouped GEMMs' [E, ·, ·] weight.
  router,           // per sparse layer [E, hidden] (mlp.gate.weight)
  experts_gate_up,  // per sparse layer [E · 2F, hidden]: expert e's gate rows, then its up rows
  experts_down,     // per sparse layer [E · hidden, F]
  final_norm,       // model.norm.weight [hidden]
  lm_head,          // lm_head.weight [vocab, hidden]; absent when tied
  // LoRA's adapters (model/lora.h), per layer, in a table of their own: a fused layer's
  // targets' A's stacked [J·r, K], and each target's B [N_j, r].
  lora_qkv_a,
  lora_o_proj_a,
  lora_gate_up_a,
  lora_down_a,
  lora_q_b,
  lora_k_b,
  lora_v_b,
  lora_o_b,
  lora_gate_b,
  lora_up_b,
  lora_down_b,
};

struct ParamSpec {
  std::string name;  // loom's name, e.g. "layers.3.qkv"
  ParamKind kind;
  int64_t layer;  // -1 for embedding, final_norm, lm_head
  Shape shape;
  int64_t offset;  // element offset in the flat parameter buffer
  // Megatron decays every parameter except 1-D ones (the norms and biases).
  bool decay() const { return shape.ndim > 1; }
  int64_t numel() const { return shape.numel(); }
};

// One tensor of an HF checkpoint: rows [row_offset, row_offset + shape[0]) of a param.
struct HfTensorSpec {
  std::string hf_name;  // e.g. "model.layers.3.self_attn.k_proj.weight"
  int param;            // index into ParamTable::params
  int64_t row_offset;
  Shape shape;
};

struct ParamTable {
  std::vector<ParamSpec> params;
  std::vector<HfTensorSpec> hf_tensors;
  int64_t total_numel = 0;

  // Index of the param of `kind` in `layer` (-1 for the model-level ones).
  int find(ParamKind kind, int64_t layer = -1) const;
  const HfTensorSpec* find_hf(const std::string& hf_name) const;
  // The param the lm_head reads: lm_head, or the embedding when tied.
  int lm_head_param() const;
};

ParamTable param_table_build(const ModelConfig& config);

// Elements [offset, offset + numel) of a flat buffer, all of them in params[param] of a table
// (a whole tensor, or a piece of one in a rank's shard or slice).
struct TensorRange {
  int64_t offset = 0;
  int64_t numel = 0;
  int param = 0;
};

// Each tensor of the table whole, in table order.
std::vector<TensorRange> param_table_ranges(const ParamTable& table);

}  // namespace loom
