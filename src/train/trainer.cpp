#include "train/trainer.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/allocator.h"
#include "core/env.h"
#include "core/error.h"
#include "core/fp8.h"
#include "io/file_output.h"
#include "io/hf_checkpoint.h"
#include "io/init.h"
#include "io/tensorboard.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "recipe/rules.h"
#include "train/engine.h"
#include "train/eval.h"
#include "train/metrics.h"
#include "train/nonfinite.h"
#include "train/rank_setup.h"
#include "train/reference_check.h"
#include "train/resume.h"
#include "train/rows.h"
#include "train/train_step.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

Qwen3Config run_config(const Recipe& r) {
  if (!r.train.init_hf_checkpoint.empty()) return hf_checkpoint_read_config(r.train.init_hf_checkpoint);
  return qwen3_config_load(r.train.init_random_config);
}

// layout.recompute and the rest of the layout an engine needs.
EngineOptions engine_options(const Recipe& r) {
  EngineOptions options;
  const RecomputeSpec& spec = r.layout.recompute;
  if (spec.enabled) {
    options.recompute.granularity = spec.granularity == "selective" ? RecomputePolicy::Granularity::selective
                                                                    : RecomputePolicy::Granularity::full;
    options.recompute.block = spec.method == "block";
    options.recompute.num_layers = spec.num_layers;
  }
  if (r.layout.offload.enabled)
    options.offload = {r.layout.offload.optimizer_fraction, r.layout.offload.overlap};
  options.sequence_parallel = r.layout.sequence_parallel;
  options.layer_split = r.layout.layer_split;
  options.comm_timeout = recipe_comm_timeout(r);
  if (r.workload.precision == "fp8") {
    options.linear_precision.fp8 = true;
    options.linear_precision.gradient_format = r.workload.fp8.gradients == "e4m3" ? DType::e4m3 : DType::e5m2;
    options.linear_precision.bf16_first_layers = r.workload.fp8.bf16_first_layers;
    options.linear_precision.bf16_last_layers = r.workload.fp8.bf16_last_layers;
    options.linear_precision.scaling =
        r.workload.fp8.scaling == "block" ? Fp8Scaling::block : Fp8Scaling::tensor;
  }
  return options;
}

// What this run measured, for result.yaml's result block (train/metrics.h).
RunResult run_result(const Recipe& r, const WindowResult& w, double gpu_hours, int64_t steps_run,
                     const Qwen3Config& config) {
  RunResult run;
  run.window = w;
  run.steps_run = steps_run;
  run.active_params = config.matmul_params();
  run.active_params_source = !r.train.init_hf_checkpoint.empty()
                                 ? (fs::path(r.train.init_hf_checkpoint) / "config.json").string()
                                 : r.train.init_random_config;
  run.gpu_hours = gpu_hours;
  run.price = gpu_price(r.gpu_instance, r.usd_per_gpu_hour);
  // The CUDA engine's op profile (ops/cuda/cuda_ops.h) records events around every op.
  run.profiler = r.train.device == "cuda" && env_flag("LOOM_OP_PROFILE");
  run.precision = r.workload.precision;
  if (r.train.device == "cpu")
    run.mfu_note =
        "train.device cpu: the MFU divides by the H100/H200 dense bf16 peak (989e12 FLOP/s), not this "
        "CPU's";
  else if (r.workload.precision == "fp8")
    run.mfu_note =
        "workload.precision fp8: the MFU divides by the dense bf16 peak (989e12 FLOP/s) as bf16 runs do, so "
        "that precisions compare";
  return run;
}

// The recipe with its result block (and, with a reference run, its correctness block)
// filled, its relative paths rewritten for output_dir.
std::string result_yaml(const Recipe& r, const RunResult& run, const std::optional<ReferenceCheck>& check) {
  const YAML::Node moved =
      recipe_document_moved(r.document, fs::path(r.path).parent_path().string(), r.train.output_dir);
  YAML::Node document = result_document(moved, run);
  if (check) document["correctness"] = check->block;
  return recipe_document_to_yaml(document);
}

// SIGTERM / SIGINT ask the run to finish its step, checkpoint and exit 0. A signal handler
// can only reach process-wide state; this flag is the one such variable of the trainer.
std::atomic<bool> g_stop_requested{false};
extern "C" void train_request_stop(int) {
  g_stop_requested = true;
}

}  // namespace

