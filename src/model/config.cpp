#include "model/config.h"

#include <cmath>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "core/json_strict.h"

namespace loom {
namespace {

using nlohmann::json;

const char* json_type_name(const json& value) {
  return value.type_name();
}

// A number as the message shows it: JSON writes inf and NaN as null.
std::string number_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return json(v).dump();
}

int64_t require_int(const json& j, const std::string& key, const std::string& path) {
  if (!j.contains(key)) throw_input_error(path, "missing field '" + key + "' (an integer)");
  const json& value = j.at(key);
  if (!value.is_number_integer())
    throw_input_error(path, "field '" + key + "' is " + json_type_name(value) + ", expected an integer");
  // A positive integer parses as unsigned: it is compared so, as written, never wrapped.
  const bool positive = value.is_number_unsigned() ? value.get<uint64_t>() > 0 : value.get<int64_t>() > 0;
  if (!positive || value.get<uint64_t>() > static_cast<uint64_t>(kMaxModelDimension))
    throw_input_error(path, "field '" + key + "' is " + value.dump() +
                                ", expected a positive integer of at most " +
                                std::to_string(kMaxModelDimension) + " (2^24)");
  return value.get<int64_t>();
}

double require_number(const json& j, const std::string& key, const std::string& where,
                      const std::string& path) {
  if (!j.contains(key)) throw_input_error(path, "missing field '" + where + "' (a number)");
  const json& value = j.at(key);
  if (!value.is_number())
    throw_input_error(path, "field '" + where + "' is " + json_type_name(value) + ", expected a number");
  double v = value.get<double>();
  if (!(v > 0 && std::isfinite(v)))
    throw_input_error(path,
                      "field '" + where + "' is " + number_text(v) + ", expected a finite positive number");
  return v;
}

bool optional_bool(const json& j, const std::string& key, bool fallback, const std::string& path) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_boolean())
    throw_input_error(path,
                      "field '" + key + "' is " + json_type_name(j.at(key)) + ", expected true or false");
  return j.at(key).get<bool>();
}

int64_t optional_token_id(const json& j, const std::string& key) {
  if (j.contains(key) && j.at(key).is_number_integer()) return j.at(key).get<int64_t>();
  return -1;
}

// What the built-in sizes of a family share, from the Hub's config.json of each model.
struct BuiltinFamily {
  const char* model_type;
  double rope_theta, rms_norm_eps;
  int64_t max_position_embeddings, bos_token_id, eos_token_id;
  double llama3_factor;  // 0: the default RoPE
};

constexpr BuiltinFamily kQwen3{"qwen3", 1e6, 1e-6, 40960, 151643, 151645, 0};
constexpr BuiltinFamily kQwen3Moe{"qwen3_moe", 1e6, 1e-6, 40960, 151643, 151645, 0};
constexpr BuiltinFamily kQwen25{"qwen2", 1e6, 1e-6, 32768, 151643, 151643, 0};
constexpr BuiltinFamily kQwen25Long{"qwen2", 1e6, 1e-6, 131072, 151643, 151643, 0};  // 7B and up
// Llama 3.1 and 3.2: llama3 scaling with low 1, high 4, an original context of 8,192.
constexpr BuiltinFamily kLlama31{"llama", 5e5, 1e-5, 131072, 128000, 128001, 8};
constexpr BuiltinFamily kLlama32{"llama", 5e5, 1e-5, 131072, 128000, 128001, 32};
constexpr BuiltinFamily kMistral{"mistral", 1e6, 1e-5, 32768, 1, 2, 0};

struct BuiltinSize {
  const char* name;
  const BuiltinFamily* family;
  int64_t vocab, hidden, layers, heads, kv_heads, head_dim, ffn;
  bool tied;
  int64_t experts = 0, experts_per_token = 0, expert_ffn = 0;  // qwen3_moe (norm_topk_prob true)
};

