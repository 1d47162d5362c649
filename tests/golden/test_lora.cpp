// LoRA on loom's fp32 CPU reference against transformers + PEFT (fixtures made by
// generate_lora.py in this folder: tiny_lora, tiny_lora_rslora). The base comes from the
// case's model/, the adapters from adapter_init/ (PEFT's save_pretrained) by the adapter
// table's PEFT names; the step-1 logits, loss and every adapter's gradient are held to the
// golden tolerances of test_golden.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "golden_files.h"
#include "io/hf_checkpoint.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "ops/cpu/cpu_ops.h"
#include "recipe/recipe.h"
#include "support/compare.h"
#include "train/cuda_device.h"
#include "train/metrics.h"
#include "train/rows.h"
#include "train/train_step.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
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
  for (MicroBatchData& mb : step_micro_batches(g.rows, rows, spec, 1)) {
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
    for (MicroBatchData& mb : step_micro_batches(g.rows, g.first_batch(), spec, 1)) {
      model.forward_backward(tensors, mb.view(), scratch, 1.0f);
      scratch.release_all();
    }
    return grads;
  };
  const std::vector<float> frozen = adapter_grads(true);
  EXPECT_EQ(frozen, adapter_grads(false));
  EXPECT_TRUE(std::any_of(frozen.begin(), frozen.end(), [](float x) { return x != 0.0f; }));
}

// LoRA dropout (model/lora.h) on the case's model and adapters (B nonzero, so every adapter's
// gradient depends on its mask), over the step's micro-batches with a frozen base: Σ nll and
// the adapters' gradients of step `step` at dropout p.
struct DropoutStep {
  double nll = 0;
  std::vector<float> grads;
};
DropoutStep dropout_step(const LoraGolden& g, std::vector<float>& adapter_values, double p, int64_t step) {
  CpuOps ops;
  DecoderModel model(g.config, g.table, ops);
  model.set_lora(g.lora, g.adapters);
  HostArena scratch;
  StepSpec spec;
  spec.max_tokens_per_gpu = 2 * g.rows.row_tokens;
  spec.lora_dropout = p;
  spec.seed = 7;
  DropoutStep out;
  out.grads.assign(adapter_values.size(), 0.0f);
  std::vector<float> params = g.params;
  ModelTensors tensors{param_views(g.table, params.data()), {}};
  tensors.adapters = param_views(g.adapters, adapter_values.data());
  tensors.adapter_grads = param_views(g.adapters, out.grads.data());
  for (MicroBatchData& mb : step_micro_batches(g.rows, g.first_batch(), spec, step)) {
    out.nll += model.forward_backward(tensors, mb.view(), scratch, 1.0f);
    scratch.release_all();
  }
  return out;
}

// A mask that keeps every value (p = 1e-12: threshold 0, scale 1 in fp32) runs dropout's path
// (each adapter's own GEMM over its own copy of the input) to the shared path's loss and
// gradients, up to the order of fp32 sums.
TEST_P(LoraGoldenTest, DropoutThatKeepsEveryValueGivesTheSharedPathsGradients) {
  LoraGolden g(GetParam());
  std::vector<float> values = g.adapter_values;
  const DropoutStep shared = dropout_step(g, values, 0.0, 1), kept = dropout_step(g, values, 1e-12, 1);
  EXPECT_NEAR(kept.nll, shared.nll, 1e-6 * std::fabs(shared.nll));
  EXPECT_LE(test::relative_l2(kept.grads, shared.grads), 1e-6);
}

