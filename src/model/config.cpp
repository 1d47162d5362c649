#include "model/config.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace loom {
namespace {

using nlohmann::json;

const char* json_type_name(const json& value) { return value.type_name(); }

int64_t require_int(const json& j, const std::string& key, const std::string& path) {
  if (!j.contains(key)) throw_input_error(path, "missing field '" + key + "' (an integer)");
  const json& value = j.at(key);
  if (!value.is_number_integer())
    throw_input_error(path, "field '" + key + "' is " + json_type_name(value) + ", expected an integer");
  int64_t v = value.get<int64_t>();
  if (v <= 0) throw_input_error(path, "field '" + key + "' is " + std::to_string(v) + ", expected a positive integer");
  return v;
}

double require_number(const json& j, const std::string& key, const std::string& where, const std::string& path) {
  if (!j.contains(key)) throw_input_error(path, "missing field '" + where + "' (a number)");
  const json& value = j.at(key);
  if (!value.is_number())
    throw_input_error(path, "field '" + where + "' is " + json_type_name(value) + ", expected a number");
  double v = value.get<double>();
  if (!(v > 0)) throw_input_error(path, "field '" + where + "' must be positive");
  return v;
}

bool optional_bool(const json& j, const std::string& key, bool fallback, const std::string& path) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  if (!j.at(key).is_boolean())
    throw_input_error(path, "field '" + key + "' is " + json_type_name(j.at(key)) + ", expected true or false");
  return j.at(key).get<bool>();
}

int64_t optional_token_id(const json& j, const std::string& key) {
  if (j.contains(key) && j.at(key).is_number_integer()) return j.at(key).get<int64_t>();
  return -1;
}

struct BuiltinSize {
  const char* name;
  int64_t hidden, layers, heads, kv_heads, ffn;
  bool tied;
};

// From the Hub's config.json of each model (Qwen/Qwen3-*): vocab 151,936, head_dim 128,
// rope_theta 1e6, rms_norm_eps 1e-6, max_position_embeddings 40,960 for all of them.
constexpr BuiltinSize kBuiltinSizes[] = {
    {"Qwen3-0.6B", 1024, 28, 16, 8, 3072, true},   {"Qwen3-1.7B", 2048, 28, 16, 8, 6144, true},
    {"Qwen3-4B", 2560, 36, 32, 8, 9728, true},     {"Qwen3-8B", 4096, 36, 32, 8, 12288, false},
    {"Qwen3-14B", 5120, 40, 40, 8, 17408, false},  {"Qwen3-32B", 5120, 64, 64, 8, 25600, false},
};

}  // namespace

int64_t Qwen3Config::matmul_params() const {
  int64_t per_layer = hidden_size * qkv_dim() + q_dim() * hidden_size + 3 * hidden_size * intermediate_size;
  return num_hidden_layers * per_layer + vocab_size * hidden_size;
}

int64_t Qwen3Config::total_params() const {
  int64_t norms_per_layer = 2 * hidden_size + 2 * head_dim;
  int64_t embedding = vocab_size * hidden_size;
  int64_t total = matmul_params() + num_hidden_layers * norms_per_layer + hidden_size + embedding;
  if (tie_word_embeddings) total -= embedding;
  return total;
}

