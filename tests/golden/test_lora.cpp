// LoRA on loom's fp32 CPU reference against transformers + PEFT (fixtures made by
// generate_lora.py in this folder: tiny_lora, tiny_lora_rslora). The base comes from the
// case's model/, the adapters from adapter_init/ (PEFT's save_pretrained) by the adapter
// table's PEFT names; the step-1 logits, loss and every adapter's gradient are held to the
// golden tolerances of test_golden.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "golden_files.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "ops/cpu/cpu_ops.h"
#include "support/compare.h"
#include "train/rows.h"
#include "train/train_step.h"

namespace loom {
namespace {

using test::read_json;
using test::tensor_values;

struct LoraGolden {
  std::string dir;
  nlohmann::json recipe;
  ModelConfig config;
  ParamTable table, adapters;
  LoraConfig lora;
  std::vector<float> params, adapter_values;
  RowSet rows;

  explicit LoraGolden(const std::string& name) : dir(std::string("golden/") + name) {
    recipe = read_json(dir + "/recipe.json");
    config = hf_checkpoint_read_config(dir + "/model");
    table = param_table_build(config);
    params.resize(static_cast<size_t>(table.total_numel));
    hf_checkpoint_load_params(dir + "/model", config, table, params.data());
    const nlohmann::json& l = recipe.at("lora");
    lora.rank = l.at("rank").get<int64_t>();
    lora.alpha = l.at("alpha").get<double>();
    lora.rslora = l.at("rslora").get<bool>();
    for (const std::string module : l.at("targets")) {
      LoraTarget target{};
      EXPECT_TRUE(lora_target_parse(module, &target)) << module;
      lora.targets[static_cast<size_t>(target)] = true;
    }
    adapters = lora_table_build(config, lora);
    adapter_values.resize(static_cast<size_t>(adapters.total_numel));
    SafetensorsFile init = SafetensorsFile::open(dir + "/adapter_init/adapter_model.safetensors");
    for (const HfTensorSpec& hf : adapters.hf_tensors) {
      std::vector<float> v = tensor_values(init, hf.hf_name);
      EXPECT_EQ(static_cast<int64_t>(v.size()), hf.shape.numel()) << hf.hf_name;
      std::copy(v.begin(), v.end(), adapter_values.begin() + offset(hf));
    }
    rows = rows_load_jsonl(dir + "/rows.jsonl", recipe.at("row_tokens").get<int64_t>(), config.vocab_size);
  }
  // Where HF tensor `hf` starts in the adapters' flat buffer.
  int64_t offset(const HfTensorSpec& hf) const {
    const ParamSpec& p = adapters.params[static_cast<size_t>(hf.param)];
    return p.offset + hf.row_offset * p.shape[1];
  }
  std::vector<int64_t> first_batch() const {
    return step_rows(rows, 1, recipe.at("global_batch").get<int64_t>());
  }
};

class LoraGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraGoldenTest, AdapterTableNamesArePeftsNames) {
  LoraGolden g(GetParam());
  SafetensorsFile init = SafetensorsFile::open(g.dir + "/adapter_init/adapter_model.safetensors");
  std::set<std::string> peft, ours;
  for (const SafetensorsEntry& e : init.entries()) peft.insert(e.name);
  for (const HfTensorSpec& hf : g.adapters.hf_tensors) ours.insert(hf.hf_name);
  EXPECT_EQ(ours, peft);
}

TEST_P(LoraGoldenTest, StepOneLogitsLossAndAdapterGradientsEqualPeft) {
  LoraGolden g(GetParam());
  SafetensorsFile expected = SafetensorsFile::open(g.dir + "/step1.safetensors");
  CpuOps ops;
  DecoderModel model(g.config, g.table, ops);
  model.set_lora(g.lora, g.adapters);
  std::vector<float> adapter_grads(g.adapter_values.size(), 0.0f);
  std::vector<float> base_grads(g.params.size(), 0.0f);
  ModelTensors tensors{param_views(g.table, g.params.data()), param_views(g.table, base_grads.data())};
  tensors.adapters = param_views(g.adapters, g.adapter_values.data());
  tensors.adapter_grads = param_views(g.adapters, adapter_grads.data());
  HostArena scratch;

  // Logits of the step's rows, every row at once.
  MicroBatchData all = micro_batch_build(g.rows, g.first_batch());
  const int64_t t = static_cast<int64_t>(all.ids.size());
  std::vector<float> ref_logits = tensor_values(expected, "logits");
  ASSERT_EQ(static_cast<int64_t>(ref_logits.size()), t * g.config.vocab_size);
  std::vector<float> logits(ref_logits.size());
  model.forward_logits(tensors, all.view(), scratch, Tensor{logits.data(), {t, g.config.vocab_size}});
  scratch.release_all();
  double max_diff = 0, max_ref = 1;
  for (size_t i = 0; i < logits.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(logits[i]) - ref_logits[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref_logits[i])));
  }
  EXPECT_LE(max_diff, 1e-5 * max_ref) << "max |logit difference| " << max_diff;

  // Loss and grads, two rows per micro-batch (the grads accumulate).
  const std::vector<int64_t> rows = g.first_batch();
  int64_t denominator = 0;
  for (int64_t r : rows) denominator += g.rows.row_denominator(r);
  StepSpec spec;
  spec.max_tokens_per_gpu = 2 * g.rows.row_tokens;
  double nll = 0;
  for (MicroBatchData& mb : step_micro_batches(g.rows, rows, spec)) {
    nll += model.forward_backward(tensors, mb.view(), scratch, 1.0f);
    scratch.release_all();
  }
  const nlohmann::json trace = read_json(g.dir + "/trace.json");
  const double ref_loss = trace.at("steps").at(0).at("loss").get<double>();
  EXPECT_NEAR(nll / static_cast<double>(denominator), ref_loss, 1e-6 * std::fabs(ref_loss));
  for (float& x : adapter_grads) x /= static_cast<float>(denominator);
  for (const HfTensorSpec& hf : g.adapters.hf_tensors) {
    std::vector<float> ref = tensor_values(expected, "grad." + hf.hf_name);
    ASSERT_EQ(static_cast<int64_t>(ref.size()), hf.shape.numel()) << hf.hf_name;
    EXPECT_LE(test::relative_l2(adapter_grads.data() + g.offset(hf), ref.data(), hf.shape.numel()), 1e-5)
        << hf.hf_name;
  }
}