// The backward under dropout (p = 0.3) against central differences of the step's Σ nll, the
// masks fixed (a function of the seed, the step and the tokens' places): a few entries of each
// adapter tensor, every layer's and target's, A's (whose gradient reads the dropped input and
// whose effect on lower layers goes through the dropped input gradient) and B's. The gradient
// is far from the one without dropout, so the check is not of that.
TEST_P(LoraGoldenTest, DropoutBackwardMatchesFiniteDifferencesWithTheMaskFixed) {
  LoraGolden g(GetParam());
  std::vector<float> values = g.adapter_values;
  constexpr double kP = 0.3;
  constexpr int64_t kStep = 3;
  const DropoutStep at = dropout_step(g, values, kP, kStep);
  EXPECT_GT(test::relative_l2(at.grads, dropout_step(g, values, 0.0, kStep).grads), 0.05);
  std::mt19937 rng(11);
  std::vector<float> analytic, numeric;
  for (const HfTensorSpec& hf : g.adapters.hf_tensors) {
    std::uniform_int_distribution<int64_t> pick(0, hf.shape.numel() - 1);
    for (int sample = 0; sample < 3; ++sample) {
      const auto i = static_cast<size_t>(g.offset(hf) + pick(rng));
      const float saved = values[i];
      constexpr float kH = 1e-2f;
      values[i] = saved + kH;
      const double up = dropout_step(g, values, kP, kStep).nll;
      values[i] = saved - kH;
      const double down = dropout_step(g, values, kP, kStep).nll;
      values[i] = saved;
      numeric.push_back(static_cast<float>((up - down) / (2.0 * kH)));
      analytic.push_back(at.grads[i]);
    }
  }
  EXPECT_LE(test::relative_l2(analytic, numeric), 1e-2);
}

// A LoRA run through `loom train`'s code path (a recipe file, recipe_load, train_run) of the
// case, its adapters from adapter_init/, into work/run. `extra`: lines added to the train block;
// `overrides`: --set's.
void train_lora(const LoraGolden& g, const fs::path& work, const std::string& device = "cpu",
                const std::string& extra = "", int64_t stop_at_step = 0, const std::string& precision = "",
                const std::vector<std::string>& overrides = {}) {
  fs::create_directories(work);
  const nlohmann::json& r = g.recipe;
  const nlohmann::json& l = r.at("lora");
  std::string targets;
  for (const std::string t : l.at("targets")) targets += (targets.empty() ? "" : ", ") + t;
  std::ofstream(work / "recipe.yaml")
      << "schema_version: 1\nmodel: golden-lora\nstatus: draft\n"
      << "workload: {row_tokens: " << r.at("row_tokens") << ", global_batch: " << r.at("global_batch")
      << ", precision: "
      << (!precision.empty() ? precision
          : device == "cpu"  ? "fp32"
                             : "bf16")
      << "}\n"
      << "layout: {tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: " << 2 * r.at("row_tokens").get<int64_t>()
      << "}\n"
      << "train:\n  device: " << device
      << "\n  seed: 1\n  init: {hf_checkpoint: " << fs::absolute(g.dir + "/model").string()
      << "}\n  data: {path: " << fs::absolute(g.dir + "/rows.jsonl").string()
      << "}\n  steps: " << r.at("steps") << "\n  optimizer: {lr: " << r.at("lr")
      << ", min_lr: " << r.at("min_lr") << ", decay: " << r.at("decay").get<std::string>()
      << ", warmup_fraction: " << r.at("warmup_fraction") << ", weight_decay: " << r.at("weight_decay")
      << ", beta1: " << r.at("beta1") << ", beta2: " << r.at("beta2") << ", eps: " << r.at("eps")
      << ", clip_grad: " << r.at("clip_grad") << "}\n  lora: {rank: " << l.at("rank")
      << ", alpha: " << l.at("alpha") << ", targets: [" << targets << "], rslora: " << l.at("rslora")
      << ", merge: true, init: {adapter: " << fs::absolute(g.dir + "/adapter_init").string() << "}}\n"
      << "  output_dir: " << (work / "run").string() << "\n"
      << extra;
  TrainOptions options;
  options.progress = false;
  options.stop_at_step = stop_at_step;
  train_run(recipe_load((work / "recipe.yaml").string(), overrides), options);
}

fs::path work_dir(const std::string& name, const std::string& test) {
  return fs::temp_directory_path() / ("loom-lora-" + test + "-" + name + "-" + std::to_string(::getpid()));
}

