#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "core/dtype.h"

namespace loom {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 lies halfway between bf16 1.0 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f).bits, float_to_bf16(1.0f).bits);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  // Just above the halfway point rounds up.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
}

TEST(Bf16, ExactForRepresentableValues) {
  std::mt19937 rng(7);
  for (int i = 0; i < 100000; ++i) {
    uint16_t bits = static_cast<uint16_t>(rng());
    float value = std::bit_cast<float>(static_cast<uint32_t>(bits) << 16);
    if (std::isnan(value)) continue;
    EXPECT_EQ(float_to_bf16(value).bits, bits);
  }
}

TEST(Bf16, MatchesNearestByDistance) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (int i = 0; i < 100000; ++i) {
    float x = dist(rng);
    float rounded = bf16_to_float(float_to_bf16(x));
    uint32_t low_bits = std::bit_cast<uint32_t>(x) & 0xffff0000u;
    float down = std::bit_cast<float>(low_bits);
    float up = std::bit_cast<float>((std::bit_cast<uint32_t>(down) + 0x10000u));
    float best = std::fabs(x - down) <= std::fabs(up - x) ? down : up;
    if (std::fabs(x - down) == std::fabs(up - x)) continue;  // ties covered above
    EXPECT_EQ(rounded, best) << x;
  }
}

TEST(Bf16, NanStaysNanAndInfStaysInf) {
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(INFINITY)), INFINITY);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-INFINITY)), -INFINITY);
  // A NaN whose payload sits only in the low 16 bits must not round to infinity.
  float low_payload_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(low_payload_nan))));
}

}  // namespace
}  // namespace loom
