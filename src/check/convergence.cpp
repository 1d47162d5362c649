#include "check/convergence.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "core/error.h"
#include "core/json_strict.h"

namespace loom {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr size_t kFullTableMaxPoints = 50;  // a 20-step check prints every step

void require_range(const char* flag, double value, double low, double high, bool high_inclusive) {
  const bool ok = std::isfinite(value) && value >= low && (high_inclusive ? value <= high : value < high);
  if (!ok) {
    char what[160];
    std::snprintf(what, sizeof(what), "found %g, expected a value in [%g, %g%s", value, low, high,
                  high_inclusive ? "]" : ")");
    throw_input_error(flag, what);
  }
}

std::string format_g(double value, const char* format = "%.6g") {
  if (std::isnan(value)) return "undefined";
  char text[64];
  std::snprintf(text, sizeof(text), format, value);
  return text;
}

std::string percent(double ratio) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f%%", 100.0 * ratio);
  return text;
}

std::string steps_list(const std::vector<int64_t>& steps) {
  std::string text;
  const size_t shown = std::min<size_t>(steps.size(), 10);
  for (size_t i = 0; i < shown; ++i) text += (i ? ", " : "") + std::to_string(steps[i]);
  if (steps.size() > shown) text += ", ... (" + std::to_string(steps.size()) + " in all)";
  return text;
}

nlohmann::json number_or_null(double value) {
  return std::isfinite(value) ? nlohmann::json(value) : nlohmann::json(nullptr);
}

const char* status_name(PointStatus status) {
  switch (status) {
    case PointStatus::ok: return "ok";
    case PointStatus::missing: return "missing";
    case PointStatus::not_finite: return "not_finite";
  }
  return "ok";
}

}  // namespace

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2) return kNaN;
  double mean_x = 0, mean_y = 0;
  for (size_t i = 0; i < n; ++i) {
    mean_x += x[i];
    mean_y += y[i];
  }
  mean_x /= static_cast<double>(n);
  mean_y /= static_cast<double>(n);
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    const double dx = x[i] - mean_x, dy = y[i] - mean_y;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  if (sxx == 0 || syy == 0) return kNaN;
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

void ConvergenceThresholds::validate() const {
  require_range("--min-correlation", min_correlation, -1, 1, true);
  const double huge = std::numeric_limits<double>::max();
  require_range("--high-loss-tolerance", high_loss_tolerance, 0, huge, true);
  require_range("--medium-loss-tolerance", medium_loss_tolerance, 0, huge, true);
  require_range("--low-loss-tolerance", low_loss_tolerance, 0, huge, true);
  require_range("--final-loss-tolerance", final_loss_tolerance, 0, huge, true);
  require_range("--max-outlier-ratio", max_outlier_ratio, 0, 1, true);
  if (!(outlier_sigma > 0) || !std::isfinite(outlier_sigma))
    throw_input_error("--outlier-sigma", "found " + format_g(outlier_sigma) + ", expected a number > 0");
  require_range("--skip-first-percent", skip_first_percent, 0, 100, false);
}

std::vector<LossPoint> loss_curve_read(const std::string& path) {
  namespace fs = std::filesystem;
  const std::string file = fs::is_directory(path) ? (fs::path(path) / "metrics.jsonl").string() : path;
  std::ifstream in(file);
  if (!in) throw_input_error(file, "cannot open (expected a metrics.jsonl file or a run folder holding one)");
  std::vector<LossPoint> curve;
  std::map<int64_t, int64_t> line_of_step;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = file + ":" + std::to_string(number);
    const nlohmann::json j = json_object_line(line, where);
    if (!j.contains("step") || !j.at("step").is_number_integer())
      throw_input_error(where, "step: missing or not an integer");
    if (!j.contains("loss")) throw_input_error(where, "loss: missing (expected a number, or null)");
    const nlohmann::json& loss = j.at("loss");
    if (!loss.is_number() && !loss.is_null()) throw_input_error(where, "loss: expected a number or null");
    LossPoint point{j.at("step").get<int64_t>(), loss.is_null() ? kNaN : loss.get<double>()};
    const auto [it, inserted] = line_of_step.emplace(point.step, number);
    if (!inserted)
      throw_input_error(where, "step " + std::to_string(point.step) + " appears again (first on line " +
                                   std::to_string(it->second) + "); expected one line per step");
    curve.push_back(point);
  }
  if (curve.empty()) throw_input_error(file, "no steps (expected one JSON object per line)");
  return curve;
}