void train_check_supported(const Recipe& r) {
  RuleCapabilities capabilities;
  if (r.train.device == "cuda")
    capabilities.cuda_engine = cuda_engine_available(&capabilities.cuda_engine_why);
  recipe_refuse(r, recipe_rules(r, &r.model_config, capabilities));
}

namespace {

// The outputs only world rank 0 writes: metrics.jsonl (a log, a line per finished step,
// flushed, so a stopped run keeps them), fp8_stats.jsonl (the FP8 statistics' steps, the
// same way), TensorBoard and the checkpoints.
struct RunOutputs {
  std::string metrics_path, fp8_stats_path;
  std::optional<CheckpointWriter> checkpoints;
  std::ofstream metrics, fp8_stats;
  std::optional<TensorBoardWriter> tensorboard;
};

// A .jsonl log of step records cut back to the step a resume starts after (a run killed
// after it may have logged steps that will now run again), or emptied for a fresh run; the
// kept lines are kept byte for byte.
void jsonl_restart(const std::string& path, std::optional<int64_t> resumed) {
  if (!fs::exists(path)) return;
  std::string text;
  if (resumed) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("step") && j.at("step").is_number_integer() &&
          j.at("step").get<int64_t>() <= *resumed)
        text += line + "\n";
    }
  }
  file_write_atomic(path, text);
}

// metrics.jsonl restarted so (step and eval records alike); returns the kept steps.
std::vector<StepMetrics> metrics_restart(const std::string& path, std::optional<int64_t> resumed) {
  if (!fs::exists(path)) return {};
  if (resumed) metrics_read_jsonl(path);  // refuses a malformed file, naming the line
  jsonl_restart(path, resumed);
  return resumed ? metrics_read_jsonl(path) : std::vector<StepMetrics>{};
}

void outputs_open(RunOutputs& out, const TrainSpec& spec, const ParamTable& table) {
  out.checkpoints.emplace(spec.output_dir, table, spec.checkpoint_keep);
  out.metrics.open(out.metrics_path, std::ios::app);
  if (!out.metrics) throw_runtime_failure(out.metrics_path, "cannot write");
  if (!out.fp8_stats_path.empty()) {
    out.fp8_stats.open(out.fp8_stats_path, std::ios::app);
    if (!out.fp8_stats) throw_runtime_failure(out.fp8_stats_path, "cannot write");
  }
  out.tensorboard.emplace((fs::path(spec.output_dir) / "tensorboard").string());
}

StepSpec step_spec(const Recipe& r, const Groups& groups) {
  StepSpec spec;
  spec.global_batch = r.workload.global_batch;
  spec.max_tokens_per_gpu = r.layout.max_tokens_per_gpu;
  spec.cp = static_cast<int>(r.layout.cp);
  spec.dp = static_cast<int>(r.layout.dp);
  spec.dp_rank = groups.coords.dp;
  const OptimizerSpec& o = r.train.optimizer;
  spec.adam = AdamWConfig{static_cast<float>(o.beta1), static_cast<float>(o.beta2), static_cast<float>(o.eps),
                          static_cast<float>(o.weight_decay)};
  spec.clip_grad = o.clip_grad;
  return spec;
}

StepMetrics step_metrics(int64_t step, const StepResult& result, double lr, int64_t tokens, double step_time,
                         int64_t gpus, const Qwen3Config& config, const TrainEngine& engine) {
  StepMetrics m;
  m.step = step;
  m.loss = result.loss;
  m.skipped = result.skipped;
  m.grad_norm = result.grad_norm;
  m.lr = lr;
  m.tokens = tokens;
  m.step_time_s = step_time;
  m.tokens_per_s_per_gpu = static_cast<double>(m.tokens) / step_time / static_cast<double>(gpus);
  m.mfu = mfu_from_throughput(config.matmul_params(), m.tokens_per_s_per_gpu);
  m.max_mem_gib = static_cast<double>(engine.peak_bytes()) / (1024.0 * 1024.0 * 1024.0);
  return m;
}