// rel_l2 of every tensor of `table` between two safetensors files, each at most `tolerance`.
void expect_tensors_near(const std::string& got_path, const std::string& ref_path, const ParamTable& table,
                         double tolerance) {
  SafetensorsFile got = SafetensorsFile::open(got_path), ref = SafetensorsFile::open(ref_path);
  for (const HfTensorSpec& hf : table.hf_tensors) {
    std::vector<float> a = tensor_values(got, hf.hf_name), b = tensor_values(ref, hf.hf_name);
    ASSERT_EQ(a.size(), b.size()) << hf.hf_name;
    EXPECT_LE(test::relative_l2(a, b), tolerance) << hf.hf_name << " in " << got_path;
  }
}

// The whole run: per-step loss, the adapters' grad norm and the LR as PEFT's; final/ a PEFT
// folder (its config read back, its adapters PEFT's after the last step by name) and
// final/merged/ the base with them merged as merge_and_unload gives it, all within the golden
// tolerances of test_golden.cpp's full fine-tuning.
TEST_P(LoraGoldenTest, TrainingTraceFinalAdaptersAndMergedWeightsEqualPeft) {
  LoraGolden g(GetParam());
  const fs::path work = work_dir(GetParam(), "trace");
  fs::remove_all(work);
  train_lora(g, work);
  const nlohmann::json trace = read_json(g.dir + "/trace.json");
  const std::vector<StepMetrics> steps = metrics_read_jsonl((work / "run" / "metrics.jsonl").string());
  const nlohmann::json& ref_steps = trace.at("steps");
  ASSERT_EQ(steps.size(), ref_steps.size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const nlohmann::json& ref = ref_steps.at(i);
    EXPECT_NEAR(steps[i].loss, ref.at("loss").get<double>(), 1e-5 * ref.at("loss").get<double>())
        << "step " << i + 1;
    EXPECT_NEAR(steps[i].grad_norm, ref.at("grad_norm").get<double>(),
                1e-4 * ref.at("grad_norm").get<double>())
        << "step " << i + 1;
    EXPECT_NEAR(steps[i].lr, ref.at("lr").get<double>(), 1e-9 * g.recipe.at("lr").get<double>())
        << "step " << i + 1;
  }
  const fs::path final_dir = work / "run" / "final";
  const PeftAdapterConfig written = peft_adapter_read_config(final_dir.string());
  EXPECT_EQ(written.lora.rank, g.lora.rank);
  EXPECT_EQ(written.lora.alpha, g.lora.alpha);
  EXPECT_EQ(written.lora.rslora, g.lora.rslora);
  EXPECT_EQ(written.lora.targets, g.lora.targets);
  EXPECT_EQ(written.base_model, fs::absolute(g.dir + "/model").string());
  expect_tensors_near((final_dir / "adapter_model.safetensors").string(),
                      g.dir + "/adapter_final/adapter_model.safetensors", g.adapters, 1e-5);
  expect_tensors_near((final_dir / "merged" / "model.safetensors").string(), g.dir + "/merged.safetensors",
                      g.table, 1e-5);
  fs::remove_all(work);
}

// final/ loads in PEFT over the base (check_hf_load.py --adapter) with the logits loom computes
// from final/merged/: what a user loads is what loom trained.
TEST_P(LoraGoldenTest, FinalAdapterLoadsInPeftWithTheMergedWeightsLogits) {
  const char* python = std::getenv("LOOM_PYTHON");
  if (!python || !*python)
    GTEST_SKIP()
        << "LOOM_PYTHON is not set (scripts/test.sh sets it to a Python with transformers and peft); "
           "the PEFT load check did not run";
  LoraGolden g(GetParam());
  const fs::path work = work_dir(GetParam(), "peftload");
  fs::remove_all(work);
  train_lora(g, work);
  const std::string logits_path = (work / "logits.safetensors").string();
  test::write_checkpoint_logits((work / "run" / "final" / "merged").string(), g.rows, logits_path);
  const std::string command = std::string(python) + " " + LOOM_SOURCE_DIR +
                              "/tests/golden/check_hf_load.py " + fs::absolute(g.dir + "/model").string() +
                              " " + g.dir + "/rows.jsonl --adapter " + (work / "run" / "final").string() +
                              " --logits " + logits_path + " --atol 1e-4";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  fs::remove_all(work);
}