// The base models (the Instruct ones share their shapes); total_params() of each matches its
// model card (tests/model/test_config.cpp).
constexpr BuiltinSize kBuiltinSizes[] = {
    {"Qwen3-0.6B", &kQwen3, 151936, 1024, 28, 16, 8, 128, 3072, true},
    {"Qwen3-1.7B", &kQwen3, 151936, 2048, 28, 16, 8, 128, 6144, true},
    {"Qwen3-4B", &kQwen3, 151936, 2560, 36, 32, 8, 128, 9728, true},
    {"Qwen3-8B", &kQwen3, 151936, 4096, 36, 32, 8, 128, 12288, false},
    {"Qwen3-14B", &kQwen3, 151936, 5120, 40, 40, 8, 128, 17408, false},
    {"Qwen3-32B", &kQwen3, 151936, 5120, 64, 64, 8, 128, 25600, false},
    {"Qwen3-30B-A3B", &kQwen3Moe, 151936, 2048, 48, 32, 4, 128, 6144, false, 128, 8, 768},
    {"Qwen3-235B-A22B", &kQwen3Moe, 151936, 4096, 94, 64, 4, 128, 12288, false, 128, 8, 1536},
    {"Qwen2.5-0.5B", &kQwen25, 151936, 896, 24, 14, 2, 64, 4864, true},
    {"Qwen2.5-1.5B", &kQwen25, 151936, 1536, 28, 12, 2, 128, 8960, true},
    {"Qwen2.5-3B", &kQwen25, 151936, 2048, 36, 16, 2, 128, 11008, true},
    {"Qwen2.5-7B", &kQwen25Long, 152064, 3584, 28, 28, 4, 128, 18944, false},
    {"Qwen2.5-14B", &kQwen25Long, 152064, 5120, 48, 40, 8, 128, 13824, false},
    {"Qwen2.5-32B", &kQwen25Long, 152064, 5120, 64, 40, 8, 128, 27648, false},
    {"Qwen2.5-72B", &kQwen25Long, 152064, 8192, 80, 64, 8, 128, 29568, false},
    {"Llama-3.2-1B", &kLlama32, 128256, 2048, 16, 32, 8, 64, 8192, true},
    {"Llama-3.2-3B", &kLlama32, 128256, 3072, 28, 24, 8, 128, 8192, true},
    {"Llama-3.1-8B", &kLlama31, 128256, 4096, 32, 32, 8, 128, 14336, false},
    {"Llama-3.1-70B", &kLlama31, 128256, 8192, 80, 64, 8, 128, 28672, false},
    {"Mistral-7B-v0.3", &kMistral, 32768, 4096, 32, 32, 8, 128, 14336, false},
};

}  // namespace

bool ModelConfig::sparse_layer(int64_t layer) const {
  if (!moe()) return false;
  for (int64_t dense : mlp_only_layers)
    if (dense == layer) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t ModelConfig::sparse_layers() const {
  return static_cast<int64_t>(sparse_layer_numbers().size());
}

std::vector<int64_t> ModelConfig::sparse_layer_numbers() const {
  std::vector<int64_t> layers;
  for (int64_t l = 0; l < num_hidden_layers; ++l)
    if (sparse_layer(l)) layers.push_back(l);
  return layers;
}

int64_t ModelConfig::matmul_params() const {
  const int64_t attention = hidden_size * qkv_dim() + q_dim() * hidden_size;
  const int64_t dense_mlp = 3 * hidden_size * intermediate_size;
  const int64_t active_experts =
      num_experts * hidden_size + num_experts_per_tok * 3 * hidden_size * moe_intermediate_size;
  const int64_t sparse = sparse_layers();
  return num_hidden_layers * attention + (num_hidden_layers - sparse) * dense_mlp + sparse * active_experts +
         vocab_size * hidden_size;
}

int64_t ModelConfig::total_params() const {
  int64_t norms_per_layer = 2 * hidden_size + (qk_norm ? 2 * head_dim : 0) + (qkv_bias ? qkv_dim() : 0);
  int64_t embedding = vocab_size * hidden_size;
  // Every expert, not only the active ones matmul_params counts.
  const int64_t idle_experts =
      sparse_layers() * (num_experts - num_experts_per_tok) * 3 * hidden_size * moe_intermediate_size;
  int64_t total =
      matmul_params() + idle_experts + num_hidden_layers * norms_per_layer + hidden_size + embedding;
  if (tie_word_embeddings) total -= embedding;
  return total;
}

std::string ModelConfig::architecture() const {
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "llama") return "LlamaForCausalLM";
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen3_moe") return "Qwen3MoeForCausalLM";
  return "Qwen3ForCausalLM";
}

