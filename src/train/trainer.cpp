#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "core/allocator.h"
#include "core/error.h"
#include "io/file_output.h"
#include "io/hf_checkpoint.h"
#include "io/init.h"
#include "model/qwen3.h"
#include "ops/cpu/cpu_ops.h"
#include "optim/adamw.h"
#include "optim/grad_clip.h"
#include "optim/lr_schedule.h"
#include "train/metrics.h"
#include "train/rows.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Only the single-rank fp32 CPU path exists so far; refuse the rest clearly.
void check_supported(const Recipe& r) {
  if (r.train.device != "cpu")
    throw_input_error(r.path, "train.device: \"" + r.train.device +
                                  "\" is not available in this build; the CUDA trainer is not built yet "
                                  "(expected \"cpu\")");
  if (r.workload.precision != "fp32")
    throw_input_error(r.path, "workload.precision: \"" + r.workload.precision +
                                  "\" on train.device cpu; expected \"fp32\" (the CPU reference computes in fp32)");
  if (r.layout.tp * r.layout.pp * r.layout.cp * r.layout.dp != 1)
    throw_input_error(r.path, "layout: tp·pp·cp·dp = " +
                                  std::to_string(r.layout.tp * r.layout.pp * r.layout.cp * r.layout.dp) +
                                  "; parallel layouts are not implemented yet (expected 1)");
  if (fs::is_directory(r.train.data_path))
    throw_input_error(r.path, "train.data.path: " + r.train.data_path +
                                  " is a directory; row stores are not readable yet (expected a .jsonl of rows)");
}

Qwen3Config run_config(const Recipe& r) {
  if (!r.train.init_hf_checkpoint.empty()) return hf_checkpoint_read_config(r.train.init_hf_checkpoint);
  return qwen3_config_load(r.train.init_random_config);
}

std::vector<ParamRange> optimizer_ranges(const ParamTable& table) {
  std::vector<ParamRange> ranges;
  for (const ParamSpec& p : table.params) ranges.push_back({p.offset, p.numel(), p.decay()});
  return ranges;
}

std::string result_yaml(const Recipe& r, const WindowResult& w, double gpu_hours, int64_t gpus,
                        const Qwen3Config& config) {
  YAML::Node doc = YAML::Clone(r.document);
  YAML::Node result = doc["result"];
  result["tokens_per_s_per_gpu"] = std::round(w.tokens_per_s_per_gpu * 100) / 100;
  result["mfu"] = std::round(w.mfu * 10000) / 10000;
  result["step_time_cv_percent"] = std::round(w.step_time_cv * 10000) / 100;
  result["step_time_cv_note"] = "population standard deviation over the window's step times / their mean";
  result["active_params"]["count"] = config.matmul_params();
  result["steps_per_run"] = r.train.steps;
  YAML::Node window;
  window.push_back(w.first);
  window.push_back(w.last);
  window.SetStyle(YAML::EmitterStyle::Flow);
  result["window"] = window;
  result["window_tokens"] = w.window_tokens;
  result["runs"] = 1;
  result["gpu_hours"] = gpu_hours;
  result["gpus"] = gpus;
  YAML::Emitter out;
  out << doc;
  return std::string(out.c_str()) + "\n";
}

}  // namespace

