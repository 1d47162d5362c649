#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
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

void expect_same_architecture(const ModelConfig& a, const ModelConfig& b) {
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
  ModelConfig c = model_config_from_json(json::parse(kHubQwen3_06B), "config.json");
  ModelConfig builtin;
  ASSERT_TRUE(qwen3_config_builtin("Qwen3-0.6B", &builtin));
  expect_same_architecture(c, builtin);
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.q_dim(), 2048);
  EXPECT_EQ(c.kv_dim(), 1024);
  EXPECT_EQ(c.qkv_dim(), 4096);
}

TEST(Config, ReadsTheTransformers5Form) {
  ModelConfig c = model_config_from_json(transformers5_config(), "config.json");
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
  ModelConfig c = model_config_from_json(j, "config.json");
  EXPECT_EQ(c.head_dim, 1024 / 16);
  EXPECT_EQ(c.num_key_value_heads, 16);
  EXPECT_EQ(c.max_position_embeddings, 40960);
  EXPECT_FALSE(c.tie_word_embeddings);  // transformers' ModelConfig default
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_EQ(c.eos_token_id, -1);
}

TEST(Config, WrittenJsonReadsBackInBothForms) {
  for (const std::string& name : qwen3_builtin_names()) {
    SCOPED_TRACE(name);
    ModelConfig c;
    ASSERT_TRUE(qwen3_config_builtin(name, &c));
    c.rope_theta = 2.5e5;
    json j = model_config_to_json(c);
    EXPECT_EQ(j.at("model_type"), c.model_type);
    expect_same_architecture(model_config_from_json(j, "config.json"), c);
    json as4 = j;
    as4.erase("rope_parameters");
    as4.erase("dtype");
    expect_same_architecture(model_config_from_json(as4, "config.json"), c);
    json as5 = j;
    as5.erase("rope_theta");
    as5.erase("torch_dtype");
    expect_same_architecture(model_config_from_json(as5, "config.json"), c);
  }
}

// meta-llama/Llama-3.2-1B's config.json as the Hub serves it (transformers 4.45).
const char* kHubLlama32_1B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
  "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "rope_theta": 500000.0,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0",
  "use_cache": true, "vocab_size": 128256
})";

// Qwen/Qwen2.5-0.5B's (transformers 4.40): no head_dim, an inactive sliding window.
const char* kHubQwen25_05B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
  "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
  "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": true, "use_mrope": false,
  "use_sliding_window": false, "vocab_size": 151936
})";

// mistralai/Mistral-7B-v0.3's (transformers 4.42).
const char* kHubMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.0.dev0", "use_cache": true, "vocab_size": 32768
})";

TEST(Config, ReadsEachFamilysBlockVariant) {
  ModelConfig llama = model_config_from_json(json::parse(kHubLlama32_1B), "config.json");
  EXPECT_EQ(llama.model_type, "llama");
  EXPECT_FALSE(llama.qk_norm);
  EXPECT_FALSE(llama.qkv_bias);
  EXPECT_EQ(llama.head_dim, 64);
  EXPECT_EQ(llama.rms_norm_eps, 1e-5);
  EXPECT_TRUE(llama.tie_word_embeddings);
  EXPECT_TRUE(llama.rope_llama3);
  EXPECT_EQ(llama.rope_theta, 5e5);
  EXPECT_EQ(llama.rope_factor, 32.0);
  EXPECT_EQ(llama.rope_low_freq_factor, 1.0);
  EXPECT_EQ(llama.rope_high_freq_factor, 4.0);
  EXPECT_EQ(llama.rope_original_max_position, 8192);
  // 1.24B parameters, as the model card says: 16 · (qkv + o + mlp + norms) + embedding + final norm.
  EXPECT_EQ(llama.total_params(), 1235814400);

  ModelConfig qwen2 = model_config_from_json(json::parse(kHubQwen25_05B), "config.json");
  EXPECT_EQ(qwen2.model_type, "qwen2");
  EXPECT_FALSE(qwen2.qk_norm);
  EXPECT_TRUE(qwen2.qkv_bias);
  EXPECT_EQ(qwen2.head_dim, 64);  // hidden / heads
  EXPECT_FALSE(qwen2.rope_llama3);
  EXPECT_EQ(qwen2.total_params(), 494032768);  // Qwen2.5-0.5B's 0.49B

  ModelConfig mistral = model_config_from_json(json::parse(kHubMistral7B), "config.json");
  EXPECT_EQ(mistral.model_type, "mistral");
  EXPECT_FALSE(mistral.qk_norm);
  EXPECT_FALSE(mistral.qkv_bias);
  EXPECT_EQ(mistral.head_dim, 128);
  EXPECT_EQ(mistral.total_params(), 7248023552);  // Mistral-7B-v0.3's 7.25B
}

