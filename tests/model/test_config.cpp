#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/error.h"
#include "model/config.h"

namespace loom {
namespace {

using nlohmann::json;

// Qwen/Qwen3-0.6B's config.json as the Hub serves it (transformers 4.51).
const char* kHubQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";

// The same architecture as transformers 5.x writes it: RoPE in rope_parameters, `dtype`.
json transformers5_config() {
  json j = json::parse(kHubQwen3_06B);
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j.erase("torch_dtype");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 5e6}};
  j["dtype"] = "float32";
  j["transformers_version"] = "5.0.0";
  return j;
}

void expect_same_architecture(const Qwen3Config& a, const Qwen3Config& b) {
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
}

// The message of the InputError `f` throws; fails the test when it throws none.
std::string input_error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

TEST(Config, ReadsTheTransformers4Form) {
  Qwen3Config c = qwen3_config_from_json(json::parse(kHubQwen3_06B), "config.json");
  Qwen3Config builtin;
  ASSERT_TRUE(qwen3_config_builtin("Qwen3-0.6B", &builtin));
  expect_same_architecture(c, builtin);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.qkv_dim(), 4096);
}

TEST(Config, ReadsTheTransformers5Form) {
  Qwen3Config c = qwen3_config_from_json(transformers5_config(), "config.json");
  EXPECT_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.dtype, "float32");
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_TRUE(c.tie_word_embeddings);
}

TEST(Config, DefaultsOfOptionalFields) {
  json j = json::parse(kHubQwen3_06B);
  for (const char* key : {"head_dim", "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings",
                          "torch_dtype", "bos_token_id", "eos_token_id"})
    j.erase(key);
  Qwen3Config c = qwen3_config_from_json(j, "config.json");
  EXPECT_EQ(c.head_dim, 1024 / 16);
  EXPECT_EQ(c.num_key_value_heads, 16);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_FALSE(c.tie_word_embeddings);  // transformers' Qwen3Config default
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_id, -1);
}

TEST(Config, WrittenJsonReadsBackInBothForms) {
  for (const std::string& name : qwen3_builtin_names()) {
    SCOPED_TRACE(name);
    Qwen3Config c;
    ASSERT_TRUE(qwen3_config_builtin(name, &c));
    c.rope_theta = 2.5e5;
    json j = qwen3_config_to_json(c);
    EXPECT_EQ(j.at("model_type"), "qwen3");
    expect_same_architecture(qwen3_config_from_json(j, "config.json"), c);
    json as4 = j;
    as4.erase("rope_parameters");
    as4.erase("dtype");
    expect_same_architecture(qwen3_config_from_json(as4, "config.json"), c);
    json as5 = j;
    as5.erase("rope_theta");
    as5.erase("torch_dtype");
    expect_same_architecture(qwen3_config_from_json(as5, "config.json"), c);
  }
}

TEST(Config, BuiltinSizesAndTheirParameterCounts) {
  // matmul_params: every matmul weight, lm_head counted even when tied (the N of MFU).
  // total_params: every stored tensor once; these match the Hub's model cards (0.6B, 1.7B,
  // 4.0B, 8.2B, 14.8B, 32.8B).
  struct Expected {
    const char* name;
    int64_t matmul, total;
  };
  const Expected expected[] = {
      {"Qwen3-0.6B", 595'984'384, 596'049'920},      {"Qwen3-1.7B", 1'720'451'072, 1'720'574'976},
      {"Qwen3-4B", 4'022'272'000, 4'022'468'096},    {"Qwen3-8B", 7'568'097'280, 8'190'735'360},
      {"Qwen3-14B", 13'989'969'920, 14'768'307'200}, {"Qwen3-32B", 31'983'534'080, 32'762'123'264},
  };
  ASSERT_EQ(qwen3_builtin_names().size(), std::size(expected));
  for (const Expected& e : expected) {
    Qwen3Config c;
    ASSERT_TRUE(qwen3_config_builtin(e.name, &c)) << e.name;
    EXPECT_EQ(c.matmul_params(), e.matmul) << e.name;
    EXPECT_EQ(c.total_params(), e.total) << e.name;
    Qwen3Config with_org;
    ASSERT_TRUE(qwen3_config_builtin(std::string("Qwen/") + e.name, &with_org));
    EXPECT_EQ(with_org.hidden_size, c.hidden_size);
  }
  Qwen3Config unknown;
  EXPECT_FALSE(qwen3_config_builtin("Qwen3-30B-A3B", &unknown));
  EXPECT_FALSE(qwen3_config_builtin("Llama-3-8B", &unknown));
}