namespace {

// The RoPE fields: 5.x's rope_parameters {rope_type, rope_theta, ...}, or 4.x's top-level
// rope_theta with rope_scaling {rope_type (or "type"), factor, ...} when scaled.
void read_rope(const json& j, const std::string& path, ModelConfig* c) {
  const bool v5 = j.contains("rope_parameters") && !j.at("rope_parameters").is_null();
  const char* section = v5 ? "rope_parameters" : "rope_scaling";
  const json none = json::object();
  const json& rope =
      v5 ? j.at(section) : (j.contains(section) && !j.at(section).is_null() ? j.at(section) : none);
  if (!rope.is_object()) throw_input_error(path, std::string("field '") + section + "' must be an object");
  const std::string prefix = std::string(section) + ".";
  const std::string theta_field = v5 ? prefix + "rope_theta" : "rope_theta";
  c->rope_theta = require_number(v5 ? rope : j, "rope_theta", theta_field, path);
  // ops/rope.h computes the frequencies in float: a value a float rounds to 0 or inf, a base
  // of 1 or less, or a scaling factor below 1 gives inf or NaN angles at the first step.
  constexpr double kFloatMax = std::numeric_limits<float>::max(),
                   kFloatMin = std::numeric_limits<float>::min();
  const auto refuse = [&](const std::string& field, double value, const std::string& expected) {
    throw_input_error(path, "field '" + field + "' is " + number_text(value) + ", expected " + expected);
  };
  if (!(c->rope_theta > 1 && c->rope_theta <= kFloatMax))
    refuse(theta_field, c->rope_theta, "a RoPE base above 1 that a float holds");
  std::string type_key = rope.contains("rope_type") ? "rope_type" : "type";
  std::string type = "default";
  if (rope.contains(type_key)) {
    if (!rope.at(type_key).is_string())
      throw_input_error(path, "field '" + prefix + type_key + "' must be a string");
    type = rope.at(type_key).get<std::string>();
  } else if (!v5 && !rope.empty()) {
    throw_input_error(path, "field 'rope_scaling' has no rope_type");
  }
  if (type == "default") return;
  if (type != "llama3")
    throw_input_error(path, "field '" + prefix + type_key + "' is \"" + type +
                                "\": loom implements RoPE types \"default\" and \"llama3\"");
  c->rope_llama3 = true;
  c->rope_factor = require_number(rope, "factor", prefix + "factor", path);
  c->rope_low_freq_factor = require_number(rope, "low_freq_factor", prefix + "low_freq_factor", path);
  c->rope_high_freq_factor = require_number(rope, "high_freq_factor", prefix + "high_freq_factor", path);
  if (!(c->rope_factor >= 1 && c->rope_factor <= kFloatMax))
    refuse(prefix + "factor", c->rope_factor,
           "a scaling factor of at least 1 (transformers' rule) that a float holds");
  for (const auto& [key, value] : {std::pair{"low_freq_factor", c->rope_low_freq_factor},
                                   std::pair{"high_freq_factor", c->rope_high_freq_factor}})
    if (!(value >= kFloatMin && value <= kFloatMax))
      refuse(prefix + key, value, "a positive number that a float holds");
  // Compared as floats: two values a float rounds to one would divide by zero.
  if (!(static_cast<float>(c->rope_high_freq_factor) > static_cast<float>(c->rope_low_freq_factor)))
    throw_input_error(path, "field '" + prefix + "high_freq_factor' must be greater than low_freq_factor");
  if (!rope.contains("original_max_position_embeddings"))
    throw_input_error(path, "missing field '" + prefix + "original_max_position_embeddings' (an integer)");
  c->rope_original_max_position = require_int(rope, "original_max_position_embeddings", path);
}

// qwen3_moe's expert fields. transformers 5.x writes the expert count as num_local_experts,
// 4.x as num_experts: either is read.
void read_experts(const json& j, const std::string& path, ModelConfig* c) {
  const bool local = j.contains("num_local_experts") && !j.at("num_local_experts").is_null();
  c->num_experts = require_int(j, local ? "num_local_experts" : "num_experts", path);
  c->num_experts_per_tok = require_int(j, "num_experts_per_tok", path);
  c->moe_intermediate_size = require_int(j, "moe_intermediate_size", path);
  c->norm_topk_prob = optional_bool(j, "norm_topk_prob", false, path);
  c->decoder_sparse_step =
      j.contains("decoder_sparse_step") ? require_int(j, "decoder_sparse_step", path) : 1;
  if (j.contains("mlp_only_layers") && !j.at("mlp_only_layers").is_null()) {
    const json& dense = j.at("mlp_only_layers");
    if (!dense.is_array()) throw_input_error(path, "field 'mlp_only_layers' must be a list of layer numbers");
    for (size_t i = 0; i < dense.size(); ++i) {
      if (!dense[i].is_number_integer() || dense[i].get<int64_t>() < 0 ||
          dense[i].get<int64_t>() >= c->num_hidden_layers)
        throw_input_error(path, "field 'mlp_only_layers[" + std::to_string(i) + "]' is " + dense[i].dump() +
                                    ", expected a layer number below num_hidden_layers (" +
                                    std::to_string(c->num_hidden_layers) + ")");
      c->mlp_only_layers.push_back(dense[i].get<int64_t>());
    }
  }
  if (j.contains("router_aux_loss_coef") && j.at("router_aux_loss_coef").is_number())
    c->router_aux_loss_coef = j.at("router_aux_loss_coef").get<double>();
  if (c->num_experts_per_tok > c->num_experts)
    throw_input_error(path, "field 'num_experts_per_tok' is " + std::to_string(c->num_experts_per_tok) +
                                ", more than the " + std::to_string(c->num_experts) + " experts");
}

// Refuses sizes whose parameters pass kMaxModelParams. The count is an upper bound of
// total_params() taken in long double, which sizes within kMaxModelDimension cannot overflow;
// once it passes, every int64 product of the sizes is exact.
void check_parameter_count(const ModelConfig& c, const std::string& path) {
  const auto ld = [](int64_t v) { return static_cast<long double>(v); };
  const long double q = ld(c.num_attention_heads) * ld(c.head_dim),
                    kv = ld(c.num_key_value_heads) * ld(c.head_dim);
  const long double mlp =
      3 * ld(c.hidden_size) * (ld(c.intermediate_size) + ld(c.num_experts) * ld(c.moe_intermediate_size));
  const long double layer =
      ld(c.hidden_size) * (2 * q + 2 * kv + ld(c.num_experts) + 2) + mlp + q + 2 * kv + 2 * ld(c.head_dim);
  const long double params =
      ld(c.num_hidden_layers) * layer + 2 * ld(c.vocab_size) * ld(c.hidden_size) + ld(c.hidden_size);
  if (params > ld(kMaxModelParams)) {
    std::ostringstream about;
    about << std::setprecision(3) << static_cast<double>(params);
    throw_input_error(path,
                      "fields 'vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers', "
                      "'num_attention_heads', 'num_key_value_heads', 'head_dim'" +
                          std::string(c.moe() ? ", 'num_experts', 'moe_intermediate_size'" : "") +
                          " give about " + about.str() +
                          " parameters, expected at most 2^40 = " + std::to_string(kMaxModelParams));
  }
}

}  // namespace

