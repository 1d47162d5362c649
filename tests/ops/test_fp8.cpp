// The FP8 numbers (core/fp8.h) and the CPU backend's FP8 ops (ops.h amax, fp8_cast,
// fp8_gemm): the formats' codes, rounding to nearest even, saturation, the scale rule's
// edge cases, and an FP8 GEMM's error against fp32 bounded by its operands' own
// quantization error.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "ops/cpu/cpu_ops.h"
#include "support/compare.h"
#include "support/fp8.h"

namespace loom {
namespace {

TEST(Fp8Numbers, KnownCodes) {
  EXPECT_EQ(fp8_max(DType::e4m3), 448.0f);
  EXPECT_EQ(fp8_max(DType::e5m2), 57344.0f);
  EXPECT_EQ(fp8_encode(1.0f, DType::e4m3), 0x38);
  EXPECT_EQ(fp8_encode(-2.0f, DType::e4m3), 0xc0);
  EXPECT_EQ(fp8_encode(448.0f, DType::e4m3), 0x7e);
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -9), DType::e4m3), 0x01);  // the smallest subnormal
  EXPECT_EQ(fp8_encode(1.0f, DType::e5m2), 0x3c);
  EXPECT_EQ(fp8_encode(57344.0f, DType::e5m2), 0x7b);
  EXPECT_EQ(fp8_encode(std::ldexp(1.0f, -16), DType::e5m2), 0x01);
  EXPECT_EQ(fp8_decode(0x7c, DType::e5m2), INFINITY);
  EXPECT_TRUE(std::isnan(fp8_decode(0x7f, DType::e4m3)));
  EXPECT_TRUE(std::isnan(fp8_decode(0x7d, DType::e5m2)));
  EXPECT_EQ(fp8_encode(0.0f, DType::e4m3), 0x00);
  EXPECT_EQ(fp8_encode(-0.0f, DType::e4m3), 0x80);
}

TEST(Fp8Numbers, EveryFiniteCodeRoundTrips) {
  for (DType f : {DType::e4m3, DType::e5m2})
    for (int code = 0; code < 256; ++code) {
      const float v = fp8_decode(static_cast<uint8_t>(code), f);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(fp8_encode(v, f), code) << dtype_name(f) << " code " << code;
    }
}

TEST(Fp8Numbers, RoundsToNearestTiesToEven) {
  // e4m3 around 1: 1.0 (0x38), 1.125 (0x39), 1.25 (0x3a).
  EXPECT_EQ(fp8_encode(1.0625f, DType::e4m3), 0x38);  // tie: the even code
  EXPECT_EQ(fp8_encode(1.1875f, DType::e4m3), 0x3a);  // tie: the even code
  EXPECT_EQ(fp8_encode(1.07f, DType::e4m3), 0x39);
  EXPECT_EQ(fp8_encode(1.05f, DType::e4m3), 0x38);
  // Subnormal ties: 1.5 and 2.5 times the smallest e4m3 subnormal.
  EXPECT_EQ(fp8_encode(1.5f * std::ldexp(1.0f, -9), DType::e4m3), 0x02);
  EXPECT_EQ(fp8_encode(2.5f * std::ldexp(1.0f, -9), DType::e4m3), 0x02);
  EXPECT_EQ(fp8_encode(0.5f * std::ldexp(1.0f, -9), DType::e4m3), 0x00);
  // e5m2 around 1: 1.0 (0x3c), 1.25 (0x3d), 1.5 (0x3e).
  EXPECT_EQ(fp8_encode(1.125f, DType::e5m2), 0x3c);
  EXPECT_EQ(fp8_encode(1.375f, DType::e5m2), 0x3e);
}

TEST(Fp8Numbers, SaturatesToTheLargestFiniteValue) {
  EXPECT_EQ(fp8_encode(464.0f, DType::e4m3), 0x7e);  // beyond 448 (no rounding up to NaN)
  EXPECT_EQ(fp8_encode(1e30f, DType::e4m3), 0x7e);
  EXPECT_EQ(fp8_encode(INFINITY, DType::e4m3), 0x7e);
  EXPECT_EQ(fp8_encode(-INFINITY, DType::e4m3), 0xfe);
  EXPECT_EQ(fp8_encode(INFINITY, DType::e5m2), 0x7b);
  EXPECT_EQ(fp8_encode(-70000.0f, DType::e5m2), 0xfb);
  EXPECT_TRUE(std::isnan(fp8_decode(fp8_encode(NAN, DType::e4m3), DType::e4m3)));
  EXPECT_TRUE(std::isnan(fp8_decode(fp8_encode(NAN, DType::e5m2), DType::e5m2)));
}

TEST(Fp8Numbers, ScalesAreFiniteAndPositiveForAnyAmax) {
  EXPECT_EQ(fp8_scale(2.0f, DType::e4m3), 224.0f);
  EXPECT_EQ(fp8_scale(0.0f, DType::e4m3), 1.0f);
  EXPECT_EQ(fp8_scale(NAN, DType::e4m3), 1.0f);
  EXPECT_EQ(fp8_scale(INFINITY, DType::e5m2), 1.0f);
  EXPECT_EQ(fp8_scale(1e-40f, DType::e4m3), FLT_MAX);  // 448 / 1e-40 overflows fp32
  EXPECT_EQ(fp8_scale(FLT_MAX, DType::e4m3), 448.0f / FLT_MAX);
}

