#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "optim/grad_clip.h"

namespace loom {
namespace {

std::vector<float> random_grads(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1e-3f);
  std::vector<float> g(static_cast<size_t>(n));
  for (float& x : g) x = dist(rng);
  return g;
}

TEST(GradNorm, MatchesLongDoubleReference) {
  const int64_t n = 5 * kGradNormChunk + 1234;  // several chunks and a partial one
  const std::vector<float> g = random_grads(n, 1);
  long double sum = 0;
  for (float x : g) sum += static_cast<long double>(x) * x;
  EXPECT_NEAR(grad_norm_l2(g.data(), n), std::sqrt(static_cast<double>(sum)),
              1e-12 * std::sqrt(static_cast<double>(sum)));
  EXPECT_EQ(grad_norm_l2(g.data(), 0), 0.0);
  const float three_four[] = {3.0f, -4.0f};
  EXPECT_EQ(grad_norm_l2(three_four, 2), 5.0);
}

TEST(GradNorm, FixedChunkOrderIndependentOfThreads) {
  // The documented summation order, sequentially: the threaded result must equal it bitwise.
  const int64_t n = 7 * kGradNormChunk + 99;
  const std::vector<float> g = random_grads(n, 2);
  double total = 0;
  for (int64_t begin = 0; begin < n; begin += kGradNormChunk) {
    double chunk = 0;
    for (int64_t i = begin; i < std::min(n, begin + kGradNormChunk); ++i) chunk += double{g[i]} * g[i];
    total += chunk;
  }
  EXPECT_EQ(grad_sum_squares(g.data(), n), total);
}

TEST(GradClip, CoefficientAsMegatron) {
  EXPECT_EQ(grad_clip_coefficient(4.0, 1.0), static_cast<float>(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(grad_clip_coefficient(0.5, 1.0), 1.0f);
  // The 1e-6 in the denominator: a norm equal to the clip is scaled (by 1/(1 + 1e-6)) ...
  EXPECT_LT(grad_clip_coefficient(1.0, 1.0), 1.0f);
  // ... and one 2e-6 below it is not.
  EXPECT_EQ(grad_clip_coefficient(1.0 - 2e-6, 1.0), 1.0f);
  EXPECT_EQ(grad_clip_coefficient(std::nan(""), 1.0), 1.0f);  // NaN < 1 is false: no scaling
  EXPECT_EQ(grad_clip_coefficient(100.0, 0.0), 1.0f);         // clip_grad 0: clipping off
}

TEST(GradClip, ScaleOnlyWhenNormExceedsClip) {
  const int64_t n = 3 * kGradNormChunk;
  const std::vector<float> original = random_grads(n, 3);
  const double norm = grad_norm_l2(original.data(), n);
  ASSERT_NEAR(norm, 0.44, 0.01);  // 1e-3 · sqrt(n): between the two clips below
  for (double clip : {0.01, 1e3}) {
    std::vector<float> g = original;
    const float factor = grad_clip_coefficient(norm, clip);
    grad_scale(g.data(), n, factor);
    if (norm > clip) {
      // norm · clip / (norm + 1e-6): 2.3e-6 below the clip at this norm.
      EXPECT_NEAR(grad_norm_l2(g.data(), n), clip * norm / (norm + 1e-6), 1e-6 * clip);
      EXPECT_EQ(g[17], original[17] * factor);
    } else {
      EXPECT_EQ(factor, 1.0f);
      EXPECT_EQ(g, original);
    }
  }
}

}  // namespace
}  // namespace loom