TEST(Config, EachFamilyWrittenReadsBackInBothForms) {
  for (const char* text : {kHubLlama32_1B, kHubQwen25_05B, kHubMistral7B}) {
    const ModelConfig c = model_config_from_json(json::parse(text), "config.json");
    SCOPED_TRACE(c.model_type);
    const json j = model_config_to_json(c);
    EXPECT_EQ(j.at("model_type"), c.model_type);
    EXPECT_EQ(j.at("architectures").at(0), c.architecture());
    json as4 = j;
    as4.erase("rope_parameters");
    json as5 = j;
    as5.erase("rope_theta");
    as5.erase("rope_scaling");
    for (const json& form : {j, as4, as5}) {
      const ModelConfig back = model_config_from_json(form, "config.json");
      expect_same_architecture(back, c);
      EXPECT_EQ(back.model_type, c.model_type);
      EXPECT_EQ(back.qk_norm, c.qk_norm);
      EXPECT_EQ(back.qkv_bias, c.qkv_bias);
      EXPECT_EQ(back.rope_llama3, c.rope_llama3);
      EXPECT_EQ(back.rope_factor, c.rope_factor);
      EXPECT_EQ(back.rope_low_freq_factor, c.rope_low_freq_factor);
      EXPECT_EQ(back.rope_high_freq_factor, c.rope_high_freq_factor);
      EXPECT_EQ(back.rope_original_max_position, c.rope_original_max_position);
    }
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
      {"Qwen3-0.6B", 595'984'384, 596'049'920},
      {"Qwen3-1.7B", 1'720'451'072, 1'720'574'976},
      {"Qwen3-4B", 4'022'272'000, 4'022'468'096},
      {"Qwen3-8B", 7'568'097'280, 8'190'735'360},
      {"Qwen3-14B", 13'989'969'920, 14'768'307'200},
      {"Qwen3-32B", 31'983'534'080, 32'762'123'264},
      // The other families' model cards: 0.49B, 1.54B, 3.09B, 7.61B, 14.7B, 32.8B, 72.7B;
      // 1.24B, 3.21B, 8.03B, 70.6B; 7.25B.
      {"Qwen2.5-0.5B", 493'961'216, 494'032'768},
      {"Qwen2.5-1.5B", 1'543'569'408, 1'543'714'304},
      {"Qwen2.5-3B", 3'085'697'024, 3'085'938'688},
      {"Qwen2.5-7B", 7'070'285'824, 7'615'616'512},
      {"Qwen2.5-14B", 13'990'625'280, 14'770'033'664},
      {"Qwen2.5-32B", 31'984'189'440, 32'763'876'352},
      {"Qwen2.5-72B", 71'458'357'248, 72'706'203'648},
      {"Llama-3.2-1B", 1'235'746'816, 1'235'814'400},
      {"Llama-3.2-3B", 3'212'574'720, 3'212'749'824},
      {"Llama-3.1-8B", 7'504'658'432, 8'030'261'248},
      {"Llama-3.1-70B", 69'501'714'432, 70'553'706'496},
      {"Mistral-7B-v0.3", 7'113'539'584, 7'248'023'552},
  };
  // The mixtures of experts are counted in test_experts.cpp; every other built-in is here.
  size_t dense_builtins = 0;
  for (const std::string& name : qwen3_builtin_names()) {
    ModelConfig c;
    ASSERT_TRUE(qwen3_config_builtin(name, &c)) << name;
    dense_builtins += c.num_experts == 0;
  }
  ASSERT_EQ(dense_builtins, std::size(expected));
  for (const Expected& e : expected) {
    ModelConfig c;
    ASSERT_TRUE(qwen3_config_builtin(e.name, &c)) << e.name;
    EXPECT_EQ(c.matmul_params(), e.matmul) << e.name;
    EXPECT_EQ(c.total_params(), e.total) << e.name;
    ModelConfig with_org;
    ASSERT_TRUE(qwen3_config_builtin(std::string("Qwen/") + e.name, &with_org));
    EXPECT_EQ(with_org.hidden_size, c.hidden_size);
  }
  ModelConfig llama, builtin_1b;
  ASSERT_TRUE(qwen3_config_builtin("meta-llama/Llama-3.1-8B", &llama));
  EXPECT_EQ(llama.model_type, "llama");
  EXPECT_TRUE(llama.rope_llama3);
  EXPECT_EQ(llama.rope_factor, 8.0);
  // The built-in 1B equals the Hub's config.json.
  ASSERT_TRUE(qwen3_config_builtin("Llama-3.2-1B", &builtin_1b));
  const ModelConfig hub = model_config_from_json(json::parse(kHubLlama32_1B), "config.json");
  expect_same_architecture(builtin_1b, hub);
  EXPECT_EQ(builtin_1b.rope_factor, hub.rope_factor);
  ModelConfig unknown;
  EXPECT_FALSE(qwen3_config_builtin("Qwen3-30B-A6B", &unknown));
  EXPECT_FALSE(qwen3_config_builtin("Llama-3-8B", &unknown));
}

