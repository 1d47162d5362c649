#include "train/nonfinite.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace loom {

void nonfinite_count(const float* x, const std::vector<TensorRange>& ranges, int64_t* counts) {
  for (const TensorRange& r : ranges) {
    int64_t count = 0;
    const float* v = x + r.offset;
    for (int64_t i = 0; i < r.numel; ++i) count += std::isfinite(v[i]) ? 0 : 1;
    counts[r.param] += count;
  }
}

std::vector<NonfiniteTensor> nonfinite_tensors(const ParamTable& table, const std::vector<int64_t>& counts) {
  LOOM_ASSERT(counts.size() == table.params.size(), "non-finite counts of another table");
  std::vector<NonfiniteTensor> found;
  for (size_t i = 0; i < counts.size(); ++i)
    if (counts[i] > 0) found.push_back({table.params[i].name, counts[i], table.params[i].numel()});
  return found;
}

std::vector<NonfiniteTensor> nonfinite_tensors(const ParamTable& table, const float* grads) {
  std::vector<int64_t> counts(table.params.size());
  nonfinite_count(grads, param_table_ranges(table), counts.data());
  return nonfinite_tensors(table, counts);
}

namespace {

std::string report_head(int64_t step, int rank, double loss, double grad_norm) {
  auto text = [](double v) {
    char buffer[32];
    std::snprintf(buffer, sizeof buffer, "%.6g", v);
    return std::string(buffer);
  };
  return "step " + std::to_string(step) + ", rank " + std::to_string(rank) + ": loss " + text(loss) +
         ", grad norm " + text(grad_norm) + " (not finite); ";
}

}  // namespace

std::string nonfinite_report(int64_t step, int rank, double loss, double grad_norm,
                             const std::vector<NonfiniteTensor>& tensors) {
  std::string report = report_head(step, rank, loss, grad_norm);
  if (tensors.empty()) return report + "every grad is finite (the loss alone is not)";
  report += "non-finite grads in " + std::to_string(tensors.size()) + " tensors:";
  constexpr size_t kNamed = 8;
  for (size_t i = 0; i < tensors.size() && i < kNamed; ++i)
    report += std::string(i ? "," : "") + " " + tensors[i].name + " (" + std::to_string(tensors[i].count) +
              " of " + std::to_string(tensors[i].numel) + " values)";
  if (tensors.size() > kNamed) report += " and " + std::to_string(tensors.size() - kNamed) + " more";
  return report;
}

NonfiniteGuard::NonfiniteGuard(std::string policy, int64_t max_consecutive, int rank)
    : policy_(std::move(policy)), max_consecutive_(max_consecutive), rank_(rank) {
  LOOM_ASSERT(policy_ == "stop" || policy_ == "skip_step", "train.on_nonfinite: " + policy_);
  LOOM_ASSERT(max_consecutive_ >= 1, "train.max_consecutive_skips < 1");
}

bool NonfiniteGuard::skip_step(int64_t step, double loss, double grad_norm, TrainEngine& engine,
                               const ParamTable& table) {
  if (std::isfinite(loss) && std::isfinite(grad_norm)) {
    consecutive_ = 0;
    return false;
  }
  // Collective on a parallel engine: every rank counts its own grads and gets the world's
  // counts, so each rank's report names the tensors (under stop, the rank whose failure ends
  // the run first is the one reported, any of them).
  const std::string report = nonfinite_report(step, rank_, loss, grad_norm,
                                              nonfinite_tensors(table, engine.nonfinite_grad_counts()));
  if (policy_ == "stop")
    throw RuntimeFailure(report + "; the run stops (train.on_nonfinite: stop; skip_step skips such steps)");
  if (consecutive_ >= max_consecutive_)
    throw RuntimeFailure(
        report + "; the run stops after " + std::to_string(consecutive_) +
        " skipped steps in a row (train.max_consecutive_skips: " + std::to_string(max_consecutive_) + ")");
  ++consecutive_;
  ++skipped_;
  // The loss, the grad norm and the counts are the world's: world rank 0 says it for every rank.
  if (rank_ == 0)
    std::fprintf(
        stderr,
        "loom: %s; skipping the optimizer update (train.on_nonfinite: skip_step, %lld of %lld in a row)\n",
        report.c_str(), static_cast<long long>(consecutive_), static_cast<long long>(max_consecutive_));
  return true;
}

void NonfiniteGuard::restore(int64_t skipped, int64_t consecutive) {
  skipped_ = skipped;
  consecutive_ = consecutive;
}

}  // namespace loom
