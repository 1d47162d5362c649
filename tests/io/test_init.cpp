#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "io/init.h"

namespace loom {
namespace {

ModelConfig small_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  return c;
}

std::vector<float> init(const ModelConfig& config, const ParamTable& table, uint64_t seed) {
  std::vector<float> p(static_cast<size_t>(table.total_numel), NAN);
  init_random_params(config, table, seed, p.data());
  return p;
}

const float* hf_data(const ParamTable& table, const std::vector<float>& params, const std::string& name) {
  const HfTensorSpec* spec = table.find_hf(name);
  EXPECT_NE(spec, nullptr) << name;
  const ParamSpec& p = table.params[static_cast<size_t>(spec->param)];
  return params.data() + p.offset + spec->row_offset * (p.numel() / p.shape[0]);
}

bool is_norm(ParamKind k) {
  return k == ParamKind::input_norm || k == ParamKind::q_norm || k == ParamKind::k_norm ||
         k == ParamKind::post_attn_norm || k == ParamKind::final_norm;
}

TEST(Init, FollowsTheDocumentedGenerator) {
  // The SplitMix64 stream seeded with 0 starts with 0xe220a8397b1dcdaf (its reference
  // output); these values come from an independent Python transcription of init.h's formula.
  EXPECT_NEAR(init_standard_normal(1234, "model.embed_tokens.weight", 0), 0.460150836907541, 1e-14);
  EXPECT_NEAR(init_standard_normal(1234, "model.embed_tokens.weight", 1), 0.966424776336163, 1e-14);
  EXPECT_NEAR(init_standard_normal(0, "model.layers.0.self_attn.k_proj.weight", 12345), -0.5058516185967815,
              1e-14);
  EXPECT_NEAR(init_standard_normal(~uint64_t{0}, "lm_head.weight", 7), -0.818470553809588, 1e-14);

  const ModelConfig config = small_config(false);
  const ParamTable table = param_table_build(config);
  const std::vector<float> p = init(config, table, 1234);
  // Every element is its own pure function of (seed, name, index): what makes the buffer
  // independent of the thread count.
  for (const HfTensorSpec& spec : table.hf_tensors) {
    if (is_norm(table.params[static_cast<size_t>(spec.param)].kind)) continue;
    const float* data = hf_data(table, p, spec.hf_name);
    for (int64_t i = 0; i < spec.shape.numel(); i += 37) {
      float want = static_cast<float>(kInitializerRange *
                                      init_standard_normal(1234, spec.hf_name, static_cast<uint64_t>(i)));
      ASSERT_EQ(data[i], want) << spec.hf_name << " element " << i;
    }
  }
}

TEST(Init, IsDeterministicAndSeedDependent) {
  const ModelConfig config = small_config(false);
  const ParamTable table = param_table_build(config);
  const std::vector<float> a = init(config, table, 7), b = init(config, table, 7), c = init(config, table, 8);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  int64_t same = 0, weights = 0;
  for (const ParamSpec& p : table.params) {
    if (is_norm(p.kind)) continue;
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) {
      ++weights;
      same += a[static_cast<size_t>(i)] == c[static_cast<size_t>(i)];
    }
  }
  EXPECT_LT(same, weights / 1000);
}

TEST(Init, WeightsAreNormalWithStd002AndNormsAreOne) {
  const ModelConfig config = small_config(false);
  const ParamTable table = param_table_build(config);
  const std::vector<float> p = init(config, table, 99);
  for (const ParamSpec& spec : table.params) {
    const float* data = p.data() + spec.offset;
    if (is_norm(spec.kind)) {
      for (int64_t i = 0; i < spec.numel(); ++i) ASSERT_EQ(data[i], 1.0f) << spec.name;
      continue;
    }
    double sum = 0, sum_sq = 0;
    int64_t beyond_4_sigma = 0;
    for (int64_t i = 0; i < spec.numel(); ++i) {
      sum += data[i];
      sum_sq += static_cast<double>(data[i]) * data[i];
      beyond_4_sigma += std::fabs(data[i]) > 4 * kInitializerRange;
    }
    const double n = static_cast<double>(spec.numel());
    const double mean = sum / n, std = std::sqrt(sum_sq / n - mean * mean);
    // Standard errors: 0.02/sqrt(n) for the mean and 0.02/sqrt(2n) for the std; n >= 4,096.
    EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(n)) << spec.name;
    EXPECT_NEAR(std, 0.02, 5 * 0.02 / std::sqrt(2 * n)) << spec.name;
    // A normal puts 6.3e-5 of its mass beyond 4 sigma; more means a wrong transform.
    EXPECT_LT(beyond_4_sigma, 1 + static_cast<int64_t>(n * 1e-3)) << spec.name;
  }
}

TEST(Init, FusedPartsAndTensorsDrawDifferentValues) {
  const ModelConfig config = small_config(false);
  const ParamTable table = param_table_build(config);
  const std::vector<float> p = init(config, table, 5);
  const float* k = hf_data(table, p, "model.layers.0.self_attn.k_proj.weight");
  const float* v = hf_data(table, p, "model.layers.0.self_attn.v_proj.weight");
  const float* k1 = hf_data(table, p, "model.layers.1.self_attn.k_proj.weight");
  const float* embed = hf_data(table, p, "model.embed_tokens.weight");
  const float* lm = hf_data(table, p, "lm_head.weight");
  EXPECT_NE(std::memcmp(k, v, 32 * 4), 0);
  EXPECT_NE(std::memcmp(k, k1, 32 * 4), 0);
  EXPECT_NE(std::memcmp(embed, lm, 32 * 4), 0);
}

TEST(Init, TiedModelHasOnlyTheEmbedding) {
  const ModelConfig tied = small_config(true), untied = small_config(false);
  const ParamTable tied_table = param_table_build(tied), untied_table = param_table_build(untied);
  const std::vector<float> a = init(tied, tied_table, 3), b = init(untied, untied_table, 3);
  for (float v : a) ASSERT_FALSE(std::isnan(v));  // every element written
  // Keyed by HF name, a tensor's values do not depend on the rest of the layout.
  const float* ea = hf_data(tied_table, a, "model.embed_tokens.weight");
  const float* eb = hf_data(untied_table, b, "model.embed_tokens.weight");
  EXPECT_EQ(std::memcmp(ea, eb, 512 * 64 * 4), 0);
}

}  // namespace
}  // namespace loom
