#include "train/trainer.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
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
#include "io/peft_adapter.h"
#include "model/lora.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "recipe/rules.h"
#include "train/checkpoint_policy.h"
#include "train/cuda_device.h"
#include "train/engine.h"
#include "train/eval.h"
#include "train/metrics.h"
#include "train/nonfinite.h"
#include "train/rank_setup.h"
#include "train/reference_check.h"
#include "train/resume.h"
#include "train/rows.h"
#include "train/run_outputs.h"
#include "train/train_step.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

ModelConfig run_config(const Recipe& r) {
  if (!r.train.init_hf_checkpoint.empty()) return hf_checkpoint_read_config(r.train.init_hf_checkpoint);
  return model_config_load(r.train.init_random_config);
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
  options.activation_offload = r.layout.activation_offload;
  options.layer_split = r.layout.layer_split;
  options.context_comm = r.layout.cp_comm == "ring" ? ContextComm::ring : ContextComm::all_gather;
  options.comm_timeout = recipe_comm_timeout(r);
  if (r.workload.precision == "fp8") {
    options.linear_precision.fp8 = true;
    options.linear_precision.gradient_format = r.workload.fp8.gradients == "e4m3" ? DType::e4m3 : DType::e5m2;
    options.linear_precision.bf16_first_layers = r.workload.fp8.bf16_first_layers;
    options.linear_precision.bf16_last_layers = r.workload.fp8.bf16_last_layers;
    options.linear_precision.scaling =
        r.workload.fp8.scaling == "block" ? Fp8Scaling::block : Fp8Scaling::tensor;
  }
  options.moe_aux_loss = moe_aux_loss_from(r.workload.moe_aux_loss.kind, r.workload.moe_aux_loss.coef);
  return options;
}

// The model's initial weights as a source of flat ranges laid out by `table`: the HF
// checkpoint is validated here, its values read as the engine asks for them.
std::unique_ptr<ParamSource> initial_weights(const TrainSpec& spec, const ModelConfig& config,
                                             const ParamTable& table) {
  if (!spec.init_hf_checkpoint.empty())
    return hf_checkpoint_open_params(spec.init_hf_checkpoint, config, table);
  return std::make_unique<RandomInitSource>(config, table, spec.seed);
}

// LoRA's initial adapters: train.lora.init.adapter's folder, which must describe the recipe's
// adapters, else PEFT's default init from train.seed.
std::unique_ptr<ParamSource> initial_adapters(const Recipe& recipe, const LoraConfig& lora,
                                              const ParamTable& adapters) {
  const LoraSpec& spec = recipe.train.lora;
  if (spec.init_adapter.empty()) return std::make_unique<LoraInitSource>(adapters, recipe.train.seed);
  const PeftAdapterConfig found = peft_adapter_read_config(spec.init_adapter);
  auto differ = [&](const std::string& what, const std::string& theirs, const std::string& ours) {
    throw_input_error(recipe.path, "train.lora.init.adapter: " + spec.init_adapter +
                                       "/adapter_config.json has " + what + " " + theirs +
                                       ", expected the recipe's " + ours);
  };
  if (found.lora.rank != lora.rank)
    differ("r =", std::to_string(found.lora.rank), "train.lora.rank = " + std::to_string(lora.rank));
  if (found.lora.alpha != lora.alpha)
    differ("lora_alpha =", std::to_string(found.lora.alpha),
           "train.lora.alpha = " + std::to_string(lora.alpha));
  if (found.lora.rslora != lora.rslora)
    differ("use_rslora =", found.lora.rslora ? "true" : "false",
           std::string("train.lora.rslora = ") + (lora.rslora ? "true" : "false"));
  if (found.lora.targets != lora.targets) {
    auto names = [](const LoraConfig& l) {
      std::string out;
      for (int i = 0; i < kLoraTargets; ++i)
        if (l.targets[static_cast<size_t>(i)])
          out += (out.empty() ? "" : " ") + std::string(lora_target_module(static_cast<LoraTarget>(i)));
      return "[" + out + "]";
    };
    differ("target_modules", names(found.lora), "train.lora.targets " + names(lora));
  }
  return peft_adapter_open(spec.init_adapter, adapters);
}

