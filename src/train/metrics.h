// Per-step metrics (metrics.jsonl, the progress line) and the measured result over a window
// of steps (docs/numerics.md "Metrics"), written into result.yaml's result block.
//
// Definitions (docs/recipes.md, "Measurement"):
//   tokens/s/GPU     = window tokens / window wall time / GPUs, the wall time being the sum
//                      of the window's step times
//   MFU              = 6 · N · tokens/s/GPU / 989e12, N = ModelConfig::matmul_params()
//                      (matmul weights incl. lm_head, excl. norms and the input embedding)
//   $ / 1M tokens    = usd_per_gpu_hour / 3600 / tokens/s/GPU · 10^6 (recipe/price_table.h)
//   step-time CV     = population standard deviation / mean of the window's step times
//                      (divides by n, not n − 1), in percent in the result block
//   GPU-hours        = GPUs · (process launch to finish, start-up included) / 3600
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "io/tensorboard.h"
#include "model/linear.h"
#include "model/routing.h"
#include "recipe/price_table.h"

namespace loom {

// H100/H200 dense bf16 peak, the MFU denominator the seed uses.
constexpr double kPeakFlopsPerGpu = 989e12;

struct StepMetrics {
  int64_t step = 0;  // from 1
  double loss = 0;
  double grad_norm = 0;  // before clipping
  double lr = 0;
  int64_t tokens = 0;  // every token of the global batch
  double step_time_s = 0;
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;
  double max_mem_gib = 0;
  // The optimizer update was skipped: a non-finite loss or grad norm under
  // train.on_nonfinite: skip_step (train/nonfinite.h). Written only when true.
  bool skipped = false;
  // No position of the step's global batch had a target: `loss` is NaN, written as null
  // beside "no_targets": true (a loss of 0.0 would read as a perfect step). Written only when true.
  bool no_targets = false;
  // A mixture of experts: the load-balancing loss without its coefficient (only with
  // workload.moe.aux_loss; model/routing.h), and each sparse layer's (token, slot) pairs per
  // expert over the step, summarized; `loss` stays the cross-entropy. Written as "aux_loss"
  // and "experts": [{"layer": l, "min": a, "max": b, "cv": c}, ...].
  std::optional<double> aux_loss;
  struct LayerLoad {
    int64_t layer = 0;
    ExpertLoad load;
  };
  std::vector<LayerLoad> experts;
};

// A held-out evaluation (train.eval): {"step": k, "eval_loss": x, "eval_tokens": n} in
// metrics.jsonl beside the step records, step 0 being the one before any update.
struct EvalMetrics {
  int64_t step = 0;
  double eval_loss = 0;     // Σ nll / Σ targets over the held-out rows; NaN (null) for no targets
  int64_t eval_tokens = 0;  // Σ targets
  double eval_time_s = 0;   // not in the record (it would differ between runs); the progress line's
};

// MFU = 6 · N · tokens/s/GPU / peak, N = matmul weights incl. lm_head (ModelConfig::matmul_params).
double mfu_from_throughput(int64_t matmul_params, double tokens_per_s_per_gpu);

// One metrics.jsonl line (no newline).
std::string metrics_to_json(const StepMetrics& m);
// Throws InputError naming the file and line for a line that is not a metrics object.
// Eval records are skipped (eval_metrics_read_jsonl reads them).
std::vector<StepMetrics> metrics_read_jsonl(const std::string& path);
std::string eval_metrics_to_json(const EvalMetrics& m);
std::vector<EvalMetrics> eval_metrics_read_jsonl(const std::string& path);
// "eval at step 3 | eval loss 2.3456 | 12,345 tokens | 1.2 s"; with no targets, "eval loss
// none (no targets in the eval rows) | 0 tokens".
std::string eval_progress_line(const EvalMetrics& m);
// TensorBoard tag "eval loss".
void eval_metrics_to_tensorboard(const EvalMetrics& m, TensorBoardWriter& writer);

// FP8 statistics of a step (model/linear.h Fp8Stats): a line of fp8_stats.jsonl,
// {"step": k, "qkv.input": {"amax": a, "values": n, "flushed": f, "clamped": c}, ...};
// the progress line, "fp8 at step 100 | most flushed: down.output_grad 0.31% | clamped: none |
// largest amax: gate_up.input 48.2"; TensorBoard tags "fp8 amax/<kind>" and
// "fp8 flushed %/<kind>".
std::string fp8_stats_to_json(int64_t step, const Fp8Stats& stats);
std::string fp8_stats_progress_line(int64_t step, const Fp8Stats& stats);
void fp8_stats_to_tensorboard(int64_t step, const Fp8Stats& stats, TensorBoardWriter& writer);

// "step 3/20 | loss 5.4321 | grad norm 1.234 | lr 1.00e-03 | 12,345 tok/s/GPU | MFU 41.2% | 3.20 GiB | ETA
// 1m05s"; a mixture of experts adds "| aux 2.1257" (with an aux loss) and "| experts cv 0.31
// (layer 7)", the most uneven layer's coefficient of variation, before the ETA.
std::string progress_line(const StepMetrics& m, int64_t total_steps, double eta_s);

// The progress line of each step on a stream. On a terminal the line is redrawn in place
// ("\r", cut to the terminal's width so that it never wraps, "\x1b[K" clears the rest) and
// finish() ends it with a newline; elsewhere (a log file, CI) each step gets its own line.
class ProgressPrinter {
 public:
  // Detects a terminal with isatty and its width with TIOCGWINSZ.
  ProgressPrinter(std::FILE* out, int64_t total_steps);
  // tty and columns given (tests); columns 0: no cut.
  ProgressPrinter(std::FILE* out, int64_t total_steps, bool tty, int columns);
  ~ProgressPrinter() { finish(); }
  ProgressPrinter(const ProgressPrinter&) = delete;
  ProgressPrinter& operator=(const ProgressPrinter&) = delete;

