// result.yaml's correctness block: its result from the checks, and a block that the recipe
// schema accepts in a verified recipe.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "check/correctness.h"
#include "recipe/recipe.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

const std::string kSeed = std::string(LOOM_SOURCE_DIR) + "/recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml";

std::vector<LossPoint> falling(int n = 20) {
  std::vector<LossPoint> out;
  for (int i = 1; i <= n; ++i) out.push_back({i, 10.0 - 0.4 * i});
  return out;
}

// A passing optimizer check's figures (what optimizer_check_run fills in).
OptimizerCheckReport passing_optimizer_check() {
  OptimizerCheckReport r;
  r.options.size = "small";
  r.shape = optimizer_test_shape("small");
  r.device = "CPU";
  r.baseline.name = "fp32-master AdamW (CPU)";
  r.under_test.name = "precision-aware AdamW (CPU, bf16 + int16 remainder)";
  r.under_test.step1 = 3.6e-5;
  r.under_test.step3 = 2.4e-3;
  r.under_test.step3_bound = 5.8e-3;
  r.under_test.step3_tensor = "norm";
  r.under_test.bitwise_ok = true;
  r.controls.resize(3);
  for (ArmOutcome& c : r.controls) c.passed = true;
  r.passed = true;
  return r;
}

// Passing checks; the configuration report made by hand (a recipe load costs ~0.3 s under
// the sanitizers).
CorrectnessEvidence passing_evidence() {
  CorrectnessEvidence e;
  e.reference = "reference.yaml (layout: tp 8, pp 1, cp 1, dp 1)";
  for (const char* name : {"model", "data", "schedule", "optimizer", "precision", "loss"})
    e.configuration.classes.push_back({name, true, {}, {}});
  e.configuration.passed = true;
  e.convergence = convergence_check(falling(), falling(), {});
  e.convergence_note = "candidate arm: a; reference arm: b";
  return e;
}

TEST(Correctness, ResultIsPendingWithoutComponentTestsAndPassWithOne) {
  CorrectnessEvidence e = passing_evidence();
  YAML::Node block = correctness_block(e);
  EXPECT_EQ(block["result"].as<std::string>(), "pending");
  EXPECT_EQ(block["configuration"].as<std::string>(), "pass");
  EXPECT_EQ(block["convergence"]["result"].as<std::string>(), "pass");
  EXPECT_EQ(block["convergence"]["steps"].as<int>(), 20);
  EXPECT_EQ(block["convergence"]["correlation"].as<double>(), 1.0);
  EXPECT_EQ(block["convergence"]["pointwise_failures"].as<int>(), 0);

  e.component_tests.push_back(
      component_test_record(passing_optimizer_check(), "2026-10-11", "loom check optimizer"));
  block = correctness_block(e);
  EXPECT_EQ(block["result"].as<std::string>(), "pass");
  EXPECT_EQ(block["summary"].as<std::string>(), "passed; 1 component test passed");
  EXPECT_EQ(block["component_tests"][0]["result"].as<std::string>(), "pass");
  EXPECT_NE(block["component_tests"][0]["detail"].as<std::string>().find("bitwise identical"),
            std::string::npos);
}

TEST(Correctness, AnyFailingCheckFailsTheBlockAndSaysWhich) {
  CorrectnessEvidence e = passing_evidence();
  std::vector<LossPoint> candidate = falling();
  candidate.back().loss *= 1.2;
  candidate[3].loss = std::numeric_limits<double>::quiet_NaN();
  e.convergence = convergence_check(candidate, falling(), {});
  e.configuration.classes[1].pass = false;
  e.configuration.passed = false;
  OptimizerCheckReport failed = passing_optimizer_check();
  failed.passed = false;
  e.component_tests.push_back(component_test_record(failed, "2026-10-11", "loom check optimizer"));
  const YAML::Node block = correctness_block(e);
  EXPECT_EQ(block["result"].as<std::string>(), "fail");
  EXPECT_EQ(block["summary"].as<std::string>(),
            "failed: configuration (data); convergence (complete, final_loss); 1 of 1 component tests");
  EXPECT_EQ(block["configuration"].as<std::string>(), "fail");
  EXPECT_EQ(block["convergence"]["result"].as<std::string>(), "fail");
  EXPECT_NE(block["convergence"]["note"].as<std::string>().find("failed rules: complete, final_loss"),
            std::string::npos);
}

TEST(Correctness, UndefinedFiguresAreLeftOutAndExplained) {
  CorrectnessEvidence e = passing_evidence();
  std::vector<LossPoint> flat = falling(5);
  for (LossPoint& p : flat) p.loss = 2.5;
  e.convergence = convergence_check(flat, flat, {});
  const YAML::Node block = correctness_block(e);
  EXPECT_FALSE(block["convergence"]["correlation"].IsDefined());
  EXPECT_NE(block["convergence"]["note"].as<std::string>().find("correlation undefined"), std::string::npos);
}

// The block replaces the seed's own correctness block: the verified recipe still validates.
TEST(Correctness, BlockFitsTheSchemaOfAVerifiedRecipe) {
  CorrectnessEvidence e = passing_evidence();
  e.component_tests.push_back(
      component_test_record(passing_optimizer_check(), date_today_utc(), "loom check optimizer"));
  YAML::Node document = YAML::LoadFile(kSeed);
  document["correctness"] = correctness_block(e);
  const fs::path path = fs::temp_directory_path() / "loom_correctness_block.yaml";
  {
    YAML::Emitter out;
    out << document;
    std::ofstream(path) << out.c_str() << "\n";
  }
  const std::vector<Violation> violations = recipe_validate(path.string());
  std::string listed;
  for (const Violation& v : violations) listed += v.to_string() + "\n";
  EXPECT_TRUE(violations.empty()) << listed;
  fs::remove(path);
}

TEST(Correctness, EvidenceFromRecipesAndRunFolders) {
  const fs::path dir = fs::temp_directory_path() / "loom_correctness_evidence";
  fs::remove_all(dir);
  for (const char* run : {"candidate", "reference"}) {
    fs::create_directories(dir / run);
    std::ofstream out(dir / run / "metrics.jsonl");
    for (const LossPoint& p : falling()) out << "{\"step\": " << p.step << ", \"loss\": " << p.loss << "}\n";
  }
  const Recipe candidate = recipe_load(kSeed, {}, RecipeUse::inspect);
  const CorrectnessEvidence e = correctness_evidence(candidate, (dir / "candidate").string(), kSeed,
                                                     (dir / "reference" / "metrics.jsonl").string());
  EXPECT_TRUE(e.configuration.passed);
  EXPECT_TRUE(e.convergence.passed);
  EXPECT_NE(e.reference.find("layout: tp 4, pp 2"), std::string::npos) << e.reference;
  EXPECT_NE(e.convergence_note.find("candidate arm: "), std::string::npos);
  fs::remove_all(dir);
}

TEST(Correctness, DateIsIso) {
  const std::string date = date_today_utc();
  ASSERT_EQ(date.size(), 10u);
  EXPECT_EQ(date[4], '-');
  EXPECT_EQ(date[7], '-');
}

}  // namespace
}  // namespace loom
