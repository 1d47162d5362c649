// Per-step metrics (metrics.jsonl, the progress line) and the measured result over a window
// of steps (SEMANTICS.md "Metrics").
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

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
};

// MFU = 6 · N · tokens/s/GPU / peak, N = matmul weights incl. lm_head (Qwen3Config::matmul_params).
double mfu_from_throughput(int64_t matmul_params, double tokens_per_s_per_gpu);

// One metrics.jsonl line (no newline).
std::string metrics_to_json(const StepMetrics& m);
std::vector<StepMetrics> metrics_read_jsonl(const std::string& path);

// "step 3/20 | loss 5.4321 | grad norm 1.234 | lr 1.00e-03 | 12,345 tok/s/GPU | MFU 41.2% | 3.2 GiB | ETA 1m05s"
std::string progress_line(const StepMetrics& m, int64_t total_steps, double eta_s);

// The result block's figures over steps [first, last] (1-based, inclusive).
struct WindowResult {
  int64_t first = 0, last = 0;
  int64_t window_tokens = 0;
  double tokens_per_s_per_gpu = 0;  // window tokens / window wall time / GPUs
  double mfu = 0;
  double step_time_mean_s = 0;
  double step_time_cv = 0;  // population std / mean of the window's step times
};

// Throws InputError when the window is not inside the run (names result.window).
WindowResult window_measure(const std::vector<StepMetrics>& steps, int64_t first, int64_t last, int64_t gpus,
                            int64_t matmul_params);

}  // namespace loom