// A frozen base (no main grads: no weight gradient of the base is formed, the norms', the
// embedding's and the lm_head's included) gives the adapters the same gradients, bit for bit.
TEST_P(LoraGoldenTest, FrozenBaseGivesTheSameAdapterGradients) {
  LoraGolden g(GetParam());
  CpuOps ops;
  DecoderModel model(g.config, g.table, ops);
  model.set_lora(g.lora, g.adapters);
  HostArena scratch;
  StepSpec spec;
  spec.max_tokens_per_gpu = 2 * g.rows.row_tokens;
  const auto adapter_grads = [&](bool frozen) {
    std::vector<float> grads(g.adapter_values.size(), 0.0f), base(frozen ? 0 : g.params.size(), 0.0f);
    ModelTensors tensors{param_views(g.table, g.params.data()),
                         frozen ? std::vector<Tensor>{} : param_views(g.table, base.data())};
    tensors.adapters = param_views(g.adapters, g.adapter_values.data());
    tensors.adapter_grads = param_views(g.adapters, grads.data());
    for (MicroBatchData& mb : step_micro_batches(g.rows, g.first_batch(), spec)) {
      model.forward_backward(tensors, mb.view(), scratch, 1.0f);
      scratch.release_all();
    }
    return grads;
  };
  const std::vector<float> frozen = adapter_grads(true);
  EXPECT_EQ(frozen, adapter_grads(false));
  EXPECT_TRUE(std::any_of(frozen.begin(), frozen.end(), [](float x) { return x != 0.0f; }));
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraGoldenTest, ::testing::Values("tiny_lora", "tiny_lora_rslora"));

}  // namespace
}  // namespace loom