struct BadCase {
  const char* what;
  std::function<void(json&)> edit;
  const char* needle;  // must appear in the message, with the path
};

TEST(ConfigErrors, NameTheFileAndTheField) {
  const BadCase cases[] = {
      {"model_type missing", [](json& j) { j.erase("model_type"); }, "missing field 'model_type'"},
      {"model_type llama", [](json& j) { j["model_type"] = "llama"; }, "unsupported model_type \"llama\""},
      {"model_type MoE", [](json& j) { j["model_type"] = "qwen3_moe"; },
       "unsupported model_type \"qwen3_moe\""},
      {"vocab_size missing", [](json& j) { j.erase("vocab_size"); }, "missing field 'vocab_size'"},
      {"hidden_size string", [](json& j) { j["hidden_size"] = "1024"; },
       "field 'hidden_size' is string, expected an integer"},
      {"layers fractional", [](json& j) { j["num_hidden_layers"] = 28.5; },
       "field 'num_hidden_layers' is number, expected an integer"},
      {"heads zero", [](json& j) { j["num_attention_heads"] = 0; }, "field 'num_attention_heads' is 0"},
      {"kv heads negative", [](json& j) { j["num_key_value_heads"] = -8; },
       "field 'num_key_value_heads' is -8"},
      {"rms_norm_eps missing", [](json& j) { j.erase("rms_norm_eps"); }, "missing field 'rms_norm_eps'"},
      {"rms_norm_eps string", [](json& j) { j["rms_norm_eps"] = "1e-6"; }, "field 'rms_norm_eps' is string"},
      {"rope_theta missing", [](json& j) { j.erase("rope_theta"); }, "missing field 'rope_theta'"},
      {"rope_scaling set",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       "field 'rope_scaling' is set"},
      {"rope_parameters yarn",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}};
       },
       "rope_parameters.rope_type \"yarn\" is not supported"},
      {"rope_parameters no theta",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "default"}};
       },
       "missing field 'rope_parameters.rope_theta'"},
      {"rope_parameters list",
       [](json& j) {
         j["rope_parameters"] = {1, 2};
       },
       "field 'rope_parameters'"},
      {"tie string", [](json& j) { j["tie_word_embeddings"] = "yes"; },
       "field 'tie_word_embeddings' is string, expected true or false"},
      {"attention bias", [](json& j) { j["attention_bias"] = true; }, "field 'attention_bias' is true"},
      {"sliding window", [](json& j) { j["use_sliding_window"] = true; },
       "field 'use_sliding_window' is true"},
      {"gelu", [](json& j) { j["hidden_act"] = "gelu"; },
       "field 'hidden_act' is \"gelu\", expected \"silu\""},
      {"heads not multiple of kv", [](json& j) { j["num_key_value_heads"] = 5; },
       "num_attention_heads (16) must be a multiple of num_key_value_heads (5)"},
      {"odd head_dim", [](json& j) { j["head_dim"] = 127; }, "head_dim must be even"},
      {"not an object",
       [](json& j) {
         j = json::array({1, 2});
       },
       "expected a JSON object"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    json j = json::parse(kHubQwen3_06B);
    c.edit(j);
    std::string message = input_error_message([&] { qwen3_config_from_json(j, "ckpt/config.json"); });
    EXPECT_EQ(message.rfind("ckpt/config.json: ", 0), 0u) << message;
    EXPECT_NE(message.find(c.needle), std::string::npos) << message;
  }
}

TEST(ConfigErrors, LoadNamesTheFile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom_test_model_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::string message = input_error_message([&] { qwen3_config_load(path); });
  EXPECT_NE(message.find(path + ": cannot open"), std::string::npos) << message;
  std::ofstream(path) << "{\"model_type\": \"qwen3\",";
  message = input_error_message([&] { qwen3_config_load(path); });
  EXPECT_NE(message.find(path + ": not valid JSON"), std::string::npos) << message;
  std::ofstream(path) << kHubQwen3_06B;
  EXPECT_EQ(qwen3_config_load(path).hidden_size, 1024);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom
