// RunOutputs (train/run_outputs.h): a resumed run cuts metrics.jsonl and fp8_stats.jsonl back
// to the resumed step, keeping the lines before it byte for byte (spacing and key order as
// written, eval records with them), and appends after them; a fresh run empties both; a
// malformed metrics.jsonl of a resume is refused naming its line, the file left as it was; a
// rank other than 0 touches no file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/metrics.h"
#include "train/run_outputs.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// Records as an earlier run (or a hand) may have left them: spacing and key order that
// metrics_to_json would not write, so that a rewrite through JSON would show. Steps 3 and 4
// ran after the checkpoint of step 2 that the resume starts after.
const std::vector<std::string> kMetrics = {
    R"({"step": 0, "eval_loss": 5.5, "eval_tokens": 96})",
    R"({"loss":5.25,   "step": 1, "grad_norm": 1.5, "lr": 0.001, "tokens": 128})",
    R"({"step": 2, "loss": 5.0, "grad_norm": 1.25, "lr": 0.001, "tokens": 128, "skipped": true})",
    R"({ "step": 2, "eval_loss": 5.125, "eval_tokens": 96 })",
    R"({"step": 3, "loss": 4.75, "grad_norm": 1.0, "lr": 0.001, "tokens": 128})",
    R"({"step": 4, "loss": 4.5, "grad_norm": 0.75, "lr": 0.001, "tokens": 128})",
    R"({"step": 4, "eval_loss": 4.875, "eval_tokens": 96})",
};
const std::vector<std::string> kFp8Stats = {
    R"({"step": 1, "qkv.input": {"amax": 2.5, "values": 64, "flushed": 0, "clamped": 0}})",
    R"({"step":2,"qkv.input":{"amax":3.0,"values":64,"flushed":1,"clamped":0}})",
    R"({"step": 4, "qkv.input": {"amax": 3.5, "values": 64, "flushed": 0, "clamped": 0}})",
};

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string lines(const std::vector<std::string>& all, const std::vector<size_t>& picked) {
  std::string text;
  for (size_t i : picked) text += all[i] + "\n";
  return text;
}

class RunOutputsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("loom-run-outputs-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
         "-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "metrics.jsonl", std::ios::binary) << lines(kMetrics, {0, 1, 2, 3, 4, 5, 6});
    std::ofstream(dir_ / "fp8_stats.jsonl", std::ios::binary) << lines(kFp8Stats, {0, 1, 2});
  }
  void TearDown() override { fs::remove_all(dir_); }

  RunOutputsSpec spec(std::optional<int64_t> resumed, bool writer = true) const {
    return RunOutputsSpec{dir_.string(), writer, true, resumed, nullptr, 6, 6};
  }

  fs::path dir_;
};

TEST_F(RunOutputsTest, AResumeKeepsTheLinesUpToItsStepByteForByteAndAppendsAfterThem) {
  RunOutputs outputs(spec(2));
  EXPECT_EQ(file_bytes(dir_ / "metrics.jsonl"), lines(kMetrics, {0, 1, 2, 3}));
  EXPECT_EQ(file_bytes(dir_ / "fp8_stats.jsonl"), lines(kFp8Stats, {0, 1}));
  ASSERT_EQ(outputs.history().size(), 2u);
  EXPECT_EQ(outputs.history()[0].step, 1);
  EXPECT_EQ(outputs.history()[1].step, 2);
  EXPECT_TRUE(outputs.history()[1].skipped);

  StepMetrics m;
  m.step = 3;
  m.loss = 4.625;
  m.step_time_s = 0.5;
  outputs.step(m, std::nullopt);
  const EvalMetrics e{3, 4.25, 96, 0.25};
  outputs.eval(e);
  EXPECT_EQ(file_bytes(dir_ / "metrics.jsonl"),
            lines(kMetrics, {0, 1, 2, 3}) + metrics_to_json(m) + "\n" + eval_metrics_to_json(e) + "\n");
  EXPECT_EQ(file_bytes(dir_ / "fp8_stats.jsonl"), lines(kFp8Stats, {0, 1}));  // step 3 took no census
  ASSERT_EQ(outputs.history().size(), 3u);
  EXPECT_EQ(outputs.history().back().loss, 4.625);
  ASSERT_TRUE(outputs.last_eval());
  EXPECT_EQ(outputs.last_eval()->step, 3);
  EXPECT_EQ(outputs.eval_time_s(), 0.25);
}

TEST_F(RunOutputsTest, AResumeFromTheLastLoggedStepKeepsEveryLine) {
  RunOutputs outputs(spec(4));
  EXPECT_EQ(file_bytes(dir_ / "metrics.jsonl"), lines(kMetrics, {0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(file_bytes(dir_ / "fp8_stats.jsonl"), lines(kFp8Stats, {0, 1, 2}));
  EXPECT_EQ(outputs.history().size(), 4u);
}

TEST_F(RunOutputsTest, AFreshRunEmptiesTheLogs) {
  RunOutputs outputs(spec(std::nullopt));
  EXPECT_EQ(file_bytes(dir_ / "metrics.jsonl"), "");
  EXPECT_EQ(file_bytes(dir_ / "fp8_stats.jsonl"), "");
  EXPECT_TRUE(outputs.history().empty());
  EXPECT_TRUE(fs::is_directory(dir_ / "tensorboard"));
}

TEST_F(RunOutputsTest, AMalformedMetricsFileOfAResumeIsRefusedNamingItsLineAndLeftAsItWas) {
  std::ofstream(dir_ / "metrics.jsonl", std::ios::binary) << kMetrics[1] << "\nnot json\n"
                                                          << kMetrics[4] << "\n";
  try {
    RunOutputs outputs(spec(2));
    FAIL() << "a malformed metrics.jsonl was resumed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl:2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(file_bytes(dir_ / "metrics.jsonl"), kMetrics[1] + "\nnot json\n" + kMetrics[4] + "\n");
}

TEST_F(RunOutputsTest, ARankOtherThanZeroTouchesNoFile) {
  RunOutputs outputs(spec(std::nullopt, false));
  StepMetrics m;
  m.step = 1;
  m.step_time_s = 0.5;
  outputs.step(m, std::nullopt);
  EXPECT_EQ(file_bytes(dir_ / "metrics.jsonl"), lines(kMetrics, {0, 1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(file_bytes(dir_ / "fp8_stats.jsonl"), lines(kFp8Stats, {0, 1, 2}));
  EXPECT_FALSE(fs::exists(dir_ / "tensorboard"));
  ASSERT_EQ(outputs.history().size(), 1u);  // its summary's final loss
}

}  // namespace
}  // namespace loom
