// The measurement (train/metrics.h) reproduces the seed's result block from its inputs:
// N of Qwen3-32B, MFU, $ / 1M tokens, the window's tokens/s and step-time CV, GPU-hours.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/version.h"
#include "model/config.h"
#include "recipe/recipe.h"
#include "train/metrics.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kSeed = std::string(LOOM_SOURCE_DIR) + "/recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml";

// Qwen/Qwen3-32B's config.json (revision 9216db57, the seed's active_params source).
const char* kQwen3_32B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 25600,
  "max_position_embeddings": 40960, "max_window_layers": 64, "model_type": "qwen3",
  "num_attention_heads": 64, "num_hidden_layers": 64, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936
})";

constexpr int64_t kSeedN = 31983534080;

double round_to(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

TEST(Measurement, ActiveParamsOfQwen3_32B) {
  ModelConfig from_json = model_config_from_json(nlohmann::json::parse(kQwen3_32B), "config.json");
  EXPECT_EQ(from_json.matmul_params(), kSeedN);
  ModelConfig builtin;
  ASSERT_TRUE(qwen3_config_builtin("Qwen/Qwen3-32B", &builtin));
  EXPECT_EQ(builtin.matmul_params(), kSeedN);
  // By hand: per layer QKV 5120·(64+16)·128, O 8192·5120, gate/up/down 3·5120·25600; lm_head 151936·5120.
  EXPECT_EQ(64 * (5120LL * 10240 + 8192LL * 5120 + 3LL * 5120 * 25600) + 151936LL * 5120, kSeedN);
}

TEST(Measurement, MfuOfTheSeed) {
  EXPECT_EQ(round_to(mfu_from_throughput(kSeedN, 2200.16), 4), 0.4269);
  EXPECT_DOUBLE_EQ(mfu_from_throughput(kSeedN, 2200.16), 6.0 * 31983534080.0 * 2200.16 / 989e12);
}

// 20 steps of the seed's global batch (128 rows of 8,192 tokens on 8 GPUs), steps 5-19 at
// 2,200.16 tokens/s/GPU with a population step-time CV of 0.45%, the others far off.
std::vector<StepMetrics> seed_like_run() {
  const double tokens = 128.0 * 8192.0;
  const double mean = tokens / (2200.16 * 8);
  // 7 steps at mean·(1+d), 7 at mean·(1−d), one at the mean: population std = d·sqrt(14/15)·mean.
  const double d = 0.0045 / std::sqrt(14.0 / 15.0);
  std::vector<StepMetrics> steps;
  for (int64_t step = 1; step <= 20; ++step) {
    StepMetrics m;
    m.step = step;
    m.tokens = 128 * 8192;
    const int64_t k = step - 5;  // 0..14 inside the window
    if (step < 5 || step > 19)
      m.step_time_s = 3 * mean;  // warm-up and the last step are not measured
    else
      m.step_time_s = k == 14 ? mean : mean * (k % 2 ? 1 - d : 1 + d);
    steps.push_back(m);
  }
  return steps;
}

TEST(Measurement, WindowThroughputAndPopulationCvOfTheSeed) {
  const WindowResult w = window_measure(seed_like_run(), 5, 19, 8, kSeedN);
  EXPECT_EQ(w.window_tokens, 15728640);
  EXPECT_NEAR(w.tokens_per_s_per_gpu, 2200.16, 1e-9);
  EXPECT_EQ(round_to(w.mfu, 4), 0.4269);
  EXPECT_NEAR(w.step_time_cv, 0.0045, 1e-12) << "population (÷ n)";
  EXPECT_EQ(round_to(100 * w.step_time_cv, 2), 0.45);
  // The sample CV (÷ n − 1) of the same steps would read 0.47%.
  EXPECT_EQ(round_to(100 * w.step_time_cv * std::sqrt(15.0 / 14.0), 2), 0.47);
}

TEST(Measurement, WindowOutsideTheRunNamesResultWindow) {
  EXPECT_THROW(window_measure(seed_like_run(), 5, 25, 8, kSeedN), InputError);
  EXPECT_THROW(window_measure(seed_like_run(), 0, 5, 8, kSeedN), InputError);
  try {
    window_measure(seed_like_run(), 10, 9, 8, kSeedN);
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("result.window: ", 0), 0u) << e.what();
  }
}

TEST(Measurement, GpuHoursFromLaunch) {
  EXPECT_DOUBLE_EQ(gpu_hours_from(8, 3.02 * 3600 / 8), 3.02);
  // This test process started before this line, and not hours ago. /proc counts in 10 ms
  // ticks, so a process a few ms old may read 0.
  const double elapsed = process_elapsed_s();
  EXPECT_GE(elapsed, 0.0);
  EXPECT_LT(elapsed, 3600.0);
  EXPECT_GE(process_elapsed_s(), elapsed);
}