ModelConfig model_config_from_json(const json& j, const std::string& path) {
  if (!j.is_object()) throw_input_error(path, "expected a JSON object");
  if (!j.contains("model_type"))
    throw_input_error(path, "missing field 'model_type' (\"qwen3\", \"qwen2\", \"llama\" or \"mistral\")");
  const json& type = j.at("model_type");
  ModelConfig c;
  if (!type.is_string() ||
      (type != "qwen3" && type != "qwen2" && type != "llama" && type != "mistral" && type != "qwen3_moe"))
    throw_input_error(path, "unsupported model_type " + type.dump() +
                                ": loom trains models of model_type \"qwen3\", \"qwen2\", \"llama\", "
                                "\"mistral\" and \"qwen3_moe\"");
  c.model_type = type.get<std::string>();
  c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  c.qkv_bias = c.model_type == "qwen2";  // Qwen2's q/k/v biases are fixed in its code, not configured
  c.vocab_size = require_int(j, "vocab_size", path);
  c.hidden_size = require_int(j, "hidden_size", path);
  c.intermediate_size = require_int(j, "intermediate_size", path);
  c.num_hidden_layers = require_int(j, "num_hidden_layers", path);
  c.num_attention_heads = require_int(j, "num_attention_heads", path);
  c.num_key_value_heads =
      j.contains("num_key_value_heads") ? require_int(j, "num_key_value_heads", path) : c.num_attention_heads;
  c.head_dim = j.contains("head_dim") && !j.at("head_dim").is_null() ? require_int(j, "head_dim", path)
                                                                     : c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings =
      j.contains("max_position_embeddings") ? require_int(j, "max_position_embeddings", path) : 40960;
  c.rms_norm_eps = require_number(j, "rms_norm_eps", "rms_norm_eps", path);
  read_rope(j, path, &c);
  c.tie_word_embeddings = optional_bool(j, "tie_word_embeddings", false, path);
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (j.contains(key) && j.at(key).is_string()) {
      c.dtype = j.at(key).get<std::string>();
      break;
    }
  }
  if (c.model_type != "qwen2" && optional_bool(j, "attention_bias", false, path))
    throw_input_error(path,
                      "field 'attention_bias' is true: loom implements attention biases only as "
                      "Qwen2's q/k/v biases");
  if (optional_bool(j, "mlp_bias", false, path))
    throw_input_error(path, "field 'mlp_bias' is true: MLP biases are not supported");
  if (optional_bool(j, "use_mrope", false, path))
    throw_input_error(path, "field 'use_mrope' is true: multimodal RoPE is not supported");
  if (optional_bool(j, "use_sliding_window", false, path))
    throw_input_error(path, "field 'use_sliding_window' is true: sliding-window attention is not supported");
  // Mistral's window is active whenever it is set (no use_sliding_window switch).
  if (c.model_type == "mistral" && j.contains("sliding_window") && !j.at("sliding_window").is_null())
    throw_input_error(path, "field 'sliding_window' is " + j.at("sliding_window").dump() +
                                ": sliding-window attention is not supported (expected null)");
  if (j.contains("hidden_act") && j.at("hidden_act") != "silu")
    throw_input_error(path, "field 'hidden_act' is " + j.at("hidden_act").dump() + ", expected \"silu\"");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw_input_error(path, "num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                ") must be a multiple of num_key_value_heads (" +
                                std::to_string(c.num_key_value_heads) + ")");
  if (c.head_dim == 0)
    throw_input_error(path, "hidden_size (" + std::to_string(c.hidden_size) + ") / num_attention_heads (" +
                                std::to_string(c.num_attention_heads) +
                                ") is 0, expected a head_dim of at least 2 (or a field 'head_dim')");
  if (c.head_dim % 2 != 0) throw_input_error(path, "head_dim must be even for RoPE");
  c.bos_token_id = optional_token_id(j, "bos_token_id");
  c.eos_token_id = optional_token_id(j, "eos_token_id");
  if (c.model_type == "qwen3_moe") read_experts(j, path, &c);
  check_parameter_count(c, path);
  return c;
}

