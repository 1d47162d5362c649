#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "core/error.h"
#include "optim/lr_schedule.h"

namespace loom {
namespace {

// The seed recipe: 20 steps of 128 rows, warmup 0.1 → D = 2,560 samples, W = 256.
LrSchedule recipe_schedule() {
  return {1e-5, 1e-6, "cosine", 0.1, 20, 128};
}

TEST(LrSchedule, CosineAtHandComputedPoints) {
  const LrSchedule s = recipe_schedule();
  EXPECT_EQ(s.lr_at(1), 0.0);          // n = 0
  EXPECT_DOUBLE_EQ(s.lr_at(2), 5e-6);  // n = 128 = W / 2
  EXPECT_DOUBLE_EQ(s.lr_at(3), 1e-5);  // n = 256 = W: end of warmup, still the warmup branch
  // n = 384: r = 128 / 2304 = 1/18, cos(10°) = 0.98480775301220806.
  EXPECT_NEAR(s.lr_at(4), 1e-6 + 0.5 * (1 + 0.98480775301220806) * 9e-6, 1e-20);
  EXPECT_DOUBLE_EQ(s.lr_at(12), 5.5e-6);  // n = 1408: r = 1/2, halfway between max and min
  // The last step (n = 2432, r = 17/18) is not yet min: 1e-6 + ½(1 − cos 10°)·9e-6.
  EXPECT_NEAR(s.lr_at(20), 1e-6 + 0.5 * (1 - 0.98480775301220806) * 9e-6, 1e-20);
  EXPECT_GT(s.lr_at(20), s.min_lr);
  EXPECT_DOUBLE_EQ(s.lr_at(21), 1e-6);  // n = D: r = 1
  EXPECT_EQ(s.lr_at(22), 1e-6);         // n > D: min
}

TEST(LrSchedule, FractionalWarmupIsNotRounded) {
  // D = 24, W = 0.2 · 24 = 4.8 samples: iteration 3 (n = 4) is still warming up.
  const LrSchedule s{1.0, 0.0, "cosine", 0.2, 12, 2};
  EXPECT_DOUBLE_EQ(s.lr_at(3), 4.0 / 4.8);
  // n = 6 > W: r = 1.2 / 19.2 = 1/16.
  EXPECT_DOUBLE_EQ(s.lr_at(4), 0.5 * (std::cos(std::numbers::pi / 16) + 1.0));
}

TEST(LrSchedule, LinearAndConstant) {
  LrSchedule s = recipe_schedule();
  s.decay = "linear";
  EXPECT_EQ(s.lr_at(1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(12), 5.5e-6);  // r = 1/2
  EXPECT_DOUBLE_EQ(s.lr_at(4), 1e-6 + (1.0 - 1.0 / 18) * 9e-6);
  EXPECT_EQ(s.lr_at(30), 1e-6);

  s.decay = "constant";
  EXPECT_EQ(s.lr_at(1), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(2), 5e-6);  // warmup applies to constant too
  EXPECT_EQ(s.lr_at(4), 1e-5);
  EXPECT_EQ(s.lr_at(30), 1e-5);  // Megatron returns max_lr before the n > D clamp
}

TEST(LrSchedule, NoWarmupStartsAtMax) {
  LrSchedule s = recipe_schedule();
  s.warmup_fraction = 0.0;
  EXPECT_EQ(s.lr_at(1), 1e-5);
  EXPECT_DOUBLE_EQ(s.lr_at(11), 5.5e-6);  // n = 1280 = D / 2
}

void expect_input_error_naming(const LrSchedule& s, const std::string& field) {
  try {
    s.lr_at(1);
    ADD_FAILURE() << "expected an InputError naming " << field;
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(field + ": ", 0), 0u) << e.what();
  }
}

TEST(LrSchedule, BadParametersNameTheField) {
  LrSchedule s = recipe_schedule();
  s.decay = "inverse-square-root";
  expect_input_error_naming(s, "train.optimizer.decay");
  s = recipe_schedule();
  s.max_lr = 1e-7;  // below min_lr
  expect_input_error_naming(s, "train.optimizer.lr");
  s = recipe_schedule();
  s.min_lr = -1e-6;
  expect_input_error_naming(s, "train.optimizer.min_lr");
  for (double fraction : {-0.1, 1.0, std::nan("")}) {
    s = recipe_schedule();
    s.warmup_fraction = fraction;
    expect_input_error_naming(s, "train.optimizer.warmup_fraction");
  }
  s = recipe_schedule();
  s.steps = 0;
  expect_input_error_naming(s, "train.steps");
  s = recipe_schedule();
  s.global_batch = 0;
  expect_input_error_naming(s, "workload.global_batch");
  EXPECT_NO_THROW(recipe_schedule().validate());
}

}  // namespace
}  // namespace loom
