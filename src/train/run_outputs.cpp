#include "train/run_outputs.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"
#include "io/file_output.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// A .jsonl log of step records cut back to the step a resume starts after, or emptied for a
// fresh run; the kept lines are kept byte for byte.
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

void append_line(std::ofstream& out, const std::string& path, const std::string& line) {
  out << line << "\n" << std::flush;
  if (!out) throw_runtime_failure(path, "write failed");
}

}  // namespace

RunOutputs::RunOutputs(RunOutputsSpec spec)
    : spec_(std::move(spec)), metrics_path_((fs::path(spec_.output_dir) / "metrics.jsonl").string()) {
  if (spec_.writer) {
    history_ = metrics_restart(metrics_path_, spec_.resumed);
    if (spec_.fp8_stats) {
      fp8_stats_path_ = (fs::path(spec_.output_dir) / "fp8_stats.jsonl").string();
      jsonl_restart(fp8_stats_path_, spec_.resumed);
    }
    metrics_.open(metrics_path_, std::ios::app);
    if (!metrics_) throw_runtime_failure(metrics_path_, "cannot write");
    if (spec_.fp8_stats) {
      fp8_stats_.open(fp8_stats_path_, std::ios::app);
      if (!fp8_stats_) throw_runtime_failure(fp8_stats_path_, "cannot write");
    }
    tensorboard_.emplace((fs::path(spec_.output_dir) / "tensorboard").string());
  }
  if (spec_.progress) progress_.emplace(spec_.progress, spec_.total_steps);
}

void RunOutputs::step(const StepMetrics& m, const std::optional<Fp8Stats>& fp8) {
  if (fp8 && spec_.writer) {
    append_line(fp8_stats_, fp8_stats_path_, fp8_stats_to_json(m.step, *fp8));
    fp8_stats_to_tensorboard(m.step, *fp8, *tensorboard_);
  }
  if (spec_.writer) {
    append_line(metrics_, metrics_path_, metrics_to_json(m));
    metrics_to_tensorboard(m, *tensorboard_);
  }
  history_.push_back(m);
  step_time_s_ += m.step_time_s;
  if (!progress_) return;
  // ETA: this invocation's step time over the step number (so a resumed run's first ETAs run
  // low) times the steps left to its last.
  progress_->step(m,
                  step_time_s_ / static_cast<double>(m.step) * static_cast<double>(spec_.last_step - m.step));
  if (fp8) progress_->line(fp8_stats_progress_line(m.step, *fp8));
}

void RunOutputs::eval(const EvalMetrics& e) {
  eval_time_s_ += e.eval_time_s;
  if (spec_.writer) {
    append_line(metrics_, metrics_path_, eval_metrics_to_json(e));
    eval_metrics_to_tensorboard(e, *tensorboard_);
  }
  if (progress_) progress_->line(eval_progress_line(e));
  last_eval_ = e;
}

void RunOutputs::finish() {
  if (progress_) progress_->finish();
}

}  // namespace loom