Qwen3Config qwen3_config_from_json(const json& j, const std::string& path) {
  if (!j.is_object()) throw_input_error(path, "expected a JSON object");
  if (!j.contains("model_type")) throw_input_error(path, "missing field 'model_type' (expected \"qwen3\")");
  if (!j.at("model_type").is_string() || j.at("model_type").get<std::string>() != "qwen3")
    throw_input_error(path, "unsupported model_type " + j.at("model_type").dump() +
                                ": loom trains dense Qwen3 models (model_type \"qwen3\")");
  Qwen3Config c;
  c.vocab_size = require_int(j, "vocab_size", path);
  c.hidden_size = require_int(j, "hidden_size", path);
  c.intermediate_size = require_int(j, "intermediate_size", path);
  c.num_hidden_layers = require_int(j, "num_hidden_layers", path);
  c.num_attention_heads = require_int(j, "num_attention_heads", path);
  c.num_key_value_heads = j.contains("num_key_value_heads") ? require_int(j, "num_key_value_heads", path)
                                                            : c.num_attention_heads;
  c.head_dim = j.contains("head_dim") && !j.at("head_dim").is_null()
                   ? require_int(j, "head_dim", path)
                   : c.hidden_size / c.num_attention_heads;
  c.max_position_embeddings = j.contains("max_position_embeddings")
                                  ? require_int(j, "max_position_embeddings", path)
                                  : 40960;
  c.rms_norm_eps = require_number(j, "rms_norm_eps", "rms_norm_eps", path);
  // 4.x keeps rope_theta at the top level; 5.x nests it in rope_parameters.
  if (j.contains("rope_parameters") && !j.at("rope_parameters").is_null()) {
    const json& rope = j.at("rope_parameters");
    if (!rope.is_object()) throw_input_error(path, "field 'rope_parameters' must be an object");
    if (rope.contains("rope_type") && rope.at("rope_type") != "default")
      throw_input_error(path, "rope_parameters.rope_type " + rope.at("rope_type").dump() +
                                  " is not supported (expected \"default\")");
    c.rope_theta = require_number(rope, "rope_theta", "rope_parameters.rope_theta", path);
  } else {
    c.rope_theta = require_number(j, "rope_theta", "rope_theta", path);
    if (j.contains("rope_scaling") && !j.at("rope_scaling").is_null())
      throw_input_error(path, "field 'rope_scaling' is set: scaled RoPE is not supported");
  }
  c.tie_word_embeddings = optional_bool(j, "tie_word_embeddings", false, path);
  for (const char* key : {"dtype", "torch_dtype"}) {
    if (j.contains(key) && j.at(key).is_string()) {
      c.dtype = j.at(key).get<std::string>();
      break;
    }
  }
  if (optional_bool(j, "attention_bias", false, path))
    throw_input_error(path, "field 'attention_bias' is true: Qwen3 dense has no attention biases");
  if (optional_bool(j, "use_sliding_window", false, path))
    throw_input_error(path, "field 'use_sliding_window' is true: sliding-window attention is not supported");
  if (j.contains("hidden_act") && j.at("hidden_act") != "silu")
    throw_input_error(path, "field 'hidden_act' is " + j.at("hidden_act").dump() + ", expected \"silu\"");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw_input_error(path, "num_attention_heads (" + std::to_string(c.num_attention_heads) +
                                ") must be a multiple of num_key_value_heads (" +
                                std::to_string(c.num_key_value_heads) + ")");
  if (c.head_dim % 2 != 0) throw_input_error(path, "head_dim must be even for RoPE");
  c.bos_token_id = optional_token_id(j, "bos_token_id");
  c.eos_token_id = optional_token_id(j, "eos_token_id");
  return c;
}

Qwen3Config qwen3_config_load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_input_error(path, "cannot open config.json");
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, false);
  if (j.is_discarded()) throw_input_error(path, "not valid JSON");
  return qwen3_config_from_json(j, path);
}

json qwen3_config_to_json(const Qwen3Config& c) {
  json j = {
      {"architectures", {"Qwen3ForCausalLM"}},
      {"model_type", "qwen3"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", c.rope_theta}}},
      {"rope_theta", c.rope_theta},  // read by transformers 4.x
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"use_sliding_window", false},
      {"dtype", c.dtype},
      {"torch_dtype", c.dtype},  // read by transformers 4.x
  };
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_id >= 0) j["eos_token_id"] = c.eos_token_id;
  return j;
}

bool qwen3_config_builtin(const std::string& model_name, Qwen3Config* config) {
  std::string name = model_name;
  if (name.rfind("Qwen/", 0) == 0) name = name.substr(5);
  for (const BuiltinSize& s : kBuiltinSizes) {
    if (name != s.name) continue;
    Qwen3Config c;
    c.vocab_size = 151936;
    c.hidden_size = s.hidden;
    c.intermediate_size = s.ffn;
    c.num_hidden_layers = s.layers;
    c.num_attention_heads = s.heads;
    c.num_key_value_heads = s.kv_heads;
    c.head_dim = 128;
    c.max_position_embeddings = 40960;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.tie_word_embeddings = s.tied;
    c.bos_token_id = 151643;
    c.eos_token_id = 151645;
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