const RuleResult& ConvergenceReport::rule(const std::string& name) const {
  for (const RuleResult& r : rules)
    if (r.name == name) return r;
  assert_fail("rule", "no convergence rule named " + name, __FILE__, __LINE__);
}

ConvergenceReport convergence_check(const std::vector<LossPoint>& candidate,
                                    const std::vector<LossPoint>& reference,
                                    const ConvergenceThresholds& thresholds) {
  thresholds.validate();
  if (reference.empty()) throw_input_error("reference", "no steps to compare against");
  ConvergenceReport report;
  report.thresholds = thresholds;

  std::map<int64_t, double> candidate_loss, reference_loss;
  for (const LossPoint& p : candidate) candidate_loss[p.step] = p.loss;
  for (const LossPoint& p : reference) reference_loss[p.step] = p.loss;
  for (const auto& [step, loss] : candidate_loss)
    if (!reference_loss.count(step)) report.candidate_only_steps.push_back(step);

  // Bridge: skip = max(0, int(len(values) * fraction)); percent / 100 is the same double as
  // Bridge's fraction literal for integer percents, since '/' rounds correctly.
  report.reference_points = static_cast<int64_t>(reference_loss.size());
  report.skipped = static_cast<int64_t>(
      std::floor(static_cast<double>(report.reference_points) * (thresholds.skip_first_percent / 100.0)));
  int64_t index = 0;
  for (const auto& [step, g] : reference_loss) {
    if (index++ < report.skipped) continue;
    PointComparison p;
    p.step = step;
    p.reference = g;
    const auto found = candidate_loss.find(step);
    p.candidate = found == candidate_loss.end() ? kNaN : found->second;
    if (found == candidate_loss.end())
      p.status = PointStatus::missing;
    else if (!std::isfinite(p.candidate) || !std::isfinite(g))
      p.status = PointStatus::not_finite;
    p.tolerance = g > 2.0   ? thresholds.high_loss_tolerance
                  : g > 0.5 ? thresholds.medium_loss_tolerance
                            : thresholds.low_loss_tolerance;
    p.relative_difference = kNaN;
    p.residual = kNaN;
    if (p.status == PointStatus::ok) {
      p.relative_difference = g != 0 ? std::abs(p.candidate - g) / std::abs(g) : std::abs(p.candidate);
      p.fails_tolerance = p.relative_difference > p.tolerance;
      p.residual = p.candidate - g;
    }
    report.points.push_back(p);
  }
  const auto compared = static_cast<int64_t>(report.points.size());

  std::vector<double> c, g, residuals;
  std::vector<int64_t> missing, not_finite;
  for (const PointComparison& p : report.points) {
    if (p.status == PointStatus::missing) missing.push_back(p.step);
    if (p.status == PointStatus::not_finite) not_finite.push_back(p.step);
    if (p.status != PointStatus::ok) continue;
    c.push_back(p.candidate);
    g.push_back(p.reference);
    residuals.push_back(p.residual);
    report.pointwise_failures += p.fails_tolerance ? 1 : 0;
  }
  report.finite_points = static_cast<int64_t>(c.size());
  const double finite = static_cast<double>(report.finite_points);

  RuleResult complete{"complete", missing.empty() && not_finite.empty(), finite,
                      static_cast<double>(compared), ""};
  complete.detail = std::to_string(report.finite_points) + " of " + std::to_string(compared) +
                    " points present and finite in both curves";
  if (!missing.empty()) complete.detail += "; missing in the candidate: steps " + steps_list(missing);
  if (!not_finite.empty()) complete.detail += "; loss not finite: steps " + steps_list(not_finite);

  report.correlation = pearson(c, g);
  RuleResult correlation{"correlation", report.correlation >= thresholds.min_correlation, report.correlation,
                         thresholds.min_correlation, ""};
  correlation.detail = std::isnan(report.correlation)
                           ? std::string(report.finite_points < 2 ? "undefined: fewer than 2 finite points"
                                                                  : "undefined: a curve is constant")
                           : "Pearson r " + format_g(report.correlation, "%.7f") +
                                 " >= " + format_g(thresholds.min_correlation) + " required";

  const double failure_ratio = finite > 0 ? static_cast<double>(report.pointwise_failures) / finite : 0;
  RuleResult pointwise{"pointwise", failure_ratio <= thresholds.max_outlier_ratio, failure_ratio,
                       thresholds.max_outlier_ratio, ""};
  pointwise.detail = std::to_string(report.pointwise_failures) + " of " +
                     std::to_string(report.finite_points) + " points outside their band (" +
                     percent(failure_ratio) + ", at most " + percent(thresholds.max_outlier_ratio) +
                     " allowed)";

  const PointComparison& last = report.points.back();
  report.final_loss_difference = last.status != PointStatus::ok ? kNaN
                                 : last.reference != 0
                                     ? std::abs(last.candidate - last.reference) / std::abs(last.reference)
                                     : std::abs(last.candidate);
  RuleResult final_loss{"final_loss", report.final_loss_difference <= thresholds.final_loss_tolerance,
                        report.final_loss_difference, thresholds.final_loss_tolerance, ""};
  final_loss.detail = std::isnan(report.final_loss_difference)
                          ? "undefined: the last step (" + std::to_string(last.step) + ") is " +
                                (last.status == PointStatus::missing ? "missing" : "not finite")
                          : "|c - g| / |g| at step " + std::to_string(last.step) + " = " +
                                format_g(report.final_loss_difference) + " (at most " +
                                format_g(thresholds.final_loss_tolerance) + ")";

  if (!residuals.empty()) {
    double mean = 0;
    for (double r : residuals) mean += r;
    mean /= finite;
    double var = 0;
    for (double r : residuals) var += (r - mean) * (r - mean);
    const double std_dev = std::sqrt(var / finite);  // population: numpy.std's ddof = 0
    for (PointComparison& p : report.points) {
      if (p.status != PointStatus::ok) continue;
      p.outlier = std::abs(p.residual - mean) > thresholds.outlier_sigma * std_dev;
      report.outliers += p.outlier ? 1 : 0;
    }
  }
  const double outlier_ratio = finite > 0 ? static_cast<double>(report.outliers) / finite : 0;
  RuleResult outliers{"outliers", outlier_ratio <= thresholds.max_outlier_ratio, outlier_ratio,
                      thresholds.max_outlier_ratio, ""};
  outliers.detail = std::to_string(report.outliers) + " of " + std::to_string(report.finite_points) +
                    " residuals beyond " + format_g(thresholds.outlier_sigma) + " sigma of their mean (" +
                    percent(outlier_ratio) + ", at most " + percent(thresholds.max_outlier_ratio) +
                    " allowed)";

  report.rules = {complete, correlation, pointwise, final_loss, outliers};
  report.passed =
      std::all_of(report.rules.begin(), report.rules.end(), [](const RuleResult& r) { return r.pass; });
  return report;
}

