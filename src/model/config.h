// ModelConfig: the architecture of a dense decoder model, read from an HF config.json. The
// block is one for every family, its variants read from the config (docs/numerics.md, "Model
// families"):
//
//   model_type  q/k norm  q/k/v biases  RoPE                     tied
//   qwen3       yes       no            default                  as the config says
//   qwen2       no        yes           default                  as the config says
//   llama       no        no            default or llama3 scaled as the config says
//   mistral     no        no            default or llama3 scaled as the config says
//   qwen3_moe   yes       no            default                  as the config says
//
// qwen3_moe (Qwen3-30B-A3B, Qwen3-235B-A22B) is Qwen3 with a mixture of experts in place of the
// MLP in its sparse layers: layer l is sparse unless it is in mlp_only_layers, when
// (l + 1) % decoder_sparse_step = 0 (transformers' rule). A sparse layer routes each token to
// num_experts_per_tok of num_experts experts, each a SwiGLU MLP of moe_intermediate_size
// (docs/numerics.md, "Mixture of experts"); the dense layers keep intermediate_size.
//
// transformers writes config.json in two forms, and both are read:
//   4.x (the Hub's files): `rope_theta`, `rope_scaling` and `torch_dtype` at the top level;
//   5.x: `rope_parameters: {rope_type: default | llama3, rope_theta: ..., ...}` and `dtype`.
// The dense base sizes of each family are also built in (Qwen3 0.6B to 32B, Qwen2.5 0.5B to
// 72B, Llama 3.2 1B and 3B, Llama 3.1 8B and 70B, Mistral 7B v0.3), so a recipe can be planned
// or rendered from its model name alone.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom {

// Bounds on what a config.json may ask for, refused when it is read so that no later
// product of sizes overflows int64 or asks for an allocation no machine has: every size
// (vocab_size, hidden_size, head counts, layers, experts, positions...) at most 2^24, and
// the parameters they give at most 2^40 (1.1 trillion; Qwen3-235B-A22B has 2.35e11).
inline constexpr int64_t kMaxModelDimension = int64_t{1} << 24;
inline constexpr int64_t kMaxModelParams = int64_t{1} << 40;

struct ModelConfig {
  std::string model_type = "qwen3";  // qwen3, qwen2, llama, mistral or qwen3_moe
  bool qk_norm = true;               // RMSNorm of each q and k head before RoPE (Qwen3)
  bool qkv_bias = false;             // biases on the q, k and v projections (Qwen2)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1e6;
  // Llama 3's RoPE scaling (rope_type "llama3"), ops/rope.h; off: the default RoPE.
  bool rope_llama3 = false;
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position = 8192;
  bool tie_word_embeddings = false;
  std::string dtype = "bfloat16";  // the checkpoint's storage dtype (torch_dtype / dtype)
  // Optional token ids, kept so that a written config.json round-trips them.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;
  // Mixture of experts (qwen3_moe; num_experts 0: a dense model).
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;  // the k chosen probs divided by their sum
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // Kept so that a written config.json round-trips it; the recipe's workload.moe.aux_loss
  // turns the load-balancing loss on (off by default, as transformers trains).
  double router_aux_loss_coef = 0.001;

  bool moe() const { return num_experts > 0; }
  // Whether layer l's MLP is the mixture of experts.
  bool sparse_layer(int64_t layer) const;
  int64_t sparse_layers() const;
  // The sparse layers' numbers, ascending: entry i is the model's i-th sparse layer, the
  // index of its routing statistics (routing.h RoutingStats::expert_tokens).
  std::vector<int64_t> sparse_layer_numbers() const;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // Weights of all matmuls including lm_head (counted even when tied), excluding norms and
  // the input embedding: the N of MFU = 6·N·tokens/s / peak (docs/numerics.md). Of a mixture
  // of experts, the active ones: the router and the k experts a token reaches.
  int64_t matmul_params() const;
  // Every parameter, each stored tensor once (a tied lm_head is not counted twice).
  int64_t total_params() const;
  // The transformers class of the family, e.g. "LlamaForCausalLM".
  std::string architecture() const;
};

// Parses config.json text; `path` is used in error messages. Throws InputError naming the
// field for a missing or mistyped field, a size out of the bounds above, or an unsupported
// model type or feature (an active sliding window, biases other than Qwen2's q/k/v, a RoPE
// type other than default and llama3).
ModelConfig model_config_from_json(const nlohmann::json& json, const std::string& path);
ModelConfig model_config_load(const std::string& path);  // reads the file
// The config.json transformers 5.x writes for this config (with 4.x's names of the fields
// that moved, so that either version reads it).
nlohmann::json model_config_to_json(const ModelConfig& config);

// Built-in sizes by Hugging Face name ("Qwen3-32B" or "Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B").
bool qwen3_config_builtin(const std::string& model_name, ModelConfig* config);
std::vector<std::string> qwen3_builtin_names();

}  // namespace loom