TrainSummary train_run(const Recipe& recipe, const TrainOptions& options) {
  const auto launch = Clock::now();
  check_supported(recipe);
  const TrainSpec& spec = recipe.train;
  const Qwen3Config config = run_config(recipe);
  const ParamTable table = param_table_build(config);

  // Data first: a bad rows file should fail before any weights are read.
  const RowSet data = rows_load_jsonl(spec.data_path, recipe.workload.row_tokens, config.vocab_size);

  std::vector<float> params(static_cast<size_t>(table.total_numel));
  if (!spec.init_hf_checkpoint.empty())
    hf_checkpoint_load_params(spec.init_hf_checkpoint, config, table, params.data());
  else
    init_random_params(config, table, spec.seed, params.data());
  std::vector<float> grads(params.size()), adam_m(params.size()), adam_v(params.size());
  const int64_t state_bytes = static_cast<int64_t>(4 * params.size() * sizeof(float));

  LrSchedule schedule{spec.optimizer.lr,      spec.optimizer.min_lr, spec.optimizer.decay,
                      spec.optimizer.warmup_fraction, spec.steps,     recipe.workload.global_batch};
  schedule.validate();
  const AdamWConfig adam{static_cast<float>(spec.optimizer.beta1), static_cast<float>(spec.optimizer.beta2),
                         static_cast<float>(spec.optimizer.eps), static_cast<float>(spec.optimizer.weight_decay)};
  const std::vector<ParamRange> ranges = optimizer_ranges(table);

  fs::create_directories(spec.output_dir);
  const std::string metrics_path = (fs::path(spec.output_dir) / "metrics.jsonl").string();
  // metrics.jsonl is a log: a line per finished step, flushed, so a stopped run keeps them.
  std::ofstream metrics_out(metrics_path, std::ios::trunc);
  if (!metrics_out) throw_runtime_failure(metrics_path, "cannot write");

  CpuOps ops;
  Qwen3Model model(config, table, ops);
  ModelTensors tensors{param_views(table, params.data()), param_views(table, grads.data())};
  HostArena scratch;
  const int64_t gpus = 1;
  const int64_t last_step = options.stop_at_step > 0 ? std::min(options.stop_at_step, spec.steps) : spec.steps;
  std::vector<StepMetrics> history;
  double elapsed_steps_s = 0;

  for (int64_t step = 1; step <= last_step; ++step) {
    const auto start = Clock::now();
    std::fill(grads.begin(), grads.end(), 0.0f);
    const std::vector<int64_t> rows = step_rows(data, step, recipe.workload.global_batch);
    int64_t denominator = 0;
    for (int64_t r : rows) denominator += data.row_denominator(r);
    double nll_sum = 0;
    for (const auto& micro : micro_batches_split(rows, data.row_tokens, recipe.layout.max_tokens_per_gpu)) {
      MicroBatchData mb = micro_batch_build(data, micro);
      nll_sum += model.forward_backward(tensors, mb.view(), scratch, 1.0f);
      scratch.release_all();
    }
    // Per-token loss over the whole global batch: scale the summed gradient by 1/Σ n_r.
    grad_scale(grads.data(), static_cast<int64_t>(grads.size()), static_cast<float>(1.0 / static_cast<double>(denominator)));
    const double norm = grad_norm_l2(grads.data(), static_cast<int64_t>(grads.size()));
    const float clip = grad_clip_coefficient(norm, spec.optimizer.clip_grad);
    if (clip < 1.0f) grad_scale(grads.data(), static_cast<int64_t>(grads.size()), clip);
    const double lr = schedule.lr_at(step);
    adamw_step(adam, static_cast<float>(lr), step, ranges, params.data(), grads.data(), adam_m.data(),
               adam_v.data());
    const double step_time = std::chrono::duration<double>(Clock::now() - start).count();

    StepMetrics m;
    m.step = step;
    m.loss = nll_sum / static_cast<double>(denominator);
    m.grad_norm = norm;
    m.lr = lr;
    m.tokens = recipe.workload.global_batch * data.row_tokens;
    m.step_time_s = step_time;
    m.tokens_per_s_per_gpu = static_cast<double>(m.tokens) / step_time / static_cast<double>(gpus);
    m.mfu = mfu_from_throughput(config.matmul_params(), m.tokens_per_s_per_gpu);
    m.max_mem_gib = static_cast<double>(state_bytes + scratch.peak_bytes()) / (1024.0 * 1024.0 * 1024.0);
    metrics_out << metrics_to_json(m) << "\n" << std::flush;
    if (!metrics_out) throw_runtime_failure(metrics_path, "write failed");
    history.push_back(m);
    if (!std::isfinite(m.loss) || !std::isfinite(norm))
      throw_runtime_failure("step " + std::to_string(step), "loss or grad norm is not finite (loss " +
                                                                std::to_string(m.loss) + ", grad norm " +
                                                                std::to_string(norm) + ")");
    elapsed_steps_s += step_time;
    if (options.progress) {
      double eta = elapsed_steps_s / static_cast<double>(step) * static_cast<double>(last_step - step);
      std::fprintf(stderr, "%s\n", progress_line(m, spec.steps, eta).c_str());
    }
  }

  const std::string final_dir = (fs::path(spec.output_dir) / "final").string();
  hf_checkpoint_save(final_dir, config, table, params.data(), DType::f32, 0);

  // The result block over the recipe's window, clamped to the steps this run made.
  const int64_t first = std::min(recipe.window_first, last_step);
  const int64_t last = std::min(recipe.window_last, last_step);
  const WindowResult window = window_measure(history, first, last, gpus, config.matmul_params());
  const double gpu_hours =
      static_cast<double>(gpus) * std::chrono::duration<double>(Clock::now() - launch).count() / 3600.0;
  file_write_atomic((fs::path(spec.output_dir) / "result.yaml").string(),
                    result_yaml(recipe, window, gpu_hours, gpus, config));

  return TrainSummary{last_step, history.empty() ? 0.0 : history.back().loss, spec.output_dir};
}

}  // namespace loom