RunResult seed_run_result() {
  RunResult run;
  run.window = window_measure(seed_like_run(), 5, 19, 8, kSeedN);
  run.steps_run = 20;
  run.active_params = kSeedN;
  run.active_params_source = "config.json";
  run.gpu_hours = 3.0213;
  run.price = gpu_price("AWS p5en.48xlarge", 0);
  run.measured = "2026-10-18";
  return run;
}

// Filled from the seed's inputs, the result block is the seed's, field for field, then loom's
// own field: which loom measured it.
TEST(ResultBlock, ReproducesTheSeedsResultBlock) {
  const YAML::Node seed = YAML::LoadFile(kSeed);
  const YAML::Node doc = result_document(seed, seed_run_result());
  const YAML::Node result = doc["result"];
  const YAML::Node expected = seed["result"];
  std::vector<std::string> keys, expected_keys;
  for (const auto& item : result) keys.push_back(item.first.Scalar());
  for (const auto& item : expected) expected_keys.push_back(item.first.Scalar());
  expected_keys.push_back("loom");
  EXPECT_EQ(keys, expected_keys) << "the seed's field names, in its order, then loom";
  EXPECT_EQ(result["loom"].Scalar(), loom_version());
  for (const char* key : {"tokens_per_s_per_gpu", "usd_per_million_tokens", "step_time_cv_percent", "mfu"})
    EXPECT_DOUBLE_EQ(result[key].as<double>(), expected[key].as<double>()) << key;
  for (const char* key : {"measured", "steps_per_run", "window_tokens", "runs", "profiler", "gpu_hours"})
    EXPECT_EQ(result[key].Scalar(), expected[key].Scalar()) << key;
  EXPECT_TRUE(result["mfu_note"].IsNull());
  EXPECT_EQ(result["window"][0].as<int>(), 5);
  EXPECT_EQ(result["window"][1].as<int>(), 19);
  // N agrees with the seed's, so its source and revision are kept.
  EXPECT_EQ(result["active_params"]["count"].as<int64_t>(), kSeedN);
  EXPECT_EQ(result["active_params"]["source"].Scalar(), "https://huggingface.co/Qwen/Qwen3-32B");
  EXPECT_EQ(result["active_params"]["revision"].Scalar(), "9216db5781bf21249d130ec9da846c4624c16137");
  // The rest of the recipe is untouched, and the whole validates.
  EXPECT_EQ(doc["layout"]["summary"].Scalar(), seed["layout"]["summary"].Scalar());
  const fs::path file =
      fs::temp_directory_path() / ("loom_test_result_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(file);
    out << recipe_document_to_yaml(doc);
  }
  std::vector<Violation> violations = recipe_validate(file.string());
  EXPECT_TRUE(violations.empty()) << violations_to_string(violations);
  fs::remove(file);
}

TEST(ResultBlock, DraftGetsAResultBlockInTheSeedsOrder) {
  const YAML::Node draft = YAML::Load(
      "schema_version: 1\nmodel: Qwen3-0.6B\nstatus: draft\nresult: {window: [5, 19]}\ntrain: {steps: 20}\n");
  RunResult run = seed_run_result();
  run.price.reset();
  run.active_params = 440401920;
  run.mfu_note = "train.device cpu";
  run.gpu_hours = 0.000834;
  const YAML::Node doc = result_document(draft, run);
  const YAML::Node result = doc["result"];
  EXPECT_FALSE(result["usd_per_million_tokens"].IsDefined()) << "no price, no cost";
  EXPECT_EQ(result["mfu_note"].Scalar(), "train.device cpu");
  EXPECT_EQ(result["active_params"]["source"].Scalar(), "config.json");
  EXPECT_FALSE(result["active_params"]["revision"].IsDefined());
  EXPECT_EQ(result["gpu_hours"].Scalar(), "0.000834") << "three significant digits for a short run";
  EXPECT_EQ(result.begin()->first.Scalar(), "tokens_per_s_per_gpu");
  // The block stays where it was, before train.
  std::vector<std::string> top;
  for (const auto& item : doc) top.push_back(item.first.Scalar());
  EXPECT_EQ(top, (std::vector<std::string>{"schema_version", "model", "status", "result", "train"}));
  const std::string text = recipe_document_to_yaml(doc);
  EXPECT_NE(text.find("tokens_per_s_per_gpu: 2200.16\n"), std::string::npos) << text;
  EXPECT_NE(text.find("mfu: 0.4269\n"), std::string::npos) << text;
  EXPECT_NE(text.find("window: [5, 19]\n"), std::string::npos) << text;
}