  void step(const StepMetrics& m, double eta_s);
  // A line of its own (an evaluation's), after the step line it follows.
  void line(const std::string& text);
  // Ends a line redrawn in place; idempotent.
  void finish();

 private:
  std::FILE* out_;
  int64_t total_steps_;
  bool tty_;
  int columns_;
  bool pending_ = false;
};

// One step's scalars as TensorBoard events, with these tags: "lm loss", "lr", "grad norm"
// (before clipping), "throughput" (tokens/s/GPU), "mfu", "step time" (seconds), "memory"
// (GiB, the most used so far); a mixture of experts adds "aux loss" and, per sparse layer L,
// "experts cv/layer L" and "experts max/layer L"; flushed, so TensorBoard sees the step
// while training runs.
void metrics_to_tensorboard(const StepMetrics& m, TensorBoardWriter& writer);

// The result block's figures over steps [first, last] (1-based, inclusive).
struct WindowResult {
  int64_t first = 0, last = 0;
  int64_t window_tokens = 0;
  double tokens_per_s_per_gpu = 0;  // window tokens / window wall time / GPUs
  double mfu = 0;
  double step_time_mean_s = 0;
  double step_time_cv = 0;  // population std / mean of the window's step times (a fraction)
};

// Throws InputError when the window is not inside the run (names result.window).
WindowResult window_measure(const std::vector<StepMetrics>& steps, int64_t first, int64_t last, int64_t gpus,
                            int64_t matmul_params);

// Seconds since this process started (Linux: /proc/self/stat's start time against
// /proc/uptime), so GPU-hours count the start-up before main(); falls back to the time since
// the first call where /proc is not readable.
double process_elapsed_s();

// GPUs · seconds / 3600.
double gpu_hours_from(int64_t gpus, double seconds);

// What a run measured, for its result block.
struct RunResult {
  WindowResult window;
  int64_t steps_run = 0;             // result.steps_per_run
  int64_t active_params = 0;         // N
  std::string active_params_source;  // the config.json N was counted from, or "loom built-in <model>"
  double gpu_hours = 0;
  std::optional<GpuPrice> price;  // nullopt: usd_per_million_tokens is left out
  std::string measured;           // YYYY-MM-DD; "" writes today's date in UTC
  std::string mfu_note;           // "" writes null
  bool profiler = false;          // the ops were timed while measured (LOOM_OP_PROFILE=1)
  std::string precision;          // workload.precision; "" leaves it out
  // train.eval: the last evaluation (after the last step) and the seconds all of them took,
  // outside the measurement window; result.yaml's result.eval block.
  std::optional<EvalMetrics> eval;
  double eval_time_s = 0;
};

// The recipe document (as written) with its result block filled from `run`, with the seed's
// field names: tokens_per_s_per_gpu (2 decimals), usd_per_million_tokens (2), step_time_cv_percent
// (2), mfu (4), mfu_note, active_params {count, source, revision}, measured, steps_per_run,
// window, window_tokens, runs, profiler, gpu_hours, gpu_hours_note, loom (core/version.h),
// precision.
// Other fields of the recipe are kept. active_params keeps the recipe's source and revision
// when its count is N.
YAML::Node result_document(const YAML::Node& recipe_document, const RunResult& run);

// The measurement in one line, saying what the CV is: "result over steps 5-19: 2,200.16
// tokens/s/GPU, MFU 42.7%, step-time CV 0.45% (population std / mean), $1.00 / 1M tokens
// (<price source>), 3.02 GPU-hours".
std::string result_summary_line(const RunResult& run);

}  // namespace loom