// final/ and result.yaml (world rank 0), once every step has run.
TrainSummary run_finish(const Recipe& recipe, const Qwen3Config& config, const ParamTable& table,
                        TrainEngine& engine, const std::vector<StepMetrics>& history, int64_t last_step,
                        int64_t gpus, const std::string& metrics_path, bool say,
                        const std::optional<EvalMetrics>& last_eval, double eval_time_s) {
  const TrainSpec& spec = recipe.train;
  TrainSummary summary{last_step, history.empty() ? 0.0 : history.back().loss, spec.output_dir};
  // Read a tensor piece at a time (a GPU store's from the GPU and the pinned offloaded
  // state, a layout of several ranks' from the ranks holding each piece); the source lives
  // until the save returns, then lets the other ranks go.
  hf_checkpoint_save((fs::path(spec.output_dir) / "final").string(), config, table, *engine.master_source(),
                     engine.export_dtype(), 0);

  // The result block over the recipe's window, clamped to the steps this run made.
  const int64_t first = std::min(recipe.window_first, last_step);
  const int64_t last = std::min(recipe.window_last, last_step);
  const WindowResult window = window_measure(history, first, last, gpus, config.matmul_params());
  RunResult run = run_result(recipe, window, gpu_hours_from(gpus, process_elapsed_s()), last_step, config);
  run.eval = last_eval;
  run.eval_time_s = eval_time_s;
  std::optional<ReferenceCheck> check;
  if (!spec.reference_recipe.empty()) check = reference_check_run(recipe, metrics_path);
  file_write_atomic((fs::path(spec.output_dir) / "result.yaml").string(), result_yaml(recipe, run, check));
  if (say) std::fprintf(stderr, "loom: %s\n", result_summary_line(run).c_str());
  if (check && say) std::fprintf(stderr, "loom: correctness: %s\n", check->summary.c_str());
  summary.correctness_failed = check && !check->passed;
  return summary;
}

}  // namespace