struct BadCase {
  const char* what;
  std::function<void(json&)> edit;
  const char* needle;  // must appear in the message, with the path
};

// Each case's edit of Qwen3-0.6B's config.json is refused with a message naming the file and
// holding the case's needle.
template <size_t N>
void expect_refused(const BadCase (&cases)[N]) {
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.what);
    json j = json::parse(kHubQwen3_06B);
    c.edit(j);
    std::string message = input_error_message([&] { model_config_from_json(j, "ckpt/config.json"); });
    EXPECT_EQ(message.rfind("ckpt/config.json: ", 0), 0u) << message;
    EXPECT_NE(message.find(c.needle), std::string::npos) << message;
  }
}

TEST(ConfigErrors, NameTheFileAndTheField) {
  const BadCase cases[] = {
      {"model_type missing", [](json& j) { j.erase("model_type"); }, "missing field 'model_type'"},
      {"model_type gemma", [](json& j) { j["model_type"] = "gemma"; }, "unsupported model_type \"gemma\""},
      {"MoE without experts", [](json& j) { j["model_type"] = "qwen3_moe"; }, "missing field 'num_experts'"},
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
       "field 'rope_scaling.rope_type' is \"yarn\""},
      {"rope_parameters yarn",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}};
       },
       "field 'rope_parameters.rope_type' is \"yarn\""},
      {"rope_scaling llama3 without factor",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"},
                              {"low_freq_factor", 1.0},
                              {"high_freq_factor", 4.0},
                              {"original_max_position_embeddings", 8192}};
       },
       "missing field 'rope_scaling.factor'"},
      {"rope_parameters llama3 without context",
       [](json& j) {
         j["rope_parameters"] = {{"rope_type", "llama3"},
                                 {"rope_theta", 5e5},
                                 {"factor", 8.0},
                                 {"low_freq_factor", 1.0},
                                 {"high_freq_factor", 4.0}};
       },
       "missing field 'rope_parameters.original_max_position_embeddings'"},
      {"mlp bias", [](json& j) { j["mlp_bias"] = true; }, "field 'mlp_bias' is true"},
      {"mistral window",
       [](json& j) {
         j["model_type"] = "mistral";
         j["sliding_window"] = 4096;
       },
       "field 'sliding_window' is 4096"},
      {"llama attention bias",
       [](json& j) {
         j["model_type"] = "llama";
         j["attention_bias"] = true;
       },
       "field 'attention_bias' is true"},
      {"qwen2 mrope",
       [](json& j) {
         j["model_type"] = "qwen2";
         j["use_mrope"] = true;
       },
       "field 'use_mrope' is true"},
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
  expect_refused(cases);
}