// What this run measured, for result.yaml's result block (train/metrics.h).
RunResult run_result(const Recipe& r, const WindowResult& w, double gpu_hours, int64_t steps_run,
                     const ModelConfig& config) {
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

StepSpec step_spec(const Recipe& r, const Groups& groups) {
  StepSpec spec;
  spec.global_batch = r.workload.global_batch;
  spec.max_tokens_per_gpu = r.layout.max_tokens_per_gpu;
  spec.cp = static_cast<int>(r.layout.cp);
  spec.cp_rank = groups.coords.cp;
  spec.dp = static_cast<int>(r.layout.dp);
  spec.dp_rank = groups.coords.dp;
  spec.ep = static_cast<int>(r.layout.ep);
  const OptimizerSpec& o = r.train.optimizer;
  spec.adam = AdamWConfig{static_cast<float>(o.beta1), static_cast<float>(o.beta2), static_cast<float>(o.eps),
                          static_cast<float>(o.weight_decay)};
  spec.clip_grad = o.clip_grad;
  spec.routing_census = r.model_config.num_experts > 0;
  spec.aux_loss = moe_aux_loss_from(r.workload.moe_aux_loss.kind, r.workload.moe_aux_loss.coef);
  if (r.train.lora.enabled()) spec.lora_dropout = r.train.lora.dropout;
  spec.seed = r.train.seed;
  return spec;
}

StepMetrics step_metrics(int64_t step, const StepResult& result, double lr, int64_t tokens, double step_time,
                         int64_t gpus, int64_t mfu_n, const ModelConfig& config, const TrainEngine& engine) {
  StepMetrics m;
  m.step = step;
  m.loss = result.loss;
  m.skipped = result.skipped;
  m.no_targets = result.no_targets;
  m.grad_norm = result.grad_norm;
  m.lr = lr;
  m.tokens = tokens;
  m.step_time_s = step_time;
  m.tokens_per_s_per_gpu = static_cast<double>(m.tokens) / step_time / static_cast<double>(gpus);
  m.mfu = mfu_from_throughput(mfu_n, m.tokens_per_s_per_gpu);
  m.max_mem_gib = static_cast<double>(engine.peak_bytes()) / (1024.0 * 1024.0 * 1024.0);
  const RoutingStats& routing = result.routing;
  if (routing.aux_loss_terms > 0)
    m.aux_loss = routing.aux_loss_sum / static_cast<double>(routing.aux_loss_terms);
  const std::vector<int64_t> sparse = config.sparse_layer_numbers();
  for (size_t i = 0; i < routing.expert_tokens.size(); ++i)
    m.experts.push_back({sparse[i], expert_load(routing.expert_tokens[i])});
  return m;
}

// The steps' stop requests (g_stop_requested) count from here until stop_signals_restore, after
// the last step: a signal then ends the process, as before the run.
void stop_signals_install() {
  g_stop_requested = false;
  std::signal(SIGTERM, train_request_stop);
  std::signal(SIGINT, train_request_stop);
}

void stop_signals_restore() {
  std::signal(SIGTERM, SIG_DFL);
  std::signal(SIGINT, SIG_DFL);
}

// Whether any rank was asked to stop: a stop must be every rank's decision, or the others would
// wait in the next step.
bool stop_vote(Comm& world, CommTimeout timeout) {
  int32_t stop_requested = g_stop_requested ? 1 : 0;
  world.all_reduce_sum(&stop_requested, 1, DType::i32, timeout);
  return stop_requested > 0;
}

std::optional<RowSet> eval_rows_load(const Recipe& recipe, const ModelConfig& config) {
  const TrainSpec& spec = recipe.train;
  if (spec.eval_path.empty()) return std::nullopt;
  if (!fs::exists(spec.eval_path))
    throw_input_error(recipe.path, "train.eval.data.path: " + spec.eval_path +
                                       " does not exist (expected a row store folder or a .jsonl of rows)");
  return rows_load(spec.eval_path, recipe.workload.row_tokens, config.vocab_size, spec.init_hf_checkpoint);
}

// What the steps of a run use, made in the order the run needs it: the data first (a bad rows
// file fails before any weights are read), the engine from the initial weights, then the resume
// from the latest complete checkpoint (train/resume.h), of which every rank reads its slices.
// Not movable: the engine holds the table.
struct Run {
  Run(const Recipe& recipe, const TrainOptions& options, Groups& groups, bool say);
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  const ModelConfig config;
  const LoraConfig lora;   // train.lora; disabled for full fine-tuning
  const ParamTable base;   // the model's tensors
  const ParamTable table;  // what the engine trains: the model's tensors, or LoRA's adapters
  const RowSet data;
  const std::optional<RowSet> eval_data;
  LrSchedule schedule;
  RunIdentity identity;
  std::unique_ptr<TrainEngine> engine;
  NonfiniteGuard nonfinite;
  std::optional<int64_t> resumed;  // the checkpoint's step
};

Run::Run(const Recipe& recipe, const TrainOptions& options, Groups& groups, bool say)
    : config(run_config(recipe)),
      lora(lora_config_of(recipe.train.lora)),
      base(param_table_build(config)),
      table(lora.enabled() ? lora_table_build(config, lora) : base),
      data(rows_load(recipe.train.data_path, recipe.workload.row_tokens, config.vocab_size,
                     recipe.train.init_hf_checkpoint)),
      eval_data(eval_rows_load(recipe, config)),
      schedule{recipe.train.optimizer.lr,    recipe.train.optimizer.min_lr,
               recipe.train.optimizer.decay, recipe.train.optimizer.warmup_fraction,
               recipe.train.steps,           recipe.workload.global_batch},
      identity(recipe, data, groups.world->rank() == 0),
      nonfinite(recipe.train.on_nonfinite, recipe.train.max_consecutive_skips, groups.world->rank()) {
  const TrainSpec& spec = recipe.train;
  // The initial weights (with LoRA, the frozen base's) and, with LoRA, the adapters'.
  std::unique_ptr<ParamSource> weights = initial_weights(spec, config, base);
  std::unique_ptr<ParamSource> adapters = lora.enabled() ? initial_adapters(recipe, lora, table) : nullptr;
  const FrozenBase frozen{&base, weights.get(), lora};
  schedule.validate();
  EngineOptions engine_opts = engine_options(recipe);
  engine_opts.attention_backward_by_row = options.attention_backward_by_row;
  const EngineDevice device = spec.device == "cuda" ? EngineDevice::cuda : EngineDevice::cpu;
  engine = engine_create(config, table, adapters ? *adapters : *weights, device, engine_opts, &groups,
                         options.device_groups, lora.enabled() ? &frozen : nullptr);
  weights.reset();  // unmaps the checkpoint
  if (say && lora.enabled())
    std::fprintf(stderr, "loom: LoRA rank %lld, %lld adapter parameters trained over a frozen base of %lld\n",
                 static_cast<long long>(lora.rank), static_cast<long long>(table.total_numel),
                 static_cast<long long>(base.total_numel));
  if (groups.world->rank() == 0) fs::create_directories(spec.output_dir);
  resumed = resume_latest(spec.output_dir, spec.steps, identity, table, *engine, nonfinite, say);
}

// final/ and result.yaml (world rank 0), once every step has run.
TrainSummary run_finish(const Recipe& recipe, const Run& run, const RunOutputs& outputs, int64_t last_step,
                        int64_t gpus, bool say) {
  const TrainSpec& spec = recipe.train;
  const std::vector<StepMetrics>& history = outputs.history();
  TrainSummary summary{last_step, history.empty() ? 0.0 : history.back().loss, spec.output_dir};
  // Read a tensor piece at a time (a GPU store's from the GPU and the pinned offloaded
  // state, a layout of several ranks' from the ranks holding each piece); the source lives
  // until the save returns, then lets the other ranks go.
  const std::string final_dir = (fs::path(spec.output_dir) / "final").string();
  if (!run.lora.enabled()) {
    hf_checkpoint_save(final_dir, run.config, run.table, *run.engine->master_source(),
                       run.engine->export_dtype(), 0);
  } else {
    // A PEFT adapter folder of the fp32 masters (a few hundred MB at most: held on rank 0 for
    // the merge too), then with merge the base with them merged in, in the base's dtype.
    std::vector<float> adapters(static_cast<size_t>(run.table.total_numel));
    run.engine->master_source()->read(0, run.table.total_numel, adapters.data());
    ArrayParamSource values(adapters);
    peft_adapter_save(final_dir, run.lora, spec.init_hf_checkpoint, run.table, values, DType::f32);
    if (spec.lora.merge) {
      std::unique_ptr<ParamSource> weights = initial_weights(spec, run.config, run.base);
      std::unique_ptr<ParamSource> merged =
          lora_merged_source(run.config, run.base, *weights, run.lora, run.table, adapters);
      hf_checkpoint_save((fs::path(final_dir) / "merged").string(), run.config, run.base, *merged,
                         run.config.dtype == "float32" ? DType::f32 : DType::bf16, 0);
    }
  }

  // The result block over the recipe's window, clamped to the steps this run made.
  const int64_t first = std::min(recipe.window_first, last_step);
  const int64_t last = std::min(recipe.window_last, last_step);
  const WindowResult window = window_measure(history, first, last, gpus, mfu_params(run.config, run.lora));
  RunResult result =
      run_result(recipe, window, gpu_hours_from(gpus, process_elapsed_s()), last_step, run.config);
  result.eval = outputs.last_eval();
  result.eval_time_s = outputs.eval_time_s();
  std::optional<ReferenceCheck> check;
  if (!spec.reference_recipe.empty()) check = reference_check_run(recipe, outputs.metrics_path());
  file_write_atomic((fs::path(spec.output_dir) / "result.yaml").string(), result_yaml(recipe, result, check));
  if (say) std::fprintf(stderr, "loom: %s\n", result_summary_line(result).c_str());
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
  Run run(recipe, options, groups, say);
  TrainEngine& engine = *run.engine;
  const int64_t first_step = run.resumed ? *run.resumed + 1 : 1;
  const int64_t last_step =
      options.stop_at_step > 0 ? std::min(options.stop_at_step, spec.steps) : spec.steps;
  // Rank 0 may clean up incomplete checkpoints from here on: the others have read theirs.
  world.barrier(timeout);
  // fp8_stats.jsonl: the FP8 casts' census (model/linear.h Fp8Stats), on FP8 runs that ask for it.
  const bool fp8_stats_on = recipe.workload.precision == "fp8" && spec.fp8_stats_every > 0;
  RunOutputs outputs(
      {spec.output_dir, writer, fp8_stats_on, run.resumed, say ? stderr : nullptr, spec.steps, last_step});
  CheckpointPolicy checkpoints(
      {spec.output_dir, spec.checkpoint_every, spec.checkpoint_keep, spec.checkpoint_keep_best, spec.steps,
       last_step, writer, options.faults.checkpoint_delay_ms},
      run.table);
  // keep_best: a resumed run finds its best checkpoint again among the kept eval records.
  if (run.resumed) checkpoints.resume(outputs.metrics_path());
  stop_signals_install();
  const int64_t gpus = world.size();
  // A step's tokens: every token of the global batch.
  const int64_t tokens = recipe.workload.global_batch * run.data.row_tokens;
  const StepSpec settings = step_spec(recipe, groups);
  const int64_t mfu_n = mfu_params(run.config, run.lora);  // LoRA's frozen base does 4 · N a token
  // Test hook (TrainFaults::hang_rank): this rank stops taking part after its first step.
  const bool hangs = world.size() > 1 && options.faults.hang_rank == world.rank();
  // train.eval: at step 0 before any update (a resumed run has it already), every eval_every
  // steps and after the last; outside the steps' timing.
  auto evaluate = [&](int64_t step) {
    outputs.eval(eval_run(engine, *run.eval_data, spec.eval_max_rows, settings, step));
  };
  if (run.eval_data && first_step == 1) evaluate(0);
  int64_t step_done = first_step - 1;
  for (int64_t step = first_step; step <= last_step; ++step) {
    if (hangs && step > first_step)
      for (;;) ::pause();
    // train.fp8_stats_every: step 1 and every that many steps count the FP8 casts.
    const bool census = fp8_stats_on && (step == 1 || step % spec.fp8_stats_every == 0);
    const auto start = Clock::now();
    const double lr = run.schedule.lr_at(step);
    if (census) engine.fp8_census_begin();
    // The step's loss, grad norm and update (train/train_step.h); step_time is its wall time.
    const StepResult result =
        train_step(engine, run.data, step, static_cast<float>(lr), settings, &run.nonfinite, run.table);
    const double step_time = std::chrono::duration<double>(Clock::now() - start).count();
    std::optional<Fp8Stats> fp8;
    if (census) fp8 = engine.fp8_census_end();
    outputs.step(step_metrics(step, result, lr, tokens, step_time, gpus, mfu_n, run.config, engine), fp8);
    step_done = step;
    if (run.eval_data && (step % spec.eval_every == 0 || step == spec.steps)) evaluate(step);
    // SIGTERM / SIGINT on any rank: every rank finishes this step, checkpoints it and stops.
    const bool stop = stop_vote(world, timeout);
    checkpoints.after_step(step, stop, outputs.last_eval(), engine, run.identity, run.nonfinite);
    if (stop) break;
  }
  outputs.finish();
  checkpoints.wait();
  stop_signals_restore();
  const double final_loss = outputs.history().empty() ? 0.0 : outputs.history().back().loss;
  if (step_done < spec.steps) {
    if (say)
      std::fprintf(stderr,
                   "loom: stopped after step %lld of %lld with a checkpoint; the same command resumes\n",
                   static_cast<long long>(step_done), static_cast<long long>(spec.steps));
    return TrainSummary{step_done, final_loss, spec.output_dir};
  }
  if (!writer) {
    // Rank 0 writes final/ from every rank's shard: this rank answers its reads.
    engine.state_serve();
    return TrainSummary{last_step, final_loss, spec.output_dir};
  }
  return run_finish(recipe, run, outputs, last_step, gpus, say);
}

}  // namespace loom
