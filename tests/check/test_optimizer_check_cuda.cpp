// `loom check optimizer --device cuda [--offload]` at the small size: the GPU arms and the
// offload arm through the whole check, and each against the CPU's arms bit for bit (label
// gpu; skipped with a message where no GPU is visible).
#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "check/optimizer_check.h"
#include "core/error.h"
#include "ops/cuda/device.h"

namespace loom {
namespace {

class OptimizerCheckCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device visible: the GPU arms of loom check optimizer did not run";
  }
};

std::string outcome_text(const ArmOutcome& o) {
  return o.name + ": step-1 error " + std::to_string(o.step1) + " (" + o.step1_tensor + "), step-3 error " +
         std::to_string(o.step3) + " (bound " + std::to_string(o.step3_bound) + ", " + o.step3_tensor +
         "), master mismatches " + std::to_string(o.master_mismatches);
}

TEST_F(OptimizerCheckCudaTest, GpuAndOffloadArmsPassTheSmallCheck) {
  OptimizerCheckOptions options;
  options.size = "small";
  for (bool offload : {false, true}) {
    const OptimizerArmSet arms = optimizer_arms_for("cuda", offload);
    EXPECT_FALSE(arms.is_cpu);
    EXPECT_EQ(arms.device.find("CPU") != std::string::npos, offload) << arms.device;
    const OptimizerCheckReport r = optimizer_check_run(options, arms);
    const std::string what = offload ? "--device cuda --offload: " : "--device cuda: ";
    EXPECT_TRUE(r.passed) << what << optimizer_report_text(r);
    EXPECT_TRUE(r.baseline.passed) << what << outcome_text(r.baseline);
    EXPECT_TRUE(r.under_test.passed) << what << outcome_text(r.under_test);
    EXPECT_EQ(r.under_test.master_mismatches, 0) << what << outcome_text(r.under_test);
    for (const ArmOutcome& c : r.controls) EXPECT_TRUE(c.passed) << what << "control " << outcome_text(c);
  }
}

// The GPU's arms give the CPU's bits: each arm against the CPU arm of its kind, after every
// step, on a tensor with decay and one without.
TEST_F(OptimizerCheckCudaTest, GpuArmsAreBitwiseTheCpuArms) {
  const int64_t n = 100003;
  std::mt19937 rng(5);
  std::normal_distribution<float> w(0.0f, 0.02f), g(0.0f, 1e-3f);
  std::vector<float> master(n), grad(n);
  for (float& x : master) x = w(rng);
  const AdamWConfig cfg{0.9f, 0.98f, 1e-8f, 0.1f};
  const OptimizerArmSet cpu = optimizer_arms_cpu();
  for (bool offload : {false, true}) {
    const OptimizerArmSet gpu = optimizer_arms_for("cuda", offload);
    struct Pair {
      std::string name;
      OptimizerArmFactory got, want;
    };
    std::vector<Pair> pairs{{gpu.precision_aware_name, gpu.precision_aware, cpu.precision_aware}};
    if (!offload) pairs.push_back({gpu.fp32_master_name, gpu.fp32_master, cpu.fp32_master});
    for (const Pair& pair : pairs)
      for (bool decay : {true, false}) {
        std::unique_ptr<OptimizerArm> a = pair.got(), b = pair.want();
        a->init(master.data(), n);
        b->init(master.data(), n);
        std::vector<float> got(n), want(n);
        for (int t = 1; t <= 3; ++t) {
          for (float& x : grad) x = g(rng);
          a->step(cfg, 1e-3f, t, decay, grad.data());
          b->step(cfg, 1e-3f, t, decay, grad.data());
          a->read_master(got.data());
          b->read_master(want.data());
          int64_t differ = 0, first = -1;
          for (int64_t i = 0; i < n; ++i)
            if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
              if (first < 0) first = i;
              ++differ;
            }
          EXPECT_EQ(differ, 0) << pair.name << (decay ? ", decay" : ", no decay") << ", step " << t
                               << ": masters differ from the CPU arm's at " << differ << " elements, first "
                               << first
                               << (first >= 0 ? " (got " + std::to_string(got[first]) + ", want " +
                                                    std::to_string(want[first]) + ")"
                                              : std::string());
        }
      }
  }
}

}  // namespace
}  // namespace loom