// Sizes that no int64 product or allocation holds are refused when config.json is read,
// naming the field (hidden_size 2^31 once reached an assertion in src/io/param_source.cpp).
TEST(ConfigErrors, RefusesSizesPastTheBounds) {
  const BadCase cases[] = {
      {"hidden_size 2^31", [](json& j) { j["hidden_size"] = int64_t{1} << 31; },
       "field 'hidden_size' is 2147483648, expected a positive integer of at most 16777216"},
      {"vocab_size 2^64 - 1", [](json& j) { j["vocab_size"] = UINT64_MAX; },
       "field 'vocab_size' is 18446744073709551615, expected a positive integer"},
      {"layers 2^24 + 1", [](json& j) { j["num_hidden_layers"] = (1 << 24) + 1; },
       "field 'num_hidden_layers' is 16777217"},
      {"positions 2^40", [](json& j) { j["max_position_embeddings"] = int64_t{1} << 40; },
       "field 'max_position_embeddings' is 1099511627776"},
      {"parameters past 2^40", [](json& j) { j["hidden_size"] = 1 << 24; },
       "'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads', "
       "'num_key_value_heads', 'head_dim' give about 1.23e+13 parameters, expected at most 2^40"},
      {"head_dim 0",
       [](json& j) {
         j.erase("head_dim");
         j["num_attention_heads"] = 2048;
       },
       "hidden_size (1024) / num_attention_heads (2048) is 0"},
  };
  expect_refused(cases);
}

// RoPE's base and llama3 factors the float frequencies of ops/rope.h cannot take (a factor
// of 1e-300 once gave NaN at step 1) are refused, naming the field.
TEST(ConfigErrors, RefusesRopeValuesThatGiveNonFiniteAngles) {
  const auto llama3 = [](const char* key, double value) {
    return [key, value](json& j) {
      j["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 8192}};
      j["rope_scaling"][key] = value;
    };
  };
  constexpr double inf = std::numeric_limits<double>::infinity(),
                   nan = std::numeric_limits<double>::quiet_NaN();
  const BadCase cases[] = {
      {"factor 1e-300", llama3("factor", 1e-300),
       "field 'rope_scaling.factor' is 1e-300, expected a scaling factor of at least 1"},
      {"factor 0.5", llama3("factor", 0.5), "field 'rope_scaling.factor' is 0.5, expected a scaling factor"},
      {"factor 0", llama3("factor", 0),
       "field 'rope_scaling.factor' is 0.0, expected a finite positive number"},
      {"factor -8", llama3("factor", -8), "field 'rope_scaling.factor' is -8.0, expected a finite positive"},
      {"factor inf", llama3("factor", inf), "field 'rope_scaling.factor' is inf, expected a finite positive"},
      {"factor NaN", llama3("factor", nan), "field 'rope_scaling.factor' is NaN, expected a finite positive"},
      {"factor 1e300", llama3("factor", 1e300), "field 'rope_scaling.factor' is 1e+300, expected"},
      {"low 1e-300", llama3("low_freq_factor", 1e-300),
       "field 'rope_scaling.low_freq_factor' is 1e-300, expected a positive number that a float holds"},
      {"high a float's low", llama3("high_freq_factor", 1.00000001),
       "field 'rope_scaling.high_freq_factor' must be greater than low_freq_factor"},
      {"theta 1e-300", [](json& j) { j["rope_theta"] = 1e-300; },
       "field 'rope_theta' is 1e-300, expected a RoPE base above 1"},
      {"theta inf", [=](json& j) { j["rope_theta"] = inf; }, "field 'rope_theta' is inf, expected a finite"},
      {"theta 1", [](json& j) { j["rope_theta"] = 1; },
       "field 'rope_theta' is 1.0, expected a RoPE base above 1"},
      {"eps NaN", [=](json& j) { j["rms_norm_eps"] = nan; },
       "field 'rms_norm_eps' is NaN, expected a finite"},
  };
  expect_refused(cases);
}

TEST(ConfigErrors, LoadNamesTheFile) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("loom_test_model_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  std::string message = input_error_message([&] { model_config_load(path); });
  EXPECT_NE(message.find(path + ": cannot open"), std::string::npos) << message;
  std::ofstream(path) << "{\"model_type\": \"qwen3\",";
  message = input_error_message([&] { model_config_load(path); });
  EXPECT_NE(message.find(path + ": not valid JSON"), std::string::npos) << message;
  // A key written twice was once read as its last value.
  std::ofstream(path) << "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"hidden_size\": 128}";
  message = input_error_message([&] { model_config_load(path); });
  EXPECT_NE(message.find(path + ": found the key 'hidden_size' a second time, expected each key once"),
            std::string::npos)
      << message;
  std::ofstream(path) << kHubQwen3_06B;
  EXPECT_EQ(model_config_load(path).hidden_size, 1024);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace loom
