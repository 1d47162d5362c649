// The convergence check on crafted curves: each rule on both sides of its threshold. Expected
// figures marked "numpy" are what numpy computes for the same curves in Megatron-Bridge's
// validate_convergence (corrcoef, std with ddof 0).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "check/convergence.h"
#include "core/error.h"

namespace loom {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<LossPoint> curve(const std::vector<double>& losses, int64_t first_step = 1) {
  std::vector<LossPoint> out;
  for (size_t i = 0; i < losses.size(); ++i) out.push_back({first_step + static_cast<int64_t>(i), losses[i]});
  return out;
}

// g_i = 10 − 0.4 i, i = 1..20: 9.6 down to 2.0, a range wide against the perturbations below.
std::vector<double> falling(int n = 20) {
  std::vector<double> g;
  for (int i = 1; i <= n; ++i) g.push_back(10.0 - 0.4 * i);
  return g;
}

ConvergenceReport check(const std::vector<double>& c, const std::vector<double>& g,
                        ConvergenceThresholds t = {}) {
  return convergence_check(curve(c), curve(g), t);
}

std::vector<std::string> failed(const ConvergenceReport& r) {
  std::vector<std::string> names;
  for (const RuleResult& rule : r.rules)
    if (!rule.pass) names.push_back(rule.name);
  return names;
}

TEST(Convergence, IdenticalCurvesPassEveryRule) {
  const ConvergenceReport r = check(falling(), falling());
  EXPECT_TRUE(r.passed);
  EXPECT_DOUBLE_EQ(r.correlation, 1.0);
  EXPECT_EQ(r.pointwise_failures, 0);
  EXPECT_EQ(r.final_loss_difference, 0.0);
  EXPECT_EQ(r.outliers, 0);
  EXPECT_EQ(r.points.size(), 20u);
  ASSERT_EQ(r.rules.size(), 5u);
}

// g_i = 3 − b i, c_i = g_i + 0.01 (−1)^i: a flat curve, so the alternating wiggle (0.3% of
// the loss, inside every other rule) decides the correlation.
TEST(Convergence, CorrelationBothSidesOfThreshold) {
  auto wiggle = [](double b, std::vector<double>* c, std::vector<double>* g) {
    for (int i = 1; i <= 20; ++i) {
      g->push_back(3.0 - b * i);
      c->push_back(g->back() + 0.01 * (i % 2 ? -1.0 : 1.0));
    }
  };
  std::vector<double> c, g;
  wiggle(0.0055, &c, &g);
  ConvergenceReport r = check(c, g);
  EXPECT_NEAR(r.correlation, 0.95160446938341, 1e-12);  // numpy
  EXPECT_TRUE(r.passed) << r.rule("correlation").detail;
  c.clear();
  g.clear();
  wiggle(0.0052, &c, &g);
  r = check(c, g);
  EXPECT_NEAR(r.correlation, 0.9461533656576199, 1e-12);  // numpy
  EXPECT_EQ(failed(r), std::vector<std::string>{"correlation"});
}

TEST(Convergence, ConstantCurveHasUndefinedCorrelationAndFails) {
  const ConvergenceReport r = check(std::vector<double>(10, 2.5), std::vector<double>(10, 2.5));
  EXPECT_TRUE(std::isnan(r.correlation));
  EXPECT_EQ(failed(r), std::vector<std::string>{"correlation"});
  EXPECT_NE(r.rule("correlation").detail.find("constant"), std::string::npos);
}

// 2 of 20 points 11% off (tolerance 0.10 above a loss of 2) is 10%: allowed; 3 is 15%: not.
TEST(Convergence, PointwiseFailureRatioBothSides) {
  const std::vector<double> g = falling();
  std::vector<double> c = g;
  for (int j = 0; j < 2; ++j) c[3 + 4 * j] *= 1.11;
  ConvergenceReport r = check(c, g);
  EXPECT_EQ(r.pointwise_failures, 2);
  EXPECT_TRUE(r.passed) << r.rule("pointwise").detail;
  c[11] *= 1.11;
  r = check(c, g);
  EXPECT_EQ(r.pointwise_failures, 3);
  EXPECT_EQ(failed(r), std::vector<std::string>{"pointwise"});
}

// The band is chosen by the reference loss: > 2.0 → 0.10, > 0.5 → 0.05, else 0.02; g = 0
// compares |c| itself.
TEST(Convergence, ToleranceBandsByReferenceLoss) {
  const std::vector<double> g{2.01, 2.0, 0.51, 0.5, 0.0, 0.0, 3.0};
  const std::vector<double> c{2.01 * 1.07, 2.0 * 1.07, 0.51 * 1.03, 0.5 * 1.03, 0.019, 0.021, 3.0};
  const ConvergenceReport r = check(c, g);
  const std::vector<double> tol{0.10, 0.05, 0.05, 0.02, 0.02, 0.02, 0.10};
  const std::vector<bool> fails{false, true, false, true, false, true, false};
  ASSERT_EQ(r.points.size(), g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(r.points[i].tolerance, tol[i]) << "point " << i;
    EXPECT_EQ(r.points[i].fails_tolerance, fails[i]) << "point " << i;
  }
  EXPECT_DOUBLE_EQ(r.points[5].relative_difference, 0.021);  // |c| when g = 0
}

TEST(Convergence, FinalLossBothSidesOfThreshold) {
  const std::vector<double> g = falling();
  std::vector<double> c = g;
  c.back() = g.back() * 1.029;
  ConvergenceReport r = check(c, g);
  EXPECT_NEAR(r.final_loss_difference, 0.029, 1e-12);
  EXPECT_TRUE(r.passed) << r.rule("final_loss").detail;
  c.back() = g.back() * 1.031;
  r = check(c, g);
  EXPECT_EQ(failed(r), std::vector<std::string>{"final_loss"});
}

// Ten residuals of ±0.2, the rest 0: each is beyond 3σ (σ = 0.2·√(10/N)), so 10 of 100 points
// (10%) are allowed and 10 of 99 are not.
TEST(Convergence, OutlierRatioBothSides) {
  for (const int n : {100, 99}) {
    std::vector<double> g, c;
    for (int i = 1; i <= n; ++i) g.push_back(10.0 - 7.0 * (i - 1) / (n - 1));
    c = g;
    for (int k = 0; k < 10; ++k) c[5 + 9 * k] += k % 2 == 0 ? 0.2 : -0.2;
    const ConvergenceReport r = check(c, g);
    EXPECT_EQ(r.outliers, 10) << n;
    EXPECT_EQ(r.pointwise_failures, 0) << n;
    if (n == 100)
      EXPECT_TRUE(r.passed) << r.rule("outliers").detail;
    else
      EXPECT_EQ(failed(r), std::vector<std::string>{"outliers"});
  }
}

// Residuals ±0.01 with one of d at step 10: numpy's population std flags d = 0.043 (a sample
// std, ddof 1, would not), and neither flags d = 0.041.
TEST(Convergence, OutliersUsePopulationStandardDeviation) {
  const std::vector<double> g = falling();
  for (const double d : {0.043, 0.041}) {
    std::vector<double> c = g;
    for (int i = 1; i <= 20; ++i) c[i - 1] += i % 2 ? -0.01 : 0.01;
    c[9] = g[9] + d;
    const ConvergenceReport r = check(c, g);
    EXPECT_EQ(r.outliers, d == 0.043 ? 1 : 0) << d;
    EXPECT_EQ(r.points[9].outlier, d == 0.043) << d;
    EXPECT_TRUE(r.passed);  // 1 of 20 is within 10%
  }
}

TEST(Convergence, SkipRoundsDownLikeBridge) {
  ConvergenceThresholds t;
  t.skip_first_percent = 20;
  EXPECT_EQ(check(falling(20), falling(20), t).skipped, 4);  // int(20 · 0.2)
  EXPECT_EQ(check(falling(19), falling(19), t).skipped, 3);  // int(3.8)
  t.skip_first_percent = 29;
  std::vector<double> g(100);
  for (int i = 0; i < 100; ++i) g[i] = 5.0 - 0.01 * i;
  EXPECT_EQ(check(g, g, t).skipped, 28);  // Python: int(100 * 0.29) = int(28.999999999999996)
}

TEST(Convergence, SkippedPointsAreNotJudged) {
  const std::vector<double> g = falling();
  std::vector<double> c = g;
  c[0] = kNaN;
  c[1] *= 1.5;
  c[2] *= 1.5;
  c[3] *= 1.5;
  EXPECT_FALSE(check(c, g).passed);
  ConvergenceThresholds t;
  t.skip_first_percent = 20;
  const ConvergenceReport r = check(c, g, t);
  EXPECT_TRUE(r.passed);
  EXPECT_EQ(r.points.front().step, 5);
}

TEST(Convergence, MissingCandidateStepFailsComplete) {
  std::vector<LossPoint> c = curve(falling()), g = curve(falling());
  c.erase(c.begin() + 6);  // step 7
  const ConvergenceReport r = convergence_check(c, g, {});
  EXPECT_EQ(failed(r), std::vector<std::string>{"complete"});
  EXPECT_EQ(r.points[6].status, PointStatus::missing);
  EXPECT_EQ(r.finite_points, 19);
  EXPECT_NE(r.rule("complete").detail.find("steps 7"), std::string::npos);
  // The other figures are over the 19 finite points.
  EXPECT_DOUBLE_EQ(r.correlation, 1.0);
}

TEST(Convergence, NonFiniteLossFailsCompleteOnEitherSide) {
  for (const bool in_candidate : {true, false}) {
    std::vector<double> c = falling(), g = falling();
    (in_candidate ? c : g)[4] = kNaN;
    (in_candidate ? c : g)[8] = std::numeric_limits<double>::infinity();
    const ConvergenceReport r = check(c, g);
    EXPECT_EQ(failed(r), std::vector<std::string>{"complete"}) << in_candidate;
    EXPECT_EQ(r.points[4].status, PointStatus::not_finite);
    EXPECT_EQ(r.points[8].status, PointStatus::not_finite);
    EXPECT_EQ(r.finite_points, 18);
  }
}

TEST(Convergence, MissingLastStepAlsoFailsFinalLoss) {
  std::vector<LossPoint> c = curve(falling()), g = curve(falling());
  c.pop_back();
  const ConvergenceReport r = convergence_check(c, g, {});
  EXPECT_EQ(failed(r), (std::vector<std::string>{"complete", "final_loss"}));
  EXPECT_TRUE(std::isnan(r.final_loss_difference));
}

TEST(Convergence, CandidateOnlyStepsAreReportedAndIgnored) {
  std::vector<LossPoint> c = curve(falling(25)), g = curve(falling(20));
  const ConvergenceReport r = convergence_check(c, g, {});
  EXPECT_TRUE(r.passed);
  EXPECT_EQ(r.candidate_only_steps, (std::vector<int64_t>{21, 22, 23, 24, 25}));
  EXPECT_NE(convergence_report_text(r, "c", "g").find("ignored"), std::string::npos);
}

TEST(Convergence, StepsAlignByNumberNotPosition) {
  // The candidate's file lists its steps in another order; the alignment is by step.
  std::vector<LossPoint> c = curve(falling()), g = curve(falling());
  std::swap(c[0], c[19]);
  EXPECT_TRUE(convergence_check(c, g, {}).passed);
}

TEST(Convergence, ThresholdsAreValidated) {
  ConvergenceThresholds t;
  t.skip_first_percent = 100;
  EXPECT_THROW(check(falling(), falling(), t), InputError);
  t = {};
  t.max_outlier_ratio = 1.5;
  EXPECT_THROW(check(falling(), falling(), t), InputError);
  t = {};
  t.outlier_sigma = 0;
  EXPECT_THROW(check(falling(), falling(), t), InputError);
  EXPECT_THROW(convergence_check(curve(falling()), {}, {}), InputError);
}

TEST(Convergence, ReportsTextAndJson) {
  std::vector<double> c = falling();
  c[4] = kNaN;
  const ConvergenceReport r = check(c, falling());
  const std::string text = convergence_report_text(r, "cand.jsonl", "ref.jsonl");
  EXPECT_NE(text.find("complete     FAIL"), std::string::npos) << text;
  EXPECT_NE(text.find("candidate loss not finite (fails complete)"), std::string::npos) << text;
  EXPECT_NE(text.find("result: FAIL (complete)"), std::string::npos) << text;
  const nlohmann::ordered_json j = convergence_report_json(r, "cand.jsonl", "ref.jsonl");
  EXPECT_EQ(j["result"], "fail");
  EXPECT_TRUE(j["points"][4]["candidate"].is_null());
  EXPECT_EQ(j["points"][4]["status"], "not_finite");
  EXPECT_EQ(j["rules"][0]["rule"], "complete");
  EXPECT_EQ(j["rules"][0]["result"], "fail");
}

class LossCurveFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("loom_check_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& text) {
    const std::string path = (dir_ / "metrics.jsonl").string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(LossCurveFile, ReadsFileOrRunFolderWithNullAsNaN) {
  write("{\"step\": 1, \"loss\": 2.5, \"lr\": 0}\n\n{\"step\": 2, \"loss\": null}\n");
  for (const std::string& path : {(dir_ / "metrics.jsonl").string(), dir_.string()}) {
    const std::vector<LossPoint> points = loss_curve_read(path);
    ASSERT_EQ(points.size(), 2u);
    EXPECT_EQ(points[0].step, 1);
    EXPECT_EQ(points[0].loss, 2.5);
    EXPECT_TRUE(std::isnan(points[1].loss));
  }
}

TEST_F(LossCurveFile, BadLinesNameFileAndLine) {
  auto message = [&](const std::string& text) {
    try {
      loss_curve_read(write(text));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{\"step\": 1, \"loss\": 2}\n{\"step\": 2}\n").find("metrics.jsonl:2: loss: missing"),
            std::string::npos);
  EXPECT_NE(message("{\"step\": 1, \"loss\": 2}\n{\"step\": 1, \"loss\": 3}\n").find("first on line 1"),
            std::string::npos);
  EXPECT_NE(message("{\"step\": 1.5, \"loss\": 2}\n").find(":1: step"), std::string::npos);
  EXPECT_NE(message("{\"step\": 1, \"loss\": \"x\"}\n").find(":1: loss"), std::string::npos);
  EXPECT_NE(message("not json\n").find(":1: not a JSON object"), std::string::npos);
  // A key written twice was once read as its last value.
  EXPECT_NE(
      message("{\"step\": 1, \"loss\": 2, \"loss\": 3}\n").find(":1: found the key 'loss' a second time"),
      std::string::npos);
  EXPECT_NE(message("").find("no steps"), std::string::npos);
  EXPECT_THROW(loss_curve_read((dir_ / "absent.jsonl").string()), InputError);
}

}  // namespace
}  // namespace loom
