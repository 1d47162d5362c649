// The convergence check (docs/numerics.md "Convergence check"): a candidate run's per-step loss
// against a reference run's, by the rules of Megatron-Bridge's `validate_convergence`
// (scripts/performance/utils/evaluate.py; docs/checks.md cites what was read).
//
// Alignment: the reference's steps, in increasing order, are the points; the candidate's loss
// at each (a step the candidate lacks is "missing"; candidate steps the reference lacks are
// reported and ignored, as Bridge does). Then the first floor(N · skip_first_percent / 100)
// points are dropped (Bridge: int(len · fraction)). Over the remaining points, c the
// candidate's loss and g the reference's, every rule must pass:
//   complete     every point present and finite in both curves (loom's addition: Bridge
//                turns a missing step into NaN, and NaN passes all of its comparisons);
//   correlation  Pearson r(c, g) ≥ min_correlation (0.95); undefined r (fewer than 2 points
//                or a constant curve) fails;
//   point-wise   a point fails when d > tol, d = |c − g| / |g| (d = |c| when g = 0), tol =
//                high (0.10) if g > 2.0, medium (0.05) if g > 0.5, else low (0.02);
//                failing / points ≤ max_outlier_ratio (0.10; Bridge uses the one key for both
//                ratios);
//   final loss   |c_last − g_last| / |g_last| ≤ final_loss_tolerance (0.03) (|c_last| when
//                g_last = 0), over the last point; a non-finite last point fails;
//   outliers     r_i = c_i − g_i; an outlier has |r_i − mean r| > outlier_sigma (3) · std r,
//                std the population one (numpy's default, ddof 0); outliers / points ≤
//                max_outlier_ratio.
// correlation, point-wise and outliers are computed over the finite points only, so that
// one NaN does not hide the other figures; the complete rule fails for it.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loom {

// Defaults: validate_convergence's own defaults (its CLI uses final 0.05 and skip 20%).
struct ConvergenceThresholds {
  double min_correlation = 0.95;
  double high_loss_tolerance = 0.10;    // reference loss > 2.0
  double medium_loss_tolerance = 0.05;  // 0.5 < reference loss ≤ 2.0
  double low_loss_tolerance = 0.02;     // reference loss ≤ 0.5
  double final_loss_tolerance = 0.03;
  double max_outlier_ratio = 0.10;  // of point-wise failures and of 3σ outliers
  double outlier_sigma = 3.0;
  double skip_first_percent = 0;  // percent of the points, in [0, 100)

  // InputError naming the flag for a value out of range (tolerances ≥ 0, ratios in [0, 1],
  // correlation in [-1, 1], sigma > 0, skip in [0, 100)).
  void validate() const;
};

struct LossPoint {
  int64_t step = 0;
  double loss = 0;  // NaN where the file has null (a non-finite loss the trainer wrote)
};

// The (step, loss) pairs of a metrics.jsonl, or of DIR/metrics.jsonl when `path` is a folder,
// in file order. InputError naming the file and line: bad JSON, a line that is not an object,
// `step` missing or not an integer, `loss` missing or neither a number nor null, a step
// repeated, or no lines at all.
std::vector<LossPoint> loss_curve_read(const std::string& path);

enum class PointStatus { ok, missing, not_finite };

struct PointComparison {
  int64_t step = 0;
  double candidate = 0, reference = 0;  // NaN when missing or not finite
  PointStatus status = PointStatus::ok;
  double relative_difference = 0;  // NaN unless status ok
  double tolerance = 0;            // the band of the reference loss
  bool fails_tolerance = false;    // relative_difference > tolerance
  double residual = 0;             // c − g (NaN unless ok)
  bool outlier = false;
};

struct RuleResult {
  std::string name;  // complete | correlation | pointwise | final_loss | outliers
  bool pass = false;
  double value = 0;      // the measured figure (NaN when undefined)
  double threshold = 0;  // its bound
  std::string detail;    // one line: the figure against the bound, or why it is undefined
};

struct ConvergenceReport {
  ConvergenceThresholds thresholds;
  int64_t reference_points = 0;               // the reference's steps
  int64_t skipped = 0;                        // first points dropped
  std::vector<PointComparison> points;        // the compared points, after the skip
  std::vector<int64_t> candidate_only_steps;  // in the candidate, not the reference: ignored
  int64_t finite_points = 0;
  double correlation = 0;  // NaN when undefined
  int64_t pointwise_failures = 0;
  double final_loss_difference = 0;  // NaN when the last point is not finite
  int64_t outliers = 0;
  std::vector<RuleResult> rules;  // in the order above
  bool passed = false;

  const RuleResult& rule(const std::string& name) const;
};

// Pearson correlation as numpy.corrcoef computes it (centred sums, clipped to [-1, 1]);
// NaN when it is undefined (fewer than 2 points, or a constant curve).
double pearson(const std::vector<double>& x, const std::vector<double>& y);

// The check over two curves. InputError when the reference has no points; thresholds are
// validated first.
ConvergenceReport convergence_check(const std::vector<LossPoint>& candidate,
                                    const std::vector<LossPoint>& reference,
                                    const ConvergenceThresholds& thresholds);

// The terminal report: the rules table, then every compared step when there are at most
// 50 (else the flagged ones: failing, outlier, missing, not finite), then the result line.
std::string convergence_report_text(const ConvergenceReport& report, const std::string& candidate_name,
                                    const std::string& reference_name);
// The same as JSON; NaN figures are null.
nlohmann::ordered_json convergence_report_json(const ConvergenceReport& report,
                                               const std::string& candidate_name,
                                               const std::string& reference_name);

}  // namespace loom
