#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "optim/precision_master.h"

namespace loom {
namespace {

uint32_t bits_of(float x) {
  return std::bit_cast<uint32_t>(x);
}
float float_of(uint32_t bits) {
  return std::bit_cast<float>(bits);
}

// Round a finite float to bf16, nearest with ties away from zero, by comparing distances in
// double (exact: both candidates and x are floats of the same binade or neighbours). The
// candidate above bf16 max is 2^128, which stands for overflow to infinity.
uint16_t reference_round_ties_away(float x) {
  const uint32_t toward_zero = bits_of(x) & 0xffff0000u;
  const uint32_t away = toward_zero + 0x10000u;
  const double low = std::abs(double{float_of(toward_zero)});
  const double high =
      (away & 0x7fffffffu) == 0x7f800000u ? std::ldexp(1.0, 128) : std::abs(double{float_of(away)});
  const double magnitude = std::abs(double{x});
  const bool round_away = magnitude - low >= high - magnitude;
  return static_cast<uint16_t>((round_away ? away : toward_zero) >> 16);
}

TEST(PrecisionMaster, RoundTripIsBitExactAndHighHalfRoundsTiesAway) {
  std::mt19937 rng(2024);
  int64_t checked = 0;
  for (int64_t i = 0; i < 16'000'000; ++i) {
    const uint32_t bits = static_cast<uint32_t>(rng());
    const float master = float_of(bits);
    uint16_t weight;
    int16_t remainder;
    master_split(master, &weight, &remainder);
    // Exact for every pattern, NaNs included (rebuild undoes split in wrapping 16-bit arithmetic).
    ASSERT_EQ(bits_of(master_rebuild(weight, remainder)), bits) << std::hex << bits;
    if (std::isnan(master)) continue;
    ASSERT_EQ(weight, reference_round_ties_away(master)) << std::hex << bits;
    ++checked;
  }
  EXPECT_GT(checked, 15'900'000);  // NaNs are 1/256 of random patterns
}

TEST(PrecisionMaster, SpecialValues) {
  // Zeros, subnormals, extremes: exact round trips; the weight is the ties-away rounding.
  const uint32_t cases[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x00008000u,
                            0x00007fffu, 0x807fffffu, 0x00800000u, 0x3f800000u, 0xbf800000u,
                            0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7f7f7fffu};
  for (uint32_t bits : cases) {
    uint16_t weight;
    int16_t remainder;
    master_split(float_of(bits), &weight, &remainder);
    EXPECT_EQ(bits_of(master_rebuild(weight, remainder)), bits) << std::hex << bits;
    EXPECT_EQ(weight, reference_round_ties_away(float_of(bits))) << std::hex << bits;
  }
  uint16_t weight;
  int16_t remainder;
  master_split(float_of(0x00008000u), &weight, &remainder);  // half the smallest bf16 subnormal
  EXPECT_EQ(weight, 0x0001u);
  master_split(float_of(0x80000001u), &weight, &remainder);  // tiny negative: −0, sign kept
  EXPECT_EQ(weight, 0x8000u);
  master_split(FLT_MAX, &weight, &remainder);  // past bf16 max + ½ ulp: the weight overflows to inf
  EXPECT_EQ(weight, 0x7f80u);
  EXPECT_EQ(master_rebuild(weight, remainder), FLT_MAX);
  // A NaN master whose low half is ≥ 0x8000 wraps the weight to −0; the master still rebuilds.
  master_split(float_of(0x7fffffffu), &weight, &remainder);
  EXPECT_EQ(weight, 0x8000u);
  EXPECT_EQ(bits_of(master_rebuild(weight, remainder)), 0x7fffffffu);
}

TEST(PrecisionMaster, TiesGoAwayFromZeroNotToEven) {
  uint16_t weight;
  int16_t remainder;
  // 1 + 2^-8: halfway between bf16 1.0 (0x3f80, even) and 1 + 2^-7 (0x3f81).
  const float tie = 1.0f + 0x1p-8f;
  ASSERT_EQ(bits_of(tie), 0x3f808000u);
  master_split(tie, &weight, &remainder);
  EXPECT_EQ(weight, 0x3f81u);
  EXPECT_EQ(float_to_bf16(tie).bits, 0x3f80u);  // round-to-nearest-even keeps the even 0x3f80
  master_split(-tie, &weight, &remainder);
  EXPECT_EQ(weight, 0xbf81u);  // away from zero in magnitude for negatives too
  // 1 + 3·2^-8: a tie whose toward-zero neighbour 0x3f81 is odd: both roundings agree.
  master_split(1.0f + 3 * 0x1p-8f, &weight, &remainder);
  EXPECT_EQ(weight, 0x3f82u);
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f).bits, 0x3f82u);
  // Just below a tie rounds toward zero.
  master_split(float_of(0x3f807fffu), &weight, &remainder);
  EXPECT_EQ(weight, 0x3f80u);
}

TEST(PrecisionMaster, ZeroRemainderMeansMasterIsTheWeight) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const uint16_t weight = static_cast<uint16_t>(b);
    const float master = master_rebuild(weight, 0);
    ASSERT_EQ(bits_of(master), bits_of(bf16_to_float(bf16{weight}))) << b;
    uint16_t split_weight;
    int16_t split_remainder;
    master_split(master, &split_weight, &split_remainder);
    ASSERT_EQ(split_weight, weight);
    ASSERT_EQ(split_remainder, 0);
  }
}

TEST(PrecisionMaster, ArraysMatchScalars) {
  const int64_t n = 300'001;
  std::mt19937 rng(8);
  std::vector<float> master(n), rebuilt(n);
  for (float& x : master) x = float_of(static_cast<uint32_t>(rng()));
  std::vector<uint16_t> weight(n);
  std::vector<int16_t> remainder(n);
  master_split_array(master.data(), n, weight.data(), remainder.data());
  master_rebuild_array(weight.data(), remainder.data(), n, rebuilt.data());
  for (int64_t i = 0; i < n; ++i) {
    uint16_t w;
    int16_t r;
    master_split(master[i], &w, &r);
    ASSERT_EQ(weight[i], w);
    ASSERT_EQ(remainder[i], r);
    ASSERT_EQ(bits_of(rebuilt[i]), bits_of(master[i]));
  }
}

}  // namespace
}  // namespace loom