TrainSummary train_run(const Recipe& recipe, const TrainOptions& options) {
  train_check_supported(recipe);
  const CommTimeout timeout = recipe_comm_timeout(recipe);
  // A caller without groups (one rank: the tests, a world of one) runs in the world of one
  // that rank_setup would make.
  const std::unique_ptr<SingleRankGroups> single = options.groups ? nullptr : single_rank_groups(timeout);
  Groups& groups = options.groups ? *options.groups : single->groups;
  Comm& world = *groups.world;
  // rank_setup's world_check has said this to a launched rank; a caller that builds its own
  // groups (the tests) is told here.
  const int64_t ranks = recipe.layout.world_size();
  if (ranks != world.size())
    throw_input_error(recipe.path, "layout: tp·pp·cp·dp = " + std::to_string(ranks) + ", but the run has " +
                                       std::to_string(world.size()) + " rank(s) (expected --nproc " +
                                       std::to_string(ranks) + ")");
  // Rank 0 writes and prints; the other ranks compute and take part in the collectives.
  const bool writer = world.rank() == 0;
  const bool say = options.progress && writer;
  const TrainSpec& spec = recipe.train;
  const Qwen3Config config = run_config(recipe);
  const ParamTable table = param_table_build(config);

  // Data first: a bad rows file should fail before any weights are read.
  const RowSet data =
      rows_load(spec.data_path, recipe.workload.row_tokens, config.vocab_size, spec.init_hf_checkpoint);
  std::optional<RowSet> eval_data;
  if (!spec.eval_path.empty()) {
    if (!fs::exists(spec.eval_path))
      throw_input_error(recipe.path, "train.eval.data.path: " + spec.eval_path +
                                         " does not exist (expected a row store folder or a .jsonl of rows)");
    eval_data =
        rows_load(spec.eval_path, recipe.workload.row_tokens, config.vocab_size, spec.init_hf_checkpoint);
  }

  // The initial weights as a source of flat ranges: the HF checkpoint is validated here, but
  // its values (or the random ones) are read as the engine asks for them.
  std::unique_ptr<ParamSource> initial;
  if (!spec.init_hf_checkpoint.empty())
    initial = hf_checkpoint_open_params(spec.init_hf_checkpoint, config, table);
  else
    initial = std::make_unique<RandomInitSource>(config, table, spec.seed);

  LrSchedule schedule{spec.optimizer.lr,    spec.optimizer.min_lr,
                      spec.optimizer.decay, spec.optimizer.warmup_fraction,
                      spec.steps,           recipe.workload.global_batch};
  schedule.validate();

  const nlohmann::json identity = run_identity(recipe, data);
  EngineOptions engine_opts = engine_options(recipe);
  engine_opts.attention_backward_by_row = options.attention_backward_by_row;
  const EngineDevice device = spec.device == "cuda" ? EngineDevice::cuda : EngineDevice::cpu;
  std::unique_ptr<TrainEngine> engine =
      engine_create(config, table, *initial, device, engine_opts, &groups, options.device_groups);
  initial.reset();  // unmaps the checkpoint
  if (writer) fs::create_directories(spec.output_dir);
  NonfiniteGuard nonfinite(spec.on_nonfinite, spec.max_consecutive_skips, world.rank());

  // Resume from the latest complete checkpoint (train/resume.h): its state, and the metrics
  // logged up to its step. Every rank reads the checkpoint and takes its slices.
  RunOutputs out;
  out.metrics_path = (fs::path(spec.output_dir) / "metrics.jsonl").string();
  const std::optional<int64_t> resumed =
      resume_latest(spec.output_dir, spec.steps, identity, table, *engine, nonfinite, say);
  const int64_t first_step = resumed ? *resumed + 1 : 1;
  // Rank 0 may clean up incomplete checkpoints from here on: the others have read theirs.
  world.barrier(timeout);
  std::vector<StepMetrics> history;
  // train.fp8_stats_every: step 1 and every that many steps count the FP8 casts.
  const bool fp8_stats_on = recipe.workload.precision == "fp8" && spec.fp8_stats_every > 0;
  if (writer) {
    history = metrics_restart(out.metrics_path, resumed);
    if (fp8_stats_on) {
      out.fp8_stats_path = (fs::path(spec.output_dir) / "fp8_stats.jsonl").string();
      jsonl_restart(out.fp8_stats_path, resumed);
    }
    outputs_open(out, spec, table);
  }

  g_stop_requested = false;
  std::signal(SIGTERM, train_request_stop);
  std::signal(SIGINT, train_request_stop);
  const int64_t gpus = world.size();
  const int64_t last_step =
      options.stop_at_step > 0 ? std::min(options.stop_at_step, spec.steps) : spec.steps;
  const StepSpec settings = step_spec(recipe, groups);
  double elapsed_steps_s = 0;
  std::optional<ProgressPrinter> progress;
  if (say) progress.emplace(stderr, spec.steps);

  // Test hook: LOOM_TEST_HANG_RANK=R makes rank R of a parallel run stop taking part after
  // its first step, so that tests see the others time out in a collective of the next one.
  const char* hang = std::getenv("LOOM_TEST_HANG_RANK");
  const bool hangs = world.size() > 1 && hang && std::atoi(hang) == world.rank();
  // train.eval: at step 0 before any update (a resumed run has it already), every
  // eval_every steps and after the last; outside the steps' timing.
  std::optional<EvalMetrics> last_eval;
  double eval_time_s = 0;
  auto evaluate = [&](int64_t step) {
    if (!eval_data) return;
    EvalMetrics e = eval_run(*engine, *eval_data, spec.eval_max_rows, settings, step);
    eval_time_s += e.eval_time_s;
    if (writer) {
      out.metrics << eval_metrics_to_json(e) << "\n" << std::flush;
      if (!out.metrics) throw_runtime_failure(out.metrics_path, "write failed");
      eval_metrics_to_tensorboard(e, *out.tensorboard);
    }
    if (progress) progress->line(eval_progress_line(e));
    last_eval = e;
  };
  // keep_best: the lowest eval loss at a checkpointed step so far; a resumed run finds it
  // among the kept records and checkpoints.
  std::optional<EvalMetrics> best_eval;
  if (writer && resumed && spec.checkpoint_keep_best) {
    const std::vector<CheckpointRef> kept = checkpoint_list(spec.output_dir);
    for (const EvalMetrics& e : eval_metrics_read_jsonl(out.metrics_path))
      for (const CheckpointRef& c : kept)
        if (c.step == e.step && (!best_eval || e.eval_loss < best_eval->eval_loss)) best_eval = e;
    if (best_eval) out.checkpoints->set_also_keep(best_eval->step);
  }
  if (first_step == 1) evaluate(0);
  int64_t step_done = first_step - 1;
  for (int64_t step = first_step; step <= last_step; ++step) {
    if (hangs && step > first_step)
      for (;;) ::pause();
    const bool counts_fp8 = fp8_stats_on && (step == 1 || step % spec.fp8_stats_every == 0);
    const auto start = Clock::now();
    const double lr = schedule.lr_at(step);
    if (counts_fp8) engine->fp8_census_begin();
    const StepResult result =
        train_step(*engine, data, step, static_cast<float>(lr), settings, &nonfinite, table);
    const double step_time = std::chrono::duration<double>(Clock::now() - start).count();
    std::optional<Fp8Stats> fp8_stats;
    if (counts_fp8) fp8_stats = engine->fp8_census_end();
    if (fp8_stats && writer) {
      out.fp8_stats << fp8_stats_to_json(step, *fp8_stats) << "\n" << std::flush;
      if (!out.fp8_stats) throw_runtime_failure(out.fp8_stats_path, "write failed");
      fp8_stats_to_tensorboard(step, *fp8_stats, *out.tensorboard);
    }
    const StepMetrics m = step_metrics(step, result, lr, recipe.workload.global_batch * data.row_tokens,
                                       step_time, gpus, config, *engine);
    if (writer) {
      out.metrics << metrics_to_json(m) << "\n" << std::flush;
      if (!out.metrics) throw_runtime_failure(out.metrics_path, "write failed");
      metrics_to_tensorboard(m, *out.tensorboard);
    }
    history.push_back(m);
    elapsed_steps_s += step_time;
    if (progress)
      progress->step(m, elapsed_steps_s / static_cast<double>(step) * static_cast<double>(last_step - step));
    if (progress && fp8_stats) progress->line(fp8_stats_progress_line(step, *fp8_stats));
    step_done = step;
    if (eval_data && (step % spec.eval_every == 0 || step == spec.steps)) evaluate(step);
    // A stop must be every rank's decision, or the others would wait in the next step.
    int32_t stop_requested = g_stop_requested ? 1 : 0;
    world.all_reduce_sum(&stop_requested, 1, DType::i32, timeout);
    const bool stopping = stop_requested > 0 || (step == last_step && last_step < spec.steps);
    const bool periodic = spec.checkpoint_every > 0 && step % spec.checkpoint_every == 0 && step < spec.steps;
    if (out.checkpoints) out.checkpoints->rethrow_failure();
    if ((stopping || periodic) && out.checkpoints) {
      // keep_best: this checkpoint is the one to keep when its step's eval is the lowest so far.
      if (spec.checkpoint_keep_best && last_eval && last_eval->step == step &&
          (!best_eval || last_eval->eval_loss < best_eval->eval_loss)) {
        best_eval = last_eval;
        out.checkpoints->set_also_keep(step);
      }
      checkpoint_save(*out.checkpoints, step, *engine, identity, nonfinite);
    } else if (stopping || periodic) {
      // Rank 0 streams the checkpoint from every rank's shard: this rank answers its reads.
      engine->state_serve();
    }
    if (stop_requested > 0) break;
  }
  if (progress) progress->finish();
  if (out.checkpoints) out.checkpoints->wait();
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
  if (step_done < spec.steps) {
    if (say)
      std::fprintf(stderr,
                   "loom: stopped after step %lld of %lld with a checkpoint; the same command resumes\n",
                   static_cast<long long>(step_done), static_cast<long long>(spec.steps));
    return TrainSummary{step_done, history.empty() ? 0.0 : history.back().loss, spec.output_dir};
  }
  if (!writer) {
    // Rank 0 writes final/ from every rank's shard: this rank answers its reads.
    engine->state_serve();
    return TrainSummary{last_step, history.empty() ? 0.0 : history.back().loss, spec.output_dir};
  }
  return run_finish(recipe, config, table, *engine, history, last_step, gpus, out.metrics_path, say,
                    last_eval, eval_time_s);
}

}  // namespace loom