TEST(ResultBlock, ActiveParamsOfADifferentCountAreReplaced) {
  const YAML::Node draft = YAML::Load("result: {active_params: {source: somewhere, revision: abc}}\n");
  const YAML::Node params = result_document(draft, seed_run_result())["result"]["active_params"];
  EXPECT_EQ(params["count"].as<int64_t>(), kSeedN);
  EXPECT_EQ(params["source"].Scalar(), "config.json");
  EXPECT_FALSE(params["revision"].IsDefined()) << "a revision of another count's source would mislead";
}

TEST(ResultBlock, SummaryLineSaysTheCvIsPopulation) {
  const std::string line = result_summary_line(seed_run_result());
  EXPECT_EQ(
      line.rfind(
          "result over steps 5-19: 2,200.16 tokens/s/GPU, MFU 42.7%, step-time CV 0.45% (population std / "
          "mean), $1.00 / 1M tokens (data/instance_prices.yaml: AWS p5en.48xlarge",
          0),
      0u)
      << line;
  EXPECT_NE(line.find(", 3.02 GPU-hours"), std::string::npos) << line;
}

TEST(MetricsJsonl, RoundTripsAndNamesBadLines) {
  StepMetrics m;
  m.step = 3;
  m.loss = 2.5;
  m.grad_norm = 0.75;
  m.lr = 1e-5;
  m.tokens = 1048576;
  m.step_time_s = 59.5;
  m.tokens_per_s_per_gpu = 2200.16;
  m.mfu = 0.4269;
  m.max_mem_gib = 120.5;
  const fs::path file =
      fs::temp_directory_path() / ("loom_test_metrics_" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream out(file);
    out << metrics_to_json(m) << "\n";
  }
  std::vector<StepMetrics> back = metrics_read_jsonl(file.string());
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].step, 3);
  EXPECT_EQ(back[0].tokens, 1048576);
  EXPECT_DOUBLE_EQ(back[0].tokens_per_s_per_gpu, 2200.16);
  EXPECT_DOUBLE_EQ(back[0].max_mem_gib, 120.5);
  {
    std::ofstream out(file, std::ios::app);
    out << "{\"loss\": 1}\n";
  }
  try {
    metrics_read_jsonl(file.string());
    ADD_FAILURE() << "a line without step was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(file.string() + ":2: field 'step'"), std::string::npos) << e.what();
  }
  {  // A key written twice in a record (once read as its last value).
    std::ofstream out(file);
    out << "{\"step\": 1, \"step\": 2, \"loss\": 1}\n";
  }
  try {
    metrics_read_jsonl(file.string());
    ADD_FAILURE() << "a record with a key twice was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(":1: found the key 'step' a second time"), std::string::npos)
        << e.what();
  }
  fs::remove(file);
}

StepMetrics a_step() {
  StepMetrics m;
  m.step = 3;
  m.loss = 5.4321;
  m.grad_norm = 1.234;
  m.lr = 1e-3;
  m.tokens_per_s_per_gpu = 12345;
  m.mfu = 0.412;
  m.max_mem_gib = 3.2;
  return m;
}

TEST(Progress, LineHasEveryFigure) {
  EXPECT_EQ(
      progress_line(a_step(), 20, 65),
      "step 3/20 | loss 5.4321 | grad norm 1.234 | lr 1.00e-03 | 12,345 tok/s/GPU | MFU 41.2% | 3.20 GiB | "
      "ETA 1m05s");
}

// An evaluation over no targets shows no loss rather than a 0.0 that reads as the best.
TEST(Progress, EvalOverNoTargetsSaysSo) {
  EXPECT_EQ(eval_progress_line(EvalMetrics{3, 2.34561, 12345, 1.2}),
            "eval at step 3 | eval loss 2.3456 | 12,345 tokens | 1.2 s");
  EXPECT_EQ(eval_progress_line(EvalMetrics{3, std::numeric_limits<double>::quiet_NaN(), 0, 1.2}),
            "eval at step 3 | eval loss none (no targets in the eval rows) | 0 tokens | 1.2 s");
}