std::string convergence_report_text(const ConvergenceReport& report, const std::string& candidate_name,
                                    const std::string& reference_name) {
  const ConvergenceThresholds& t = report.thresholds;
  std::string out;
  char line[512];
  out += "loom check convergence\n";
  out += "  candidate  " + candidate_name + "\n";
  out += "  reference  " + reference_name + " (" + std::to_string(report.reference_points) + " steps)\n";
  std::snprintf(line, sizeof(line), "  compared   %zu steps (%s to %s), first %lld skipped (skip %g%%)\n",
                report.points.size(), std::to_string(report.points.front().step).c_str(),
                std::to_string(report.points.back().step).c_str(), static_cast<long long>(report.skipped),
                t.skip_first_percent);
  out += line;
  if (!report.candidate_only_steps.empty())
    out += "  ignored    candidate steps not in the reference: " + steps_list(report.candidate_only_steps) +
           "\n";
  out += "\n";
  std::snprintf(line, sizeof(line), "  %-12s %-6s %s\n", "rule", "result", "detail");
  out += line;
  for (const RuleResult& r : report.rules) {
    std::snprintf(line, sizeof(line), "  %-12s %-6s %s\n", r.name.c_str(), r.pass ? "pass" : "FAIL",
                  r.detail.c_str());
    out += line;
  }

  const bool all = report.points.size() <= kFullTableMaxPoints;
  std::vector<const PointComparison*> shown;
  for (const PointComparison& p : report.points)
    if (all || p.status != PointStatus::ok || p.fails_tolerance || p.outlier) shown.push_back(&p);
  out += "\n";
  if (!all)
    out += "  flagged steps only (" + std::to_string(report.points.size()) + " compared; --json has all)\n";
  if (!shown.empty()) {
    std::snprintf(line, sizeof(line), "  %8s %14s %14s %12s %6s  %s\n", "step", "candidate", "reference",
                  "rel diff", "tol", "flags");
    out += line;
  }
  auto loss_text = [](double value) {
    if (std::isnan(value)) return std::string("nan");
    if (std::isinf(value)) return std::string(value > 0 ? "inf" : "-inf");
    return format_g(value, "%.6f");
  };
  for (const PointComparison* p : shown) {
    std::string flags;
    if (p->status == PointStatus::missing) flags = "missing in the candidate (fails complete)";
    if (p->status == PointStatus::not_finite)
      flags = std::string(std::isfinite(p->candidate) ? "reference" : "candidate") +
              " loss not finite (fails complete)";
    if (p->fails_tolerance) flags += "outside band";
    if (p->outlier) flags += std::string(flags.empty() ? "" : ", ") + "outlier";
    const std::string candidate = p->status == PointStatus::missing ? "missing" : loss_text(p->candidate);
    const std::string difference =
        p->status == PointStatus::ok ? format_g(p->relative_difference, "%.6f") : "-";
    std::snprintf(line, sizeof(line), "  %8lld %14s %14s %12s %6.2f  %s\n", static_cast<long long>(p->step),
                  candidate.c_str(), loss_text(p->reference).c_str(), difference.c_str(), p->tolerance,
                  flags.c_str());
    out += line;
  }
  std::string failed;
  for (const RuleResult& r : report.rules)
    if (!r.pass) failed += (failed.empty() ? "" : ", ") + r.name;
  out += "\nresult: " + std::string(report.passed ? "pass" : "FAIL (" + failed + ")") + "\n";
  return out;
}

