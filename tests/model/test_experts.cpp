// The mixture-of-experts model (qwen3_moe) on the CPU backend: its config fields, its
// parameter table's Hub names, and the whole model's gradient against central finite
// differences of its loss. (tests/golden holds the comparison with transformers.)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/param_table.h"
#include "model/routing.h"
#include "ops/cpu/cpu_ops.h"

namespace loom {
namespace {

nlohmann::json tiny_moe_json() {
  return {{"model_type", "qwen3_moe"},   {"vocab_size", 40},       {"hidden_size", 16},
          {"intermediate_size", 24},     {"num_hidden_layers", 3}, {"num_attention_heads", 2},
          {"num_key_value_heads", 1},    {"head_dim", 8},          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},       {"num_experts", 6},       {"num_experts_per_tok", 2},
          {"moe_intermediate_size", 12}, {"norm_topk_prob", true}, {"decoder_sparse_step", 1},
          {"mlp_only_layers", {1}}};
}

TEST(ExpertsConfig, ReadsTheFieldsOfBothTransformersVersions) {
  ModelConfig c = model_config_from_json(tiny_moe_json(), "config.json");
  EXPECT_TRUE(c.moe());
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.num_experts, 6);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_TRUE(c.sparse_layer(0));
  EXPECT_FALSE(c.sparse_layer(1));  // mlp_only_layers
  EXPECT_TRUE(c.sparse_layer(2));
  nlohmann::json v5 = tiny_moe_json();
  v5.erase("num_experts");
  v5["num_local_experts"] = 6;
  v5["decoder_sparse_step"] = 2;  // layers 1, 3, ... are sparse
  v5["mlp_only_layers"] = nlohmann::json::array();
  ModelConfig c5 = model_config_from_json(v5, "config.json");
  EXPECT_EQ(c5.num_experts, 6);
  EXPECT_FALSE(c5.sparse_layer(0));
  EXPECT_TRUE(c5.sparse_layer(1));
  EXPECT_FALSE(c5.sparse_layer(2));
  // The index of a sparse layer's routing statistics is its place among these.
  EXPECT_EQ(c.sparse_layer_numbers(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(c5.sparse_layer_numbers(), (std::vector<int64_t>{1}));
  EXPECT_EQ(c.sparse_layers(), 2);
  // Written and read back, in both names.
  const nlohmann::json written = model_config_to_json(c);
  EXPECT_EQ(written.at("num_local_experts"), 6);
  EXPECT_EQ(written.at("architectures")[0], "Qwen3MoeForCausalLM");
  ModelConfig again = model_config_from_json(written, "written");
  EXPECT_EQ(again.mlp_only_layers, c.mlp_only_layers);
  EXPECT_EQ(again.total_params(), c.total_params());
}

TEST(ExpertsConfig, RefusesATopKAboveTheExpertsAndADenseLayerOutsideTheModel) {
  nlohmann::json j = tiny_moe_json();
  j["num_experts_per_tok"] = 7;
  try {
    model_config_from_json(j, "m/config.json");
    FAIL() << "accepted top-k 7 of 6 experts";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("num_experts_per_tok"), std::string::npos) << e.what();
  }
  j = tiny_moe_json();
  j["mlp_only_layers"] = {5};
  try {
    model_config_from_json(j, "m/config.json");
    FAIL() << "accepted a dense layer 5 of 3";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("mlp_only_layers[0]"), std::string::npos) << e.what();
  }
}

TEST(ExpertsConfig, BuiltinSizesHaveTheModelCardsCounts) {
  // Qwen3-30B-A3B: 30.5B parameters, 3.3B active; Qwen3-235B-A22B: 235B, 22B active (model cards).
  ModelConfig small, large;
  ASSERT_TRUE(qwen3_config_builtin("Qwen/Qwen3-30B-A3B", &small));
  ASSERT_TRUE(qwen3_config_builtin("Qwen3-235B-A22B", &large));
  EXPECT_NEAR(static_cast<double>(small.total_params()) / 1e9, 30.5, 0.1);
  EXPECT_NEAR(static_cast<double>(large.total_params()) / 1e9, 235.1, 0.5);
  // Active: the matmuls a token runs through, plus the embedding (counted by the cards).
  const auto active = [](const ModelConfig& c) {
    return static_cast<double>(c.matmul_params() + c.vocab_size * c.hidden_size) / 1e9;
  };
  EXPECT_NEAR(active(small), 3.3, 0.1);
  EXPECT_NEAR(active(large), 22.0, 0.5);
}

// The load-balancing losses on a hand example: 4 experts, top-2, 3 tokens (6 pairs).
// Layer a routes (3, 1, 2, 0) pairs with probability sums (1.2, 0.5, 0.9, 0.4); layer b
// (2, 2, 1, 1) with (0.8, 0.8, 0.7, 0.7).
TEST(ExpertsAuxLoss, BothFormulasOnAHandExample) {
  const LayerRouting a{{3, 1, 2, 0}, {1.2, 0.5, 0.9, 0.4}, {}};
  const LayerRouting b{{2, 2, 1, 1}, {0.8, 0.8, 0.7, 0.7}, {}};
  // Megatron: E / (k T²) · Σ p c = 4 / 18 · (3.6 + 0.5 + 1.8) = 5.9 · 2 / 9.
  const AuxLossTerm m = megatron_aux_loss(a, 2, 3);
  EXPECT_NEAR(m.value, 5.9 * 4.0 / 18.0, 1e-15);
  EXPECT_NEAR(m.d_probs[0], 3 * 4.0 / 18.0, 1e-15);
  EXPECT_EQ(m.d_probs[3], 0.0);
  // transformers: E · Σ (Σ_l c)(Σ_l p) / (S T)² = 4 · (5·2 + 3·1.3 + 3·1.6 + 1·1.1) / 36.
  const AuxLossTerm h = hf_aux_loss({&a, &b}, 3);
  EXPECT_NEAR(h.value, 4.0 * (10.0 + 3.9 + 4.8 + 1.1) / 36.0, 1e-14);
  EXPECT_NEAR(h.d_probs[1], 4.0 * 3.0 / 36.0, 1e-15);
  // Perfect balance gives k (hf over one layer) and 1 (megatron with all probabilities 1/E).
  const LayerRouting even{{3, 3, 3, 3}, {1.5, 1.5, 1.5, 1.5}, {}};
  EXPECT_NEAR(hf_aux_loss({&even}, 6).value, 2.0, 1e-15);
  EXPECT_NEAR(megatron_aux_loss(even, 2, 6).value, 1.0, 1e-15);
}