// A run stopped after step 3 (a checkpoint of the adapters and their Adam state only) resumes
// to the same adapters bit for bit; onto a base whose weights differ it is refused.
TEST_P(LoraGoldenTest, ResumesBitwiseAndRefusesAnotherBase) {
  LoraGolden g(GetParam());
  const fs::path straight = work_dir(GetParam(), "straight"), resumed = work_dir(GetParam(), "resumed");
  fs::remove_all(straight);
  fs::remove_all(resumed);
  train_lora(g, straight);
  train_lora(g, resumed, "cpu", "", 3);
  const fs::path checkpoint = resumed / "run" / "checkpoints" / "step-00000003";
  ASSERT_TRUE(fs::exists(checkpoint / "COMMIT"));
  // The adapters' state, not the base's.
  SafetensorsFile state = SafetensorsFile::open((checkpoint / "state.safetensors").string());
  int64_t numel = 0;
  for (const SafetensorsEntry& e : state.entries())
    numel += std::accumulate(e.shape.begin(), e.shape.end(), int64_t{1}, std::multiplies<>());
  EXPECT_EQ(numel, 3 * g.adapters.total_numel);
  train_lora(g, resumed);
  const auto bytes = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(straight / "run" / "final" / "adapter_model.safetensors"),
            bytes(resumed / "run" / "final" / "adapter_model.safetensors"));

  // The same recipe over a base with one weight changed, resumed from step 3's checkpoint.
  fs::remove_all(resumed / "run" / "final");
  fs::remove_all(resumed / "run" / "checkpoints" / "step-00000006");
  const fs::path other = resumed / "other-base";
  fs::create_directories(other);
  fs::copy(g.dir + "/model", other, fs::copy_options::recursive);
  {
    std::fstream f(other / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x01');
  }
  LoraGolden moved = g;
  moved.dir = resumed.string();
  fs::copy(g.dir + "/rows.jsonl", resumed / "rows.jsonl");
  fs::copy(g.dir + "/adapter_init", resumed / "adapter_init", fs::copy_options::recursive);
  fs::rename(other, resumed / "model");
  try {
    train_lora(moved, resumed);
    FAIL() << "a LoRA run resumed onto another base";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train.lora.base_sha256"), std::string::npos) << e.what();
  }
  fs::remove_all(straight);
  fs::remove_all(resumed);
}

// An adapter folder that disagrees with the recipe is refused, naming the field.
TEST_P(LoraGoldenTest, RefusesAnAdapterFolderOfAnotherRank) {
  LoraGolden g(GetParam());
  LoraGolden other = g;
  other.recipe["lora"]["rank"] = g.lora.rank * 2;
  const fs::path work = work_dir(GetParam(), "rank");
  fs::remove_all(work);
  try {
    train_lora(other, work);
    FAIL() << "an adapter folder of rank " << g.lora.rank << " started a rank " << 2 * g.lora.rank << " run";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("train.lora.rank"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("has r = " + std::to_string(g.lora.rank)), std::string::npos)
        << e.what();
  }
  fs::remove_all(work);
}

// An FP8 frozen base (workload.precision fp8: the base's forward and input-gradient GEMMs in
// FP8, cast once; the adapters' GEMMs in the activation dtype) on `device` against PEFT's fp32
// run: the loss of every step within 0.5% (the CPU's FP8 emulation: 5.5e-4 at worst) and the
// final adapters within 10% (rel_l2).
void expect_fp8_lora_near_peft(const LoraGolden& g, const fs::path& work, const std::string& device) {
  fs::remove_all(work);
  train_lora(g, work, device, "", 0, "fp8");
  const nlohmann::json trace = read_json(g.dir + "/trace.json");
  const std::vector<StepMetrics> steps = metrics_read_jsonl((work / "run" / "metrics.jsonl").string());
  ASSERT_EQ(steps.size(), trace.at("steps").size());
  double worst = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const double ref = trace.at("steps").at(i).at("loss").get<double>();
    EXPECT_NEAR(steps[i].loss, ref, 5e-3 * ref) << "step " << i + 1;
    worst = std::max(worst, std::fabs(steps[i].loss - ref) / ref);
  }
  std::printf("FP8 LoRA on %s vs PEFT fp32 (%s): worst step loss difference %.2e\n", device.c_str(),
              g.dir.c_str(), worst);
  expect_tensors_near((work / "run" / "final" / "adapter_model.safetensors").string(),
                      g.dir + "/adapter_final/adapter_model.safetensors", g.adapters, 0.1);
  fs::remove_all(work);
}

