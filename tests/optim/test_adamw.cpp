#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "optim/adamw.h"
#include "optim/precision_master.h"

namespace loom {
namespace {

constexpr AdamWConfig kRecipe{0.9f, 0.98f, 1e-8f, 0.1f};

// A 2-D weight, a norm (1-D, no decay) and another weight, flat in one shard.
const std::vector<ParamRange> kRanges{{0, 6000, true}, {6000, 128, false}, {6128, 3000, true}};
constexpr int64_t kN = 9128;

// Gradients with magnitudes log-uniform over 1e-10 .. 1, so that for some elements sqrt(v̂) is
// near eps = 1e-8 and where eps is added matters.
std::vector<float> random_grads(std::mt19937& rng) {
  std::uniform_real_distribution<float> exponent(-10.0f, 0.0f);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> g(kN);
  for (float& x : g) x = (sign(rng) ? -1.0f : 1.0f) * std::pow(10.0f, exponent(rng));
  return g;
}

std::vector<float> random_weights(std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> w(kN);
  for (float& x : w) x = dist(rng);
  return w;
}

// The same formula in double, from the same float inputs. m_scale tracks Σ|terms| of m, the
// scale its rounding error is relative to when terms of opposite sign cancel.
void reference_step(const AdamWConfig& cfg, double lr, int64_t t, const std::vector<ParamRange>& ranges,
                    std::vector<double>& p, const std::vector<float>& g, std::vector<double>& m,
                    std::vector<double>& v, std::vector<double>& m_scale) {
  const double b1 = cfg.beta1, b2 = cfg.beta2;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  for (const ParamRange& r : ranges) {
    const double wd = r.decay ? cfg.weight_decay : 0.0;
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      m[i] = b1 * m[i] + (1.0 - b1) * g[i];
      m_scale[i] = b1 * m_scale[i] + (1.0 - b1) * std::abs(g[i]);  // m without cancellation
      v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
      const double update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + static_cast<double>(cfg.eps)) + wd * p[i];
      p[i] -= lr * update;
    }
  }
}

TEST(AdamW, MatchesDoubleReferenceOverFiveSteps) {
  std::mt19937 rng(42);
  std::vector<float> p = random_weights(rng), m(kN, 0.0f), v(kN, 0.0f);
  const std::vector<float> p0 = p;
  std::vector<double> pd(p.begin(), p.end()), md(kN, 0.0), vd(kN, 0.0), m_scale(kN, 0.0);
  const float lrs[] = {1e-3f, 2e-3f, 3e-3f, 2e-3f, 1e-3f};
  for (int64_t t = 1; t <= 5; ++t) {
    const std::vector<float> g = random_grads(rng);
    adamw_step(kRecipe, lrs[t - 1], t, kRanges, p.data(), g.data(), m.data(), v.data());
    reference_step(kRecipe, lrs[t - 1], t, kRanges, pd, g, md, vd, m_scale);
  }
  double moved_error = 0, moved_norm = 0;
  for (int64_t i = 0; i < kN; ++i) {
    EXPECT_NEAR(p[i], pd[i], 1e-6 * std::max<double>(std::abs(pd[i]), std::abs(p0[i]))) << i;
    EXPECT_NEAR(m[i], md[i], 1e-6 * m_scale[i]) << i;
    EXPECT_NEAR(v[i], vd[i], 1e-6 * std::abs(vd[i])) << i;
    const double moved = pd[i] - p0[i];
    moved_error += std::pow((static_cast<double>(p[i]) - p0[i]) - moved, 2);
    moved_norm += moved * moved;
  }
  // The displacement (≈ lr per step) carries the fp32 rounding of the master, ≈ 3e-9 per step
  // against moves of ~1e-3: measured 6.7e-7 in L2; a misplaced eps or bias correction is O(0.1).
  EXPECT_LT(std::sqrt(moved_error / moved_norm), 1e-5);
}

TEST(AdamW, DecayOnlyOnMarkedRanges) {
  std::mt19937 rng(3);
  const std::vector<float> p0 = random_weights(rng), g = random_grads(rng);
  auto run = [&](const AdamWConfig& cfg, bool decay) {
    std::vector<float> p = p0, m(kN, 0.0f), v(kN, 0.0f);
    adamw_step(cfg, 1e-2f, 1, {{0, kN, decay}}, p.data(), g.data(), m.data(), v.data());
    return p;
  };
  AdamWConfig no_wd = kRecipe;
  no_wd.weight_decay = 0.0f;
  const std::vector<float> skipped = run(kRecipe, false), decayed = run(kRecipe, true);
  // A range without decay is bitwise the step with weight_decay 0 (Megatron's no-wd group).
  EXPECT_EQ(skipped, run(no_wd, true));
  int differ = 0;
  for (int64_t i = 0; i < kN; ++i) differ += skipped[i] != decayed[i];
  EXPECT_GT(differ, kN / 2);
}