// A mixture of experts' step: the aux loss and the most uneven layer before the ETA; both in
// the metrics line, read back.
TEST(Progress, MixtureOfExpertsAddsTheAuxLossAndTheWorstLayer) {
  StepMetrics m = a_step();
  m.aux_loss = 2.125746;
  m.experts = {{0, {10, 30, 0.25}}, {2, {4, 50, 0.5}}};
  EXPECT_EQ(
      progress_line(m, 20, 65),
      "step 3/20 | loss 5.4321 | grad norm 1.234 | lr 1.00e-03 | 12,345 tok/s/GPU | MFU 41.2% | 3.20 GiB | "
      "aux 2.1257 | experts cv 0.50 (layer 2) | ETA 1m05s");
  const nlohmann::json j = nlohmann::json::parse(metrics_to_json(m));
  EXPECT_EQ(j.at("aux_loss").get<double>(), 2.125746);
  EXPECT_EQ(j.at("experts").at(1).at("layer").get<int64_t>(), 2);
  EXPECT_EQ(j.at("experts").at(1).at("max").get<double>(), 50.0);
  EXPECT_FALSE(nlohmann::json::parse(metrics_to_json(a_step())).contains("aux_loss"));
}

std::string printed(bool tty, int columns, int steps) {
  std::FILE* out = std::tmpfile();
  {
    ProgressPrinter printer(out, 20, tty, columns);
    for (int i = 0; i < steps; ++i) printer.step(a_step(), 65);
  }
  std::rewind(out);
  std::string text;
  int c;
  while ((c = std::fgetc(out)) != EOF) text.push_back(static_cast<char>(c));
  std::fclose(out);
  return text;
}

TEST(Progress, OneLinePerStepInALog) {
  const std::string line = progress_line(a_step(), 20, 65);
  EXPECT_EQ(printed(false, 0, 2), line + "\n" + line + "\n");
}

TEST(Progress, RedrawnInPlaceOnATerminalAndCutToItsWidth) {
  const std::string line = progress_line(a_step(), 20, 65);
  EXPECT_EQ(printed(true, 0, 2), "\r" + line + "\x1b[K\r" + line + "\x1b[K\n");
  EXPECT_EQ(printed(true, 40, 1), "\r" + line.substr(0, 39) + "\x1b[K\n");
  EXPECT_EQ(printed(true, 200, 0), "") << "nothing drawn, nothing to end";
}

// The event file's bytes hold each tag once per step.
TEST(Tensorboard, StepScalarsUnderTheirTags) {
  const fs::path dir = fs::temp_directory_path() / ("loom_test_tb_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string path;
  {
    TensorBoardWriter writer(dir.string());
    path = writer.path();
    StepMetrics m = a_step();
    metrics_to_tensorboard(m, writer);
    m.step = 4;
    metrics_to_tensorboard(m, writer);
  }
  std::ifstream in(path, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  for (const char* tag : {"lm loss", "lr", "grad norm", "throughput", "mfu", "step time", "memory"}) {
    const std::string framed =
        std::string(1, '\x0a') + static_cast<char>(std::char_traits<char>::length(tag)) + tag;
    size_t n = 0;
    for (size_t at = bytes.find(framed); at != std::string::npos; at = bytes.find(framed, at + 1)) ++n;
    EXPECT_EQ(n, 2u) << tag;
  }
  fs::remove_all(dir);
}

// FP8 statistics (train.fp8_stats_every): a fp8_stats.jsonl line names each kind that had
// casts (a kind with none, e.g. every layer kept in bf16, is left out), and the progress line
// names the most flushed kind, the clamped count and the largest amax.
TEST(Fp8StatsOutput, JsonLineAndProgressLineNameTheKinds) {
  Fp8Stats stats;
  for (int k = 0; k < Fp8Stats::kKinds; ++k)
    if (k != Fp8Stats::kind_of(ParamKind::o_proj, Fp8Stats::weight))
      stats.kinds[static_cast<size_t>(k)] = {1.0f + static_cast<float>(k), 1000, 1, 0};
  const int grad = Fp8Stats::kind_of(ParamKind::down, Fp8Stats::output_grad);
  stats.kinds[static_cast<size_t>(grad)] = {0.5f, 2000, 62, 3};
  EXPECT_EQ(Fp8Stats::kind_name(grad), "down.output_grad");
  const std::string line = fp8_stats_to_json(7, stats);
  EXPECT_EQ(
      line.rfind("{\"step\":7,\"qkv.input\":{\"amax\":1.0,\"values\":1000,\"flushed\":1,\"clamped\":0}", 0),
      0u)
      << line;
  EXPECT_NE(line.find("\"down.output_grad\":{\"amax\":0.5,\"values\":2000,\"flushed\":62,\"clamped\":3}"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.find("o_proj.weight"), std::string::npos) << line;
  EXPECT_EQ(
      fp8_stats_progress_line(7, stats),
      "fp8 at step 7 | most flushed: down.output_grad 3.1% | clamped: 3 | largest amax: down.weight 11");
}

}  // namespace
}  // namespace loom
