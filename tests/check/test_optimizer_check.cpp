// `loom check optimizer --device cpu --size small`: the bounds hold for the CPU arms, each
// negative control fails its criterion, and a faulty arm under test fails the check.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "check/optimizer_check.h"
#include "core/error.h"

namespace loom {
namespace {

const ArmOutcome& control(const OptimizerCheckReport& r, const std::string& name) {
  for (const ArmOutcome& c : r.controls)
    if (c.name == name) return c;
  ADD_FAILURE() << "no control " << name;
  return r.controls.front();
}

// One run covers every criterion: ctest runs each test case in a process of its own, and a
// run is about a second under the sanitizers.
TEST(OptimizerCheck, CpuArmsPassAndEachControlFailsItsCriterion) {
  OptimizerCheckOptions options;
  options.size = "small";
  const OptimizerCheckReport r = optimizer_check_run(options, optimizer_arms_cpu());
  const std::string text = optimizer_report_text(r);
  EXPECT_TRUE(r.passed) << text;
  EXPECT_EQ(r.shape.numel(), 51328);
  ASSERT_EQ(r.baseline.errors.size(), 4u);

  // fp32 rounding of master − lr·update makes the error small but not zero.
  EXPECT_GT(r.baseline.step1, 1e-9);
  EXPECT_LT(r.baseline.step1, 1e-3);
  EXPECT_TRUE(r.under_test.step3_ok);
  EXPECT_TRUE(r.under_test.bitwise_ok);
  EXPECT_EQ(r.under_test.master_mismatches, 0);
  // Bitwise equal masters give the same errors, tensor by tensor.
  for (size_t k = 0; k < r.baseline.errors.size(); ++k) {
    EXPECT_EQ(r.under_test.errors[k].step1, r.baseline.errors[k].step1) << r.baseline.errors[k].tensor;
    EXPECT_EQ(r.under_test.errors[k].step3, r.baseline.errors[k].step3) << r.baseline.errors[k].tensor;
    EXPECT_TRUE(std::isfinite(r.baseline.errors[k].step3));
  }
  EXPECT_NEAR(r.under_test.step3_bound, 2 * r.under_test.step3 + 1e-3, 1e-15);

  // The planted exact ties come back one bf16 ulp off through a nearest-even split.
  const ArmOutcome& rne = control(r, "rne_split");
  EXPECT_TRUE(rne.passed);
  EXPECT_GT(rne.master_mismatches, 0);
  const ArmOutcome& dropped = control(r, "remainders_dropped");
  EXPECT_TRUE(dropped.passed);
  EXPECT_GT(dropped.step1, r.step1_bound);
  // A wrong β2 is invisible after one step (the bias correction cancels it) and seen after three.
  const ArmOutcome& beta2 = control(r, "wrong_beta2");
  EXPECT_TRUE(beta2.passed);
  EXPECT_LE(beta2.step1, r.step1_bound);
  EXPECT_FALSE(beta2.step3_ok);
  EXPECT_GT(beta2.step3, beta2.step3_bound);

  EXPECT_NE(text.find("control failed as expected (bitwise masters)"), std::string::npos) << text;
  EXPECT_NE(text.find("control failed as expected (step-1 bound)"), std::string::npos) << text;
  EXPECT_NE(text.find("control failed as expected (step-3 bound)"), std::string::npos) << text;
  EXPECT_NE(text.find("result: pass"), std::string::npos) << text;
  const nlohmann::ordered_json j = optimizer_report_json(r);
  EXPECT_EQ(j["result"], "pass");
  EXPECT_EQ(j["controls"].size(), 3u);
  EXPECT_EQ(j["parameters"], 51328);
}

TEST(OptimizerCheckFaults, FaultyArmUnderTestFailsTheCheck) {
  OptimizerArmSet arms = optimizer_arms_cpu();
  for (const NegativeControl& c : optimizer_negative_controls())
    if (c.name == "rne_split") arms.precision_aware = c.make;
  OptimizerCheckOptions options;
  options.size = "small";
  const OptimizerCheckReport r = optimizer_check_run(options, arms);
  EXPECT_FALSE(r.passed);
  EXPECT_FALSE(r.under_test.bitwise_ok);
  EXPECT_GT(r.under_test.master_mismatches, 0);
  EXPECT_NE(optimizer_report_text(r).find("bitwise masters)"), std::string::npos);
}

TEST(OptimizerCheckShapes, LargeIsOneRanksShardOfTheSeedLayer) {
  const OptimizerTestShape large = optimizer_test_shape("large");
  EXPECT_EQ(large.numel(), 807407616);
  EXPECT_EQ(large.tensors[0].numel(), 64LL * 2048 * 4096);
  EXPECT_FALSE(large.tensors.back().decay);
  EXPECT_THROW(optimizer_test_shape("medium"), InputError);
}

// The need is counted from the largest tensor (48 B an element with the CPU arms, 24 GiB at
// the large shape) and compared before anything is allocated; the refusal names both sizes
// and the way out.
TEST(OptimizerCheckMemory, RefusesWhatTheHostCannotHoldNamingSizeSmall) {
  const OptimizerTestShape large = optimizer_test_shape("large");
  const OptimizerArmSet cpu = optimizer_arms_cpu();
  EXPECT_EQ(optimizer_check_memory(large, true).host_bytes, 48LL * 64 * 2048 * 4096);
  EXPECT_EQ(optimizer_check_memory(large, true).device_bytes, 0);
  try {
    optimizer_check_require_memory(large, cpu, 16LL << 30);
    FAIL() << "24 GiB passed on 16 GiB";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    for (const char* part :
         {"--size large", "24.0 GiB of host memory", "MemAvailable is 16.0 GiB", "--size small"})
      EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
  }
  EXPECT_NO_THROW(optimizer_check_require_memory(large, cpu, 25LL << 30));
  EXPECT_NO_THROW(optimizer_check_require_memory(large, cpu, -1));  // unknown: not compared
  EXPECT_NO_THROW(optimizer_check_require_memory(optimizer_test_shape("small"), cpu, 4LL << 20));
}

// A GPU set also holds the controls' CPU baseline on the host (60 B an element) and an arm's
// 16 B on the GPU, compared with the free memory the set saw.
TEST(OptimizerCheckMemory, RefusesWhatTheGpuCannotHold) {
  const OptimizerTestShape large = optimizer_test_shape("large");
  const OptimizerCheckMemory need = optimizer_check_memory(large, false);
  EXPECT_EQ(need.host_bytes, 60LL * 64 * 2048 * 4096);
  EXPECT_EQ(need.device_bytes, 16LL * 64 * 2048 * 4096);
  OptimizerArmSet gpu;
  gpu.device = "a test GPU";
  gpu.is_cpu = false;
  gpu.device_free_bytes = 4LL << 30;
  try {
    optimizer_check_require_memory(large, gpu, 64LL << 30);
    FAIL() << "8 GiB of GPU memory passed on 4 GiB free";
  } catch (const InputError& e) {
    const std::string what = e.what();
    for (const char* part : {"8.0 GiB of GPU memory", "a test GPU has 4.0 GiB free", "--size small"})
      EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
  }
  gpu.device_free_bytes = 8LL << 30;
  EXPECT_NO_THROW(optimizer_check_require_memory(large, gpu, 64LL << 30));
}

TEST(OptimizerCheckShapes, DevicesThisBuildLacksAreBadInput) {
#ifndef LOOM_CUDA_BUILD
  // The CUDA build's arms are tested by test_optimizer_check_cuda (label gpu).
  for (bool offload : {false, true}) {
    try {
      optimizer_arms_for("cuda", offload);
      FAIL() << "a build without CUDA gave GPU arms";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA backend"), std::string::npos) << e.what();
    }
  }
#endif
  EXPECT_THROW(optimizer_arms_for("cpu", true), InputError);
  EXPECT_THROW(optimizer_arms_for("tpu", false), InputError);
  EXPECT_EQ(optimizer_arms_for("cpu", false).device, "CPU");
  OptimizerCheckOptions options;
  options.lr = 0;
  EXPECT_THROW(options.validate(), InputError);
}

}  // namespace
}  // namespace loom