TEST(ExpertsAuxLoss, LoadSummaryOfTokensPerExpert) {
  const ExpertLoad load = expert_load({3, 1, 2, 2});
  EXPECT_EQ(load.min, 1.0);
  EXPECT_EQ(load.max, 3.0);
  EXPECT_NEAR(load.cv, std::sqrt(0.5) / 2.0, 1e-15);
  EXPECT_EQ(expert_load({0, 0}).cv, 0.0);
}

TEST(ExpertsParamTable, EachExpertIsABlockOfRowsUnderItsHubName) {
  const ModelConfig c = model_config_from_json(tiny_moe_json(), "config.json");
  const ParamTable table = param_table_build(c);
  EXPECT_EQ(table.total_numel, c.total_params());
  EXPECT_GE(table.find(ParamKind::gate_up, 1), 0);  // the dense layer
  EXPECT_LT(table.find(ParamKind::gate_up, 0), 0);
  const HfTensorSpec* router = table.find_hf("model.layers.2.mlp.gate.weight");
  ASSERT_NE(router, nullptr);
  EXPECT_EQ(table.params[static_cast<size_t>(router->param)].kind, ParamKind::router);
  const HfTensorSpec* up = table.find_hf("model.layers.2.mlp.experts.5.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->row_offset, 5 * 2 * 12 + 12);
  EXPECT_EQ(up->shape, (Shape{12, 16}));
  const HfTensorSpec* down = table.find_hf("model.layers.0.mlp.experts.3.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->row_offset, 3 * 16);
  EXPECT_EQ(table.params[static_cast<size_t>(down->param)].shape, (Shape{6 * 16, 12}));
}

// The model's loss Σ nll over one micro-batch of two rows, and its gradient.
struct TinyMoe {
  ModelConfig config = model_config_from_json(tiny_moe_json(), "config.json");
  ParamTable table = param_table_build(config);
  std::vector<float> params;
  std::vector<int32_t> ids, targets;
  RowSpans rows{{0, 9, 20}};

  TinyMoe() {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.3f);
    params.resize(static_cast<size_t>(table.total_numel));
    for (float& p : params) p = normal(rng);
    for (const ParamSpec& p : table.params)  // norms near 1
      if (p.shape.ndim == 1)
        for (int64_t i = 0; i < p.numel(); ++i) params[static_cast<size_t>(p.offset + i)] += 1.0f;
    std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(config.vocab_size) - 1);
    for (int i = 0; i < 20; ++i) ids.push_back(token(rng));
    for (int i = 0; i < 20; ++i) targets.push_back(i == 8 || i == 19 || i == 3 ? -1 : token(rng));
  }
  MicroBatch batch() {
    MicroBatch b;
    b.ids = Tensor{ids.data(), {20}, DType::i32, Device::cpu};
    b.targets = Tensor{targets.data(), {20}, DType::i32, Device::cpu};
    b.rows = rows;
    return b;
  }
  double loss(std::vector<float>* grads) {
    CpuOps ops;
    DecoderModel model(config, table, ops);
    HostArena scratch;
    if (!grads) {
      std::vector<float> unused(params.size(), 0.0f);
      ModelTensors t{param_views(table, params.data()), param_views(table, unused.data())};
      return model.forward_backward(t, batch(), scratch, 1.0f);
    }
    grads->assign(params.size(), 0.0f);
    ModelTensors t{param_views(table, params.data()), param_views(table, grads->data())};
    return model.forward_backward(t, batch(), scratch, 1.0f);
  }
};

TEST(ExpertsModel, GradientOfEveryKindEqualsFiniteDifferencesOfTheLoss) {
  TinyMoe m;
  std::vector<float> grads;
  m.loss(&grads);
  std::mt19937 rng(11);
  for (ParamKind kind : {ParamKind::router, ParamKind::experts_gate_up, ParamKind::experts_down,
                         ParamKind::post_attn_norm, ParamKind::qkv, ParamKind::gate_up}) {
    for (int64_t layer : {0, 1, 2}) {
      const int index = m.table.find(kind, layer);
      if (index < 0) continue;
      const ParamSpec& p = m.table.params[static_cast<size_t>(index)];
      std::uniform_int_distribution<int64_t> pick(0, p.numel() - 1);
      for (int sample = 0; sample < 6; ++sample) {
        const size_t at = static_cast<size_t>(p.offset + pick(rng));
        const float saved = m.params[at], step = 1e-3f;
        m.params[at] = saved + step;
        const double up = m.loss(nullptr);
        m.params[at] = saved - step;
        const double down = m.loss(nullptr);
        m.params[at] = saved;
        const double numeric = (up - down) / (2.0 * step);
        EXPECT_NEAR(grads[at], numeric, 2e-3 + 2e-2 * std::fabs(numeric))
            << p.name << " element " << at - static_cast<size_t>(p.offset);
      }
    }
  }
}

}  // namespace
}  // namespace loom