nlohmann::ordered_json convergence_report_json(const ConvergenceReport& report,
                                               const std::string& candidate_name,
                                               const std::string& reference_name) {
  const ConvergenceThresholds& t = report.thresholds;
  nlohmann::ordered_json j;
  j["result"] = report.passed ? "pass" : "fail";
  j["candidate"] = candidate_name;
  j["reference"] = reference_name;
  j["thresholds"] = {{"min_correlation", t.min_correlation},
                     {"high_loss_tolerance", t.high_loss_tolerance},
                     {"medium_loss_tolerance", t.medium_loss_tolerance},
                     {"low_loss_tolerance", t.low_loss_tolerance},
                     {"final_loss_tolerance", t.final_loss_tolerance},
                     {"max_outlier_ratio", t.max_outlier_ratio},
                     {"outlier_sigma", t.outlier_sigma},
                     {"skip_first_percent", t.skip_first_percent}};
  j["reference_points"] = report.reference_points;
  j["skipped"] = report.skipped;
  j["compared"] = report.points.size();
  j["finite_points"] = report.finite_points;
  j["candidate_only_steps"] = report.candidate_only_steps;
  j["correlation"] = number_or_null(report.correlation);
  j["pointwise_failures"] = report.pointwise_failures;
  j["final_loss_difference"] = number_or_null(report.final_loss_difference);
  j["outliers"] = report.outliers;
  nlohmann::ordered_json rules = nlohmann::ordered_json::array();
  for (const RuleResult& r : report.rules)
    rules.push_back({{"rule", r.name},
                     {"result", r.pass ? "pass" : "fail"},
                     {"value", number_or_null(r.value)},
                     {"threshold", r.threshold},
                     {"detail", r.detail}});
  j["rules"] = rules;
  nlohmann::ordered_json points = nlohmann::ordered_json::array();
  for (const PointComparison& p : report.points)
    points.push_back({{"step", p.step},
                      {"candidate", number_or_null(p.candidate)},
                      {"reference", number_or_null(p.reference)},
                      {"status", status_name(p.status)},
                      {"relative_difference", number_or_null(p.relative_difference)},
                      {"tolerance", p.tolerance},
                      {"fails_tolerance", p.fails_tolerance},
                      {"residual", number_or_null(p.residual)},
                      {"outlier", p.outlier}});
  j["points"] = points;
  return j;
}

}  // namespace loom
