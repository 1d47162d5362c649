// What a run records as it goes (docs/numerics.md "Metrics"): metrics.jsonl (a line per
// finished step and per evaluation, flushed, so a stopped run keeps them), fp8_stats.jsonl
// (the FP8 census's steps, the same way) and TensorBoard in output_dir, which world rank 0
// alone writes, and the progress line on stderr. A resumed run first cuts both logs back to
// the step it resumes after (a run killed after it may have logged steps that now run
// again), keeping the lines before byte for byte; a fresh run empties them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "io/tensorboard.h"
#include "model/linear.h"
#include "train/metrics.h"

namespace loom {

struct RunOutputsSpec {
  std::string output_dir;
  bool writer = false;             // world rank 0: writes the files
  bool fp8_stats = false;          // fp8_stats.jsonl too (workload.precision fp8 and a census)
  std::optional<int64_t> resumed;  // the step a resume starts after; nullopt: a fresh run
  std::FILE* progress = nullptr;   // the progress line's stream; nullptr: none
  int64_t total_steps = 0;         // train.steps: the progress line's "step k/N"
  int64_t last_step = 0;           // this invocation's last step: the progress line's ETA runs to it
};

class RunOutputs {
 public:
  // On the writer: restarts the logs for spec.resumed (a malformed metrics.jsonl of a resumed
  // run is refused, an InputError naming its line), opens them to append, and opens TensorBoard.
  explicit RunOutputs(RunOutputsSpec spec);
  RunOutputs(const RunOutputs&) = delete;
  RunOutputs& operator=(const RunOutputs&) = delete;

  // A finished step: its FP8 census first (when it took one), then its record, then the
  // progress lines. Every rank keeps the step in history().
  void step(const StepMetrics& m, const std::optional<Fp8Stats>& fp8);
  // An evaluation: its record, its progress line; last_eval() and eval_time_s() on every rank.
  void eval(const EvalMetrics& e);
  // Ends a progress line redrawn in place.
  void finish();

  // The steps of this run: on the writer, those a resume kept and then every one run; on the
  // others, the ones this invocation ran.
  const std::vector<StepMetrics>& history() const { return history_; }
  const std::optional<EvalMetrics>& last_eval() const { return last_eval_; }
  double eval_time_s() const { return eval_time_s_; }
  const std::string& metrics_path() const { return metrics_path_; }

 private:
  RunOutputsSpec spec_;
  std::string metrics_path_, fp8_stats_path_;
  std::ofstream metrics_, fp8_stats_;
  std::optional<TensorBoardWriter> tensorboard_;
  std::optional<ProgressPrinter> progress_;
  std::vector<StepMetrics> history_;
  std::optional<EvalMetrics> last_eval_;
  double eval_time_s_ = 0;
  double step_time_s_ = 0;  // this invocation's steps', for the ETA
};

}  // namespace loom