TEST_P(LoraGoldenTest, Fp8BaseStaysNearPeft) {
  LoraGolden g(GetParam());
  expect_fp8_lora_near_peft(g, work_dir(GetParam(), "fp8"), "cpu");
}

TEST_P(LoraGoldenTest, GpuFp8BaseStaysNearPeft) {
  std::string why;
  if (!cuda_engine_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
  LoraGolden g(GetParam());
  expect_fp8_lora_near_peft(g, work_dir(GetParam(), "gpu-fp8"), "cuda");
}

// The GPU engine (bf16 base and adapters' weights, fp32 masters and grads) against PEFT's
// fp32 run: the loss of every step within 2% and the final adapters within 5% (rel_l2).
TEST_P(LoraGoldenTest, GpuBf16RunStaysNearPeft) {
  std::string why;
  if (!cuda_engine_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
  LoraGolden g(GetParam());
  const fs::path work = work_dir(GetParam(), "gpu");
  fs::remove_all(work);
  train_lora(g, work, "cuda");
  const nlohmann::json trace = read_json(g.dir + "/trace.json");
  const std::vector<StepMetrics> steps = metrics_read_jsonl((work / "run" / "metrics.jsonl").string());
  ASSERT_EQ(steps.size(), trace.at("steps").size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const double ref = trace.at("steps").at(i).at("loss").get<double>();
    EXPECT_NEAR(steps[i].loss, ref, 2e-2 * ref) << "step " << i + 1;
  }
  expect_tensors_near((work / "run" / "final" / "adapter_model.safetensors").string(),
                      g.dir + "/adapter_final/adapter_model.safetensors", g.adapters, 5e-2);
  fs::remove_all(work);
}

// The GPU engine with dropout 0.1 against the CPU twin's fp32 run with it: the kernel draws the
// CPU's masks (ops/lora_dropout.h), so every step's loss stays within 2% and the final adapters
// within 5% (rel_l2), the bounds of the bf16 run against PEFT (a run with dropout follows no
// PEFT trace: torch draws other masks).
TEST_P(LoraGoldenTest, GpuDropoutRunStaysNearTheCpuRun) {
  std::string why;
  if (!cuda_engine_available(&why)) GTEST_SKIP() << "GPU test skipped: " << why;
  LoraGolden g(GetParam());
  const fs::path cpu = work_dir(GetParam(), "dropout-cpu"), gpu = work_dir(GetParam(), "dropout-gpu");
  fs::remove_all(cpu);
  fs::remove_all(gpu);
  train_lora(g, cpu, "cpu", "", 0, "", {"train.lora.dropout=0.1"});
  train_lora(g, gpu, "cuda", "", 0, "", {"train.lora.dropout=0.1"});
  const std::vector<StepMetrics> a = metrics_read_jsonl((gpu / "run" / "metrics.jsonl").string());
  const std::vector<StepMetrics> b = metrics_read_jsonl((cpu / "run" / "metrics.jsonl").string());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_NEAR(a[i].loss, b[i].loss, 2e-2 * b[i].loss) << "step " << i + 1;
  expect_tensors_near((gpu / "run" / "final" / "adapter_model.safetensors").string(),
                      (cpu / "run" / "final" / "adapter_model.safetensors").string(), g.adapters, 5e-2);
  fs::remove_all(cpu);
  fs::remove_all(gpu);
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraGoldenTest, ::testing::Values("tiny_lora", "tiny_lora_rslora"));

}  // namespace
}  // namespace loom
