#include "check/correctness.h"

#include <cmath>
#include <cstdio>
#include <ctime>

namespace loom {
namespace {

std::string sci(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", value);
  return text;
}

double round_to(double value, double unit) {
  return std::round(value / unit) * unit;
}

double round_significant(double value, int digits) {
  if (value == 0 || !std::isfinite(value)) return value;
  const double unit = std::pow(10.0, std::floor(std::log10(std::abs(value))) - (digits - 1));
  return round_to(value, unit);
}

std::string failed_rules(const ConvergenceReport& report) {
  std::string text;
  for (const RuleResult& r : report.rules)
    if (!r.pass) text += (text.empty() ? "" : ", ") + r.name;
  return text;
}

}  // namespace

ComponentTestRecord component_test_record(const OptimizerCheckReport& r, const std::string& date,
                                          const std::string& command) {
  ComponentTestRecord record;
  record.test =
      r.under_test.name + " against an fp64 reference, with " + r.baseline.name + " as the baseline";
  record.shape = r.shape.size + ": " + r.shape.description;
  record.gpu = r.device;
  record.date = date;
  record.result = r.passed ? "pass" : "fail";
  size_t controls_failed = 0;
  for (const ArmOutcome& c : r.controls) controls_failed += c.passed ? 1 : 0;
  char lrs[96];
  std::snprintf(lrs, sizeof(lrs), "one step at lr %g, three at lr %g", r.options.one_step_lr, r.options.lr);
  record.detail =
      "worst tensor (update) relative L2 error " + sci(r.under_test.step1) + " against a bound of " +
      sci(r.step1_bound) + " after one step, and " + sci(r.under_test.step3) + " against " +
      sci(r.under_test.step3_bound) + " (" + r.under_test.step3_tensor +
      ", the tensor nearest its bound) after three steps (bound 2 x the fp32-master baseline's error " +
      "on the tensor + 1e-3; " + lrs + "); reconstructed fp32 masters " +
      (r.under_test.bitwise_ok
           ? "bitwise identical to"
           : "differ at " + std::to_string(r.under_test.master_mismatches) + " elements from") +
      " the explicit fp32-master arm; " + std::to_string(controls_failed) + " of " +
      std::to_string(r.controls.size()) + " negative controls fail as they must";
  record.note = command;
  return record;
}

CorrectnessEvidence correctness_evidence(const Recipe& candidate, const std::string& candidate_metrics,
                                         const std::string& reference_recipe,
                                         const std::string& reference_metrics,
                                         const ConvergenceThresholds& thresholds) {
  const Recipe reference = recipe_load(reference_recipe, {}, RecipeUse::inspect);
  CorrectnessEvidence evidence;
  evidence.reference = reference_recipe + " (layout: " + layout_summary(reference.layout) + ")";
  evidence.configuration = config_check(candidate, reference);
  evidence.convergence =
      convergence_check(loss_curve_read(candidate_metrics), loss_curve_read(reference_metrics), thresholds);
  evidence.convergence_note = "candidate arm: " + candidate_metrics + "; reference arm: " + reference_metrics;
  return evidence;
}

YAML::Node correctness_block(const CorrectnessEvidence& e) {
  const ConvergenceReport& conv = e.convergence;
  const bool config_pass = e.configuration.passed;
  size_t tests_passed = 0;
  for (const ComponentTestRecord& t : e.component_tests) tests_passed += t.result == "pass" ? 1 : 0;
  const bool tests_pass = tests_passed == e.component_tests.size();
  const bool any_fail = !config_pass || !conv.passed || !tests_pass;

  std::string result = any_fail ? "fail" : e.component_tests.empty() ? "pending" : "pass";
  std::string summary;
  if (any_fail) {
    std::string parts;
    if (!config_pass) {
      std::string classes;
      for (const ConfigClassResult& c : e.configuration.classes)
        if (!c.pass) classes += (classes.empty() ? "" : ", ") + c.name;
      parts += "configuration (" + classes + ")";
    }
    if (!conv.passed)
      parts += (parts.empty() ? "" : "; ") + std::string("convergence (") + failed_rules(conv) + ")";
    if (!tests_pass)
      parts += (parts.empty() ? "" : "; ") + std::to_string(e.component_tests.size() - tests_passed) +
               " of " + std::to_string(e.component_tests.size()) + " component tests";
    summary = "failed: " + parts;
  } else if (e.component_tests.empty()) {
    summary = "pending: configuration rules and convergence pass; no component test ran";
  } else {
    summary = "passed; " + std::to_string(tests_passed) + " component test" + (tests_passed == 1 ? "" : "s") +
              " passed";
  }

  YAML::Node block;
  block["result"] = result;
  block["summary"] = summary;
  block["reference"] = e.reference;
  block["configuration"] = config_pass ? "pass" : "fail";
  YAML::Node tests(YAML::NodeType::Sequence);
  for (const ComponentTestRecord& t : e.component_tests) {
    YAML::Node test;
    test["test"] = t.test;
    test["shape"] = t.shape;
    test["gpu"] = t.gpu;
    test["date"] = t.date;
    test["result"] = t.result;
    test["detail"] = t.detail;
    if (!t.note.empty()) test["note"] = t.note;
    tests.push_back(test);
  }
  block["component_tests"] = tests;

  YAML::Node convergence;
  convergence["steps"] = static_cast<int64_t>(conv.points.size());
  convergence["result"] = conv.passed ? "pass" : "fail";
  std::string note = e.convergence_note;
  if (std::isfinite(conv.correlation))
    convergence["correlation"] = round_to(conv.correlation, 1e-7);
  else
    note += "; correlation undefined (" + conv.rule("correlation").detail + ")";
  if (std::isfinite(conv.final_loss_difference))
    convergence["final_loss_difference"] = round_significant(conv.final_loss_difference, 4);
  else
    note += "; final loss difference undefined (" + conv.rule("final_loss").detail + ")";
  convergence["pointwise_failures"] = conv.pointwise_failures;
  if (!conv.passed) note += "; failed rules: " + failed_rules(conv);
  convergence["note"] = note;
  block["convergence"] = convergence;

  const ConvergenceThresholds& t = conv.thresholds;
  char rules[1024];
  std::snprintf(
      rules, sizeof(rules),
      "configuration classes of loom's docs/checks.md (model, data and its checksum, schedule, optimizer, "
      "precision, loss; layout may differ); convergence by the rules of Megatron-Bridge "
      "validate_convergence (scripts/performance/utils/evaluate.py): correlation >= %g, point-wise "
      "tolerance %g / %g / %g (reference loss > 2 / > 0.5 / else), final loss difference <= %g, "
      "%g-sigma outliers, at most %g of points failing or outlying, first %g%% of points skipped; plus "
      "every point present and finite",
      t.min_correlation, t.high_loss_tolerance, t.medium_loss_tolerance, t.low_loss_tolerance,
      t.final_loss_tolerance, t.outlier_sigma, t.max_outlier_ratio, t.skip_first_percent);
  block["rules"] = std::string(rules);
  return block;
}

std::string date_today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[16];
  std::strftime(text, sizeof(text), "%Y-%m-%d", &utc);
  return text;
}

}  // namespace loom
