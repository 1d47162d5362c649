// What one GPU holds of the model under a layout: its share of the heads, the FFN and the
// vocabulary (TP), its layers (PP), its tokens (SP, CP). Shared by the memory and time
// models so both count the same shapes; the shapes are the sharding spec's
// (model/shard_spec.h), the engines' own.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "plan/plan.h"

namespace loom {

struct GpuShard {
  int64_t tp = 1, pp = 1, cp = 1, dp = 1;
  int64_t ep = 1;     // expert-parallel ranks (of dp): this GPU holds E / ep experts a layer
  int64_t top_k = 0;  // experts a token (0: a dense model)
  bool sp = false;
  int64_t hidden = 0, head_dim = 0;
  int64_t q_heads = 0, kv_heads = 0;  // on this GPU (KV heads replicated when tp > kv heads)
  int64_t q_dim = 0, qkv_dim = 0, ffn = 0, vocab = 0;
  bool tied = false;
  bool qk_norm = true;                              // the family's q/k norms (their rstd is an activation)
  std::vector<int64_t> stage_layers;                // layers of each pipeline stage
  std::vector<std::vector<int64_t>> stage_tensors;  // sizes of each stage's parameter tensors here
  std::vector<int64_t> stage_experts;               // of which the experts' parameters
  std::vector<int64_t> stage_sparse_layers;         // each stage's sparse layers
  // LoRA (model/lora.h): the sizes of each stage's adapter tensors, then the only trained ones
  // (the stage's tensors above are the frozen base's); empty without LoRA.
  std::vector<std::vector<int64_t>> stage_adapter_tensors;

  int64_t tokens = 0;      // this GPU's tokens of the largest micro-batch (over cp)
  int64_t seq_tokens = 0;  // tokens of the sequence-sharded tensors: tokens / tp with SP
  int64_t rows = 0;        // rows of the micro-batch
  int64_t row_tokens = 0;  // tokens of one row on this GPU (row_tokens / cp)

  // Matmul weights of one layer on this GPU, and its norm weights (replicated).
  int64_t layer_matmul_params() const { return hidden * qkv_dim + q_dim * hidden + 3 * hidden * ffn; }
  int64_t layer_norm_params() const { return 2 * hidden + (qk_norm ? 2 * head_dim : 0); }
  // Every parameter of stage s on this GPU, each stored tensor once.
  int64_t stage_params(int64_t s) const;
  // The experts' parameters of stage s on this GPU (sharded over EDP, the rest over DP).
  int64_t stage_expert_params(int64_t s) const { return stage_experts[static_cast<size_t>(s)]; }
  // The tensors the optimizer trains on stage s, and their parameters: the adapters with LoRA,
  // else all of them.
  const std::vector<int64_t>& stage_trained_tensor_sizes(int64_t s) const {
    return stage_adapter_tensors.empty() ? stage_tensor_sizes(s)
                                         : stage_adapter_tensors[static_cast<size_t>(s)];
  }
  int64_t stage_trained_params(int64_t s) const;
  // Sizes of the parameter tensors of stage s (for the Adam chunk table).
  const std::vector<int64_t>& stage_tensor_sizes(int64_t s) const {
    return stage_tensors[static_cast<size_t>(s)];
  }
  bool first(int64_t s) const { return s == 0; }
  bool last(int64_t s) const { return s == pp - 1; }
};

// Needs a layout that recipe_rules accepts (recipe/rules.h).
GpuShard gpu_shard(const ModelConfig& model, const LayoutSpec& layout, const MicroBatchShape& micro,
                   const LoraConfig& lora = {});

}  // namespace loom
