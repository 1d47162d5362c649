// Qwen3Config: the architecture of a dense Qwen3 model, read from an HF config.json.
//
// transformers writes config.json in two forms, and both are read:
//   4.x (the Hub's Qwen3 files): `rope_theta` and `torch_dtype` at the top level;
//   5.x: `rope_parameters: {rope_type: default, rope_theta: ...}` and `dtype`.
// Every dense size of the family (0.6B to 32B) is also built in, so a recipe can be planned
// or rendered from its model name alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace loom {

struct Qwen3Config {
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
  bool tie_word_embeddings = false;
  std::string dtype = "bfloat16";  // the checkpoint's storage dtype (torch_dtype / dtype)
  // Optional token ids, kept so that a written config.json round-trips them.
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
  // Weights of all matmuls including lm_head (counted even when tied), excluding norms and
  // the input embedding: the N of MFU = 6·N·tokens/s / peak (docs/numerics.md).
  int64_t matmul_params() const;
  // Every parameter, each stored tensor once (a tied lm_head is not counted twice).
  int64_t total_params() const;
};

// Parses config.json text; `path` is used in error messages. Throws InputError naming the
// field for a missing or mistyped field, or an unsupported model type or feature.
Qwen3Config qwen3_config_from_json(const nlohmann::json& json, const std::string& path);
Qwen3Config qwen3_config_load(const std::string& path);  // reads the file
// The config.json transformers 5.x writes for this config (model_type qwen3).
nlohmann::json qwen3_config_to_json(const Qwen3Config& config);

// Built-in dense sizes by Hugging Face name ("Qwen3-32B" or "Qwen/Qwen3-32B").
bool qwen3_config_builtin(const std::string& model_name, Qwen3Config* config);
std::vector<std::string> qwen3_builtin_names();

}  // namespace loom