TEST(AdamW, ZeroLrKeepsMasterButAdvancesMoments) {
  std::mt19937 rng(5);
  std::vector<float> p = random_weights(rng), m(kN, 0.0f), v(kN, 0.0f);
  const std::vector<float> p0 = p, g = random_grads(rng);
  adamw_step(kRecipe, 0.0f, 1, kRanges, p.data(), g.data(), m.data(), v.data());
  EXPECT_EQ(p, p0);
  EXPECT_FLOAT_EQ(m[7], (1.0f - 0.9f) * g[7]);
  EXPECT_FLOAT_EQ(v[7], (1.0f - 0.98f) * g[7] * g[7]);
}

TEST(AdamW, BiasCorrectionAsTransformerEngine) {
  // 1 − 0.9f² in double: 0.9f = 0.89999997615814208984375.
  const double beta = 0.9f;
  EXPECT_EQ(adamw_bias_correction(0.9f, 2), static_cast<float>(1.0 - beta * beta));
  EXPECT_EQ(adamw_bias_correction(0.98f, 1), static_cast<float>(1.0 - static_cast<double>(0.98f)));
}

// The precision-aware optimizer's key property: bf16 weight + int16 remainder is an fp32 master.
TEST(AdamW, Bf16RemainderEqualsFp32MasterBitwise) {
  std::mt19937 rng(9);
  const std::vector<float> w = random_weights(rng);
  std::vector<uint16_t> weight(kN);
  std::vector<int16_t> remainder(kN, 0);  // TE starts remainders at 0: master == bf16 weight
  std::vector<float> master(kN);
  for (int64_t i = 0; i < kN; ++i) {
    weight[i] = float_to_bf16(w[i]).bits;
    master[i] = bf16_to_float(bf16{weight[i]});
  }
  std::vector<float> m1(kN, 0.0f), v1(kN, 0.0f), m2(kN, 0.0f), v2(kN, 0.0f);
  int64_t low_bits_used = 0;
  for (int64_t t = 1; t <= 3; ++t) {
    const std::vector<float> g = random_grads(rng);
    adamw_step(kRecipe, 1e-3f, t, kRanges, master.data(), g.data(), m1.data(), v1.data());
    adamw_step_bf16_remainder(kRecipe, 1e-3f, t, kRanges, weight.data(), remainder.data(), g.data(),
                              m2.data(), v2.data());
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(master_rebuild(weight[i], remainder[i])),
                std::bit_cast<uint32_t>(master[i]))
          << "step " << t << " element " << i;
      uint16_t expected_weight;
      int16_t expected_remainder;
      master_split(master[i], &expected_weight, &expected_remainder);
      ASSERT_EQ(weight[i], expected_weight);
      low_bits_used += remainder[i] != 0;
    }
    ASSERT_EQ(m1, m2);
    ASSERT_EQ(v1, v2);
  }
  // The masters really moved below bf16 resolution (else the test would prove nothing).
  EXPECT_GT(low_bits_used, 3 * kN / 2);
}

// A GPU engine applies the grad clip factor inside the update instead of in a pass of its
// own over the grads (train/cuda_param_store.cpp): the step with grad_scale c must be bit for bit
// the step on grads that a pass x *= c stored first, including products that round into the
// subnormal range, and c = 1 must be no factor at all.
TEST(AdamW, GradScaleIsBitwiseAScalePassFirst) {
  for (const float c : {0.37f, 1.0f / 3.0f, 0.999999f, 1e-3f, 1.0f}) {
    std::mt19937 rng(21);
    const std::vector<float> w = random_weights(rng);
    std::vector<uint16_t> weight1(kN), weight2(kN);
    std::vector<int16_t> remainder1(kN), remainder2(kN);
    master_split_array(w.data(), kN, weight1.data(), remainder1.data());
    weight2 = weight1;
    remainder2 = remainder1;
    std::vector<float> m1(kN, 0.0f), v1(kN, 0.0f), m2(kN, 0.0f), v2(kN, 0.0f);
    for (int64_t t = 1; t <= 3; ++t) {
      std::vector<float> g = random_grads(rng);
      for (int64_t i = 0; i < kN; i += 101) g[i] = std::copysign(1.5e-38f, g[i]);  // g·c subnormal
      std::vector<float> scaled = g;
      for (float& x : scaled) x *= c;
      const float lr = 1e-3f * static_cast<float>(t);
      adamw_step_bf16_remainder(kRecipe, lr, t, kRanges, weight1.data(), remainder1.data(), scaled.data(),
                                m1.data(), v1.data());
      adamw_step_bf16_remainder(kRecipe, lr, t, kRanges, weight2.data(), remainder2.data(), g.data(),
                                m2.data(), v2.data(), c);
      const auto bits = [](const std::vector<float>& x) {
        std::vector<uint32_t> out(x.size());
        for (size_t i = 0; i < x.size(); ++i) out[i] = std::bit_cast<uint32_t>(x[i]);
        return out;
      };
      ASSERT_EQ(weight1, weight2) << "c " << c << ", step " << t << ": bf16 weights";
      ASSERT_EQ(remainder1, remainder2) << "c " << c << ", step " << t << ": remainders";
      ASSERT_EQ(bits(m1), bits(m2)) << "c " << c << ", step " << t << ": m";
      ASSERT_EQ(bits(v1), bits(v2)) << "c " << c << ", step " << t << ": v";
    }
  }
}

}  // namespace
}  // namespace loom