ModelConfig model_config_load(const std::string& path) {
  return model_config_from_json(json_read_file_strict(path), path);
}

json model_config_to_json(const ModelConfig& c) {
  json rope = {{"rope_type", c.rope_llama3 ? "llama3" : "default"}, {"rope_theta", c.rope_theta}};
  if (c.rope_llama3) {
    rope["factor"] = c.rope_factor;
    rope["low_freq_factor"] = c.rope_low_freq_factor;
    rope["high_freq_factor"] = c.rope_high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope_original_max_position;
  }
  json j = {
      {"architectures", {c.architecture()}},
      {"model_type", c.model_type},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_parameters", rope},
      {"rope_theta", c.rope_theta},  // read by transformers 4.x
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"attention_dropout", 0.0},
      {"dtype", c.dtype},
      {"torch_dtype", c.dtype},  // read by transformers 4.x
  };
  if (c.rope_llama3) {
    json scaling = rope;
    scaling.erase("rope_theta");
    j["rope_scaling"] = scaling;  // read by transformers 4.x
  }
  if (c.model_type == "qwen3" || c.model_type == "llama") j["attention_bias"] = false;
  if (c.model_type == "llama") j["mlp_bias"] = false;
  if (c.model_type == "qwen3" || c.model_type == "qwen2") j["use_sliding_window"] = false;
  if (c.model_type == "mistral") j["sliding_window"] = nullptr;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  if (c.moe()) {
    j["attention_bias"] = false;
    j["use_sliding_window"] = false;
    j["num_experts"] = c.num_experts;
    j["num_local_experts"] = c.num_experts;  // transformers 5.x's name
    j["num_experts_per_tok"] = c.num_experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
    j["norm_topk_prob"] = c.norm_topk_prob;
    j["decoder_sparse_step"] = c.decoder_sparse_step;
    j["mlp_only_layers"] = c.mlp_only_layers;
    j["router_aux_loss_coef"] = c.router_aux_loss_coef;
    j["output_router_logits"] = false;
  }
  return j;
}