struct Host {
  std::vector<float> f32;
  std::vector<uint8_t> bytes;
  Tensor f(Shape s) {
    f32.assign(static_cast<size_t>(s.numel()), 0.0f);
    return Tensor{f32.data(), s, DType::f32, Device::cpu};
  }
  Tensor q(Shape s, DType d) {
    bytes.assign(static_cast<size_t>(s.numel()), 0);
    return Tensor{bytes.data(), s, d, Device::cpu};
  }
};

std::vector<float> random_values(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// out_t wider than x's rows: the GEMM's K padded to a multiple of 16 with zeros.
TEST(CpuFp8Ops, CastWritesBothOrientationsUnderTheAmaxScale) {
  CpuOps ops;
  const int64_t r = 5, c = 7;
  std::vector<float> x = random_values(r * c, 1, 2.0f);
  x[3] = -9.5f;  // the amax
  Tensor xt{x.data(), {r, c}, DType::f32, Device::cpu};
  Host amax, scale_inv, out, out_t;
  ops.amax(amax.f({1}), xt);
  EXPECT_EQ(amax.f32[0], 9.5f);
  const int64_t ld = 16;
  ops.fp8_cast(out.q({r, c}, DType::e4m3), out_t.q({c, ld}, DType::e4m3), scale_inv.f({1}), xt,
               Tensor{amax.f32.data(), {1}, DType::f32, Device::cpu}, DType::e4m3);
  const float scale = 448.0f / 9.5f;
  EXPECT_EQ(scale_inv.f32[0], 1.0f / scale);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) {
      const uint8_t want = fp8_encode(x[static_cast<size_t>(i * c + j)] * scale, DType::e4m3);
      EXPECT_EQ(out.bytes[static_cast<size_t>(i * c + j)], want);
      EXPECT_EQ(out_t.bytes[static_cast<size_t>(j * ld + i)], want);
    }
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = r; i < ld; ++i) EXPECT_EQ(out_t.bytes[static_cast<size_t>(j * ld + i)], 0);
  EXPECT_EQ(out.bytes[3], 0xfe);  // −448: the amax lands on the largest value
}

TEST(CpuFp8Ops, ZeroAndNonfiniteTensorsGetFiniteScales) {
  CpuOps ops;
  for (float special : {0.0f, INFINITY, NAN}) {
    std::vector<float> x(16, 0.0f);
    x[5] = special;
    Tensor xt{x.data(), {4, 4}, DType::f32, Device::cpu};
    Host amax, scale_inv, out;
    ops.amax(amax.f({1}), xt);
    ops.fp8_cast(out.q({4, 4}, DType::e5m2), Tensor{}, scale_inv.f({1}), xt,
                 Tensor{amax.f32.data(), {1}, DType::f32, Device::cpu}, DType::e5m2);
    EXPECT_TRUE(std::isfinite(scale_inv.f32[0]) && scale_inv.f32[0] > 0) << special;
    EXPECT_EQ(out.bytes[0], 0x00) << special;
  }
}

TEST(CpuFp8Ops, GemmErrorIsBoundedByItsOperandsQuantization) {
  CpuOps ops;
  const int64_t m = 48, n = 40, k = 64;
  const std::vector<float> a = random_values(m * k, 2, 1.0f), b = random_values(n * k, 3, 0.02f);
  std::vector<float> reference(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(j * k + p)];
      reference[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
    }
  for (DType a_format : {DType::e4m3, DType::e5m2}) {
    SCOPED_TRACE(dtype_name(a_format));
    Host aq, bq, a_amax, b_amax, a_inv, b_inv, out;
    std::vector<float> a_copy = a, b_copy = b;
    Tensor at{a_copy.data(), {m, k}, DType::f32, Device::cpu},
        bt{b_copy.data(), {n, k}, DType::f32, Device::cpu};
    ops.amax(a_amax.f({1}), at);
    ops.amax(b_amax.f({1}), bt);
    Tensor a8 = aq.q({m, k}, a_format), b8 = bq.q({n, k}, DType::e4m3);
    ops.fp8_cast(a8, Tensor{}, a_inv.f({1}), at, Tensor{a_amax.f32.data(), {1}, DType::f32, Device::cpu},
                 a_format);
    ops.fp8_cast(b8, Tensor{}, b_inv.f({1}), bt, Tensor{b_amax.f32.data(), {1}, DType::f32, Device::cpu},
                 DType::e4m3);
    Tensor o = out.f({m, n});
    ops.fp8_gemm(o, a8, Tensor{a_inv.f32.data(), {1}, DType::f32, Device::cpu}, b8,
                 Tensor{b_inv.f32.data(), {1}, DType::f32, Device::cpu}, false, false);
    const double bound = test::fp8_qdq_error(a, a_format) + test::fp8_qdq_error(b, DType::e4m3);
    const double error = test::relative_l2(out.f32, reference);
    EXPECT_GT(error, 0.0);
    EXPECT_LE(error, 1.5 * bound) << "error " << error << ", operands' quantization " << bound;
    // accumulate adds the same product once more
    const std::vector<float> once = out.f32;
    ops.fp8_gemm(o, a8, Tensor{a_inv.f32.data(), {1}, DType::f32, Device::cpu}, b8,
                 Tensor{b_inv.f32.data(), {1}, DType::f32, Device::cpu}, true, false);
    for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(out.f32[i], once[i] + once[i]);
  }
}

TEST(CpuFp8Ops, RefusesTwoE5m2Operands) {
  CpuOps ops;
  Host a, b, ai, bi, out;
  EXPECT_THROW(ops.fp8_gemm(out.f({16, 16}), a.q({16, 16}, DType::e5m2), ai.f({1}),
                            b.q({16, 16}, DType::e5m2), bi.f({1}), false, false),
               RuntimeFailure);
}

}  // namespace
}  // namespace loom