bool qwen3_config_builtin(const std::string& model_name, ModelConfig* config) {
  // "Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B": the name after the organisation.
  const std::string name =
      model_name.substr(model_name.find('/') == std::string::npos ? 0 : model_name.rfind('/') + 1);
  for (const BuiltinSize& s : kBuiltinSizes) {
    if (name != s.name) continue;
    const BuiltinFamily& f = *s.family;
    ModelConfig c;
    c.model_type = f.model_type;
    c.qk_norm = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
    c.qkv_bias = c.model_type == "qwen2";
    c.num_experts = s.experts;
    c.num_experts_per_tok = s.experts_per_token;
    c.moe_intermediate_size = s.expert_ffn;
    c.norm_topk_prob = s.experts > 0;
    c.vocab_size = s.vocab;
    c.hidden_size = s.hidden;
    c.intermediate_size = s.ffn;
    c.num_hidden_layers = s.layers;
    c.num_attention_heads = s.heads;
    c.num_key_value_heads = s.kv_heads;
    c.head_dim = s.head_dim;
    c.max_position_embeddings = f.max_position_embeddings;
    c.rms_norm_eps = f.rms_norm_eps;
    c.rope_theta = f.rope_theta;
    if (f.llama3_factor > 0) {
      c.rope_llama3 = true;
      c.rope_factor = f.llama3_factor;
      c.rope_low_freq_factor = 1.0;
      c.rope_high_freq_factor = 4.0;
      c.rope_original_max_position = 8192;
    }
    c.tie_word_embeddings = s.tied;
    c.bos_token_id = f.bos_token_id;
    c.eos_token_id = f.eos_token_id;
    *config = c;
    return true;
  }
  return false;
}

std::vector<std::string> qwen3_builtin_names() {
  std::vector<std::string> names;
  for (const BuiltinSize& s : kBuiltinSizes) names.emplace_back(s.name);
  return names;
}

}  // namespace loom
