// The FP8 numbers (core/fp8.h) and the CPU backend's FP8 ops (ops.h amax, fp8_cast,
// fp8_gemm): the formats' codes, rounding to nearest even, saturation, the scale rule's
// edge cases, and an FP8 GEMM's error against fp32 bounded by its operands' own
// quantization error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
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
  const std::vector<float> reference = test::reference_product(a, b, m, n, k);
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

// Block scaling (ops.h fp8_cast_rows and the rest).

TEST(Fp8Numbers, BlockScalesArePowersOfTwoThatKeepTheAmaxInRange) {
  for (DType f : {DType::e4m3, DType::e5m2})
    for (float amax : {1e-30f, 3e-5f, 0.02f, 1.0f, 2.0f, 3.0f, 447.0f, 448.0f, 1000.0f, 6e4f, 1e30f}) {
      const float scale = fp8_block_scale(amax, f);
      int exponent = 0;
      EXPECT_EQ(std::frexp(scale, &exponent), 0.5f) << amax;  // a power of two
      EXPECT_LE(amax * scale, fp8_max(f)) << amax;
      EXPECT_GT(amax * scale, fp8_max(f) / 2) << amax;
      EXPECT_EQ(1.0f / (1.0f / scale), scale) << "the inverse is exact";
    }
  EXPECT_EQ(fp8_block_scale(2.0f, DType::e4m3), 128.0f);  // 448 / 2 = 224 → 128
  EXPECT_EQ(fp8_block_scale(448.0f, DType::e4m3), 1.0f);
  EXPECT_EQ(fp8_block_scale(0.0f, DType::e4m3), 1.0f);
  EXPECT_EQ(fp8_block_scale(NAN, DType::e4m3), 1.0f);
  EXPECT_EQ(fp8_block_scale(INFINITY, DType::e5m2), 1.0f);
  EXPECT_EQ(fp8_block_scale(1e-40f, DType::e4m3), std::ldexp(1.0f, 127));  // FLT_MAX's power of two
  EXPECT_EQ(fp8_block_scale(FLT_MAX, DType::e4m3), std::ldexp(1.0f, -120));
}

Tensor f32_view(std::vector<float>& v, Shape s) {
  return Tensor{v.data(), s, DType::f32, Device::cpu};
}

// The values of a block, its power-of-two scale from its own amax, its bytes.
float block_scale_of(const std::vector<float>& x, int64_t cols, int64_t r0, int64_t r1, int64_t c0,
                     int64_t c1, DType format) {
  float amax = 0;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(r * cols + c)]));
  return fp8_block_scale(amax, format);
}

// Rows of 300 values: blocks of 128, 128 and a partial 44; rows of other magnitudes, a tie,
// an infinity (saturates; its block's scale 1), a NaN (stays NaN, passed over by the amax), a
// zero block.
TEST(CpuFp8Ops, RowCastScalesEachBlockOfEachRow) {
  CpuOps ops;
  const int64_t r = 4, c = 300;
  std::vector<float> x = random_values(r * c, 5, 1.0f);
  for (int64_t j = 0; j < c; ++j) x[static_cast<size_t>(c + j)] *= 1e-3f;      // row 1: small
  x[0] = 300.0f;                                                               // row 0, block 0: scale 1
  x[1] = 1.0625f;                                                              // a tie at scale 1: 1.0
  x[static_cast<size_t>(2 * c + 130)] = INFINITY;                              // row 2, block 1
  x[static_cast<size_t>(2 * c + 260)] = NAN;                                   // row 2, block 2
  for (int64_t j = 0; j < 128; ++j) x[static_cast<size_t>(3 * c + j)] = 0.0f;  // row 3, block 0
  Host out, scale_inv;
  ops.fp8_cast_rows(out.q({r, c}, DType::e4m3), scale_inv.f({3, r}), f32_view(x, {r, c}), DType::e4m3);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t b = 0; b < 3; ++b) {
      const int64_t c0 = b * 128, c1 = std::min(c, c0 + 128);
      const float scale = block_scale_of(x, c, i, i + 1, c0, c1, DType::e4m3);
      const float inv = scale_inv.f32[static_cast<size_t>(b * r + i)];
      EXPECT_EQ(inv, 1.0f / scale) << "row " << i << " block " << b;
      EXPECT_TRUE(std::isfinite(inv) && inv > 0);
      for (int64_t j = c0; j < c1; ++j) {
        const size_t at = static_cast<size_t>(i * c + j);
        EXPECT_EQ(out.bytes[at], fp8_encode(x[at] * scale, DType::e4m3)) << i << ", " << j;
      }
    }
  EXPECT_EQ(scale_inv.f32[0], 1.0f);                             // 448 / 300 → 1
  EXPECT_EQ(out.bytes[1], 0x38);                                 // 1.0625 → 1.0, the even neighbour
  EXPECT_EQ(out.bytes[static_cast<size_t>(2 * c + 130)], 0x7e);  // inf saturates to 448
  EXPECT_EQ(scale_inv.f32[static_cast<size_t>(1 * r + 2)], 1.0f);
  EXPECT_EQ(out.bytes[static_cast<size_t>(2 * c + 260)] & 0x7f, 0x7f);  // NaN
  EXPECT_EQ(scale_inv.f32[3], 1.0f);                                    // the zero block
  // Row 1's values are 1000× smaller: its scale is 1024× larger than row 0's block 1.
  EXPECT_GT(scale_inv.f32[static_cast<size_t>(1 * r + 0)],
            500.0f * scale_inv.f32[static_cast<size_t>(1 * r + 1)]);
}

// 200 tokens of 3 columns, transposed into [3, 256]: blocks of rows 0-127 and 128-199 (the
// columns past 200 are zeros and change no amax), the padded columns written 0.
TEST(CpuFp8Ops, ColumnCastBlocksAlongTheRowsAndTransposes) {
  CpuOps ops;
  const int64_t r = 200, c = 3, ld = 256;
  std::vector<float> x = random_values(r * c, 6, 0.3f);
  x[static_cast<size_t>(150 * c + 1)] = -40.0f;  // column 1's second block's amax
  Host out_t, scale_inv;
  Tensor o = out_t.q({c, ld}, DType::e5m2);
  std::fill(out_t.bytes.begin(), out_t.bytes.end(), uint8_t{0xff});
  ops.fp8_cast_columns(o, scale_inv.f({2, c}), f32_view(x, {r, c}), DType::e5m2);
  for (int64_t j = 0; j < c; ++j)
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t r0 = b * 128, r1 = std::min(r, r0 + 128);
      float amax = 0;
      for (int64_t i = r0; i < r1; ++i) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(i * c + j)]));
      const float scale = fp8_block_scale(amax, DType::e5m2);
      EXPECT_EQ(scale_inv.f32[static_cast<size_t>(b * c + j)], 1.0f / scale);
      for (int64_t i = r0; i < r1; ++i)
        EXPECT_EQ(out_t.bytes[static_cast<size_t>(j * ld + i)],
                  fp8_encode(x[static_cast<size_t>(i * c + j)] * scale, DType::e5m2));
    }
  EXPECT_EQ(scale_inv.f32[static_cast<size_t>(1 * c + 1)], 1.0f / 1024.0f);  // 57344 / 40 → 1024
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = r; i < ld; ++i) EXPECT_EQ(out_t.bytes[static_cast<size_t>(j * ld + i)], 0);
}

// w [130, 260]: 2 × 3 blocks, partial at both edges; out_t is out transposed byte for byte,
// the scale tensors each other's transpose, their rows padded to 4 with zeros.
TEST(CpuFp8Ops, BlockCastScalesEach128x128BlockAndTransposes) {
  CpuOps ops;
  const int64_t r = 130, c = 260;
  std::vector<float> w = random_values(r * c, 8, 0.02f);
  w[static_cast<size_t>(129 * c + 259)] = 5.0f;  // the corner block's amax
  Host out, out_t, scale_inv, scale_inv_t;
  ops.fp8_cast_blocks(out.q({r, c}, DType::e4m3), out_t.q({c, r}, DType::e4m3), scale_inv.f({2, 4}),
                      scale_inv_t.f({3, 4}), f32_view(w, {r, c}), DType::e4m3);
  for (int64_t bi = 0; bi < 2; ++bi)
    for (int64_t bj = 0; bj < 3; ++bj) {
      const int64_t r0 = bi * 128, r1 = std::min(r, r0 + 128), c0 = bj * 128, c1 = std::min(c, c0 + 128);
      const float scale = block_scale_of(w, c, r0, r1, c0, c1, DType::e4m3);
      EXPECT_EQ(scale_inv.f32[static_cast<size_t>(bi * 4 + bj)], 1.0f / scale);
      EXPECT_EQ(scale_inv_t.f32[static_cast<size_t>(bj * 4 + bi)], 1.0f / scale);
      for (int64_t i = r0; i < r1; ++i)
        for (int64_t j = c0; j < c1; ++j) {
          const uint8_t want = fp8_encode(w[static_cast<size_t>(i * c + j)] * scale, DType::e4m3);
          EXPECT_EQ(out.bytes[static_cast<size_t>(i * c + j)], want);
          EXPECT_EQ(out_t.bytes[static_cast<size_t>(j * r + i)], want);
        }
    }
  EXPECT_EQ(scale_inv.f32[static_cast<size_t>(1 * 4 + 2)], 1.0f / 64.0f);  // 448 / 5 → 64
  for (int64_t bi = 0; bi < 2; ++bi) EXPECT_EQ(scale_inv.f32[static_cast<size_t>(bi * 4 + 3)], 0.0f);
  for (int64_t bj = 0; bj < 3; ++bj)
    for (int64_t p = 2; p < 4; ++p) EXPECT_EQ(scale_inv_t.f32[static_cast<size_t>(bj * 4 + p)], 0.0f);
}

// A block-scaled operand on the CPU: its bytes and inverse scales.
struct BlockOperand {
  Host q, scale_inv, unused_q, unused_scales;
  Tensor fp8, scales;
  Fp8Blocks blocks = Fp8Blocks::vec128;
};

BlockOperand block_operand(CpuOps& ops, std::vector<float>& x, int64_t rows, int64_t cols, Fp8Blocks blocks,
                           DType format) {
  BlockOperand o;
  o.blocks = blocks;
  o.fp8 = o.q.q({rows, cols}, format);
  o.scales = o.scale_inv.f(fp8_block_scales_shape(blocks, rows, cols));
  if (blocks == Fp8Blocks::vec128)
    ops.fp8_cast_rows(o.fp8, o.scales, f32_view(x, {rows, cols}), format);
  else
    ops.fp8_cast_blocks(o.fp8, o.unused_q.q({cols, rows}, format), o.scales,
                        o.unused_scales.f(fp8_block_scales_shape(blocks, cols, rows)),
                        f32_view(x, {rows, cols}), format);
  return o;
}

// The three GEMM forms of a block-scaled linear layer at a K with a partial last block:
// forward (x 1 × 128 · W 128 × 128), input gradient (d_out e5m2 1 × 128 · Wᵀ 128 × 128), weight
// gradient (1 × 128 · 1 × 128, added into fp32).
TEST(CpuFp8Ops, BlockGemmErrorIsBoundedByItsOperandsQuantization) {
  CpuOps ops;
  struct Case {
    DType a_format;
    Fp8Blocks b_blocks;
    bool accumulate;
  };
  const int64_t m = 48, n = 160, k = 300;
  for (const Case& c :
       {Case{DType::e4m3, Fp8Blocks::block128x128, false}, Case{DType::e5m2, Fp8Blocks::block128x128, false},
        Case{DType::e5m2, Fp8Blocks::vec128, true}}) {
    SCOPED_TRACE(dtype_name(c.a_format) + (c.accumulate ? " accumulate" : ""));
    std::vector<float> a = random_values(m * k, 2, 1.0f), b = random_values(n * k, 3, 0.02f);
    const std::vector<float> reference = test::reference_product(a, b, m, n, k);
    BlockOperand aq = block_operand(ops, a, m, k, Fp8Blocks::vec128, c.a_format);
    BlockOperand bq = block_operand(ops, b, n, k, c.b_blocks, DType::e4m3);
    Host out;
    Tensor o = out.f({m, n});
    ops.fp8_gemm_blocks(o, aq.fp8, aq.scales, aq.blocks, bq.fp8, bq.scales, bq.blocks, c.accumulate);
    const double bound =
        test::fp8_block_qdq_error(a, m, k, 1, c.a_format) +
        test::fp8_block_qdq_error(b, n, k, c.b_blocks == Fp8Blocks::vec128 ? 1 : 128, DType::e4m3);
    const double error = test::relative_l2(out.f32, reference);
    EXPECT_GT(error, 0.0);
    EXPECT_LE(error, 1.5 * bound) << "error " << error << ", operands' quantization " << bound;
  }
}

// Rows 10⁵× larger than the rest: one tensor scale pushes the ordinary rows down into e4m3's
// subnormals (below 2⁻⁶), while their own blocks keep them at full precision.
TEST(CpuFp8Ops, BlockScalingBeatsTensorScalingOnOutlierRows) {
  CpuOps ops;
  const int64_t m = 64, n = 32, k = 256;
  std::vector<float> a = random_values(m * k, 9, 1.0f), b = random_values(n * k, 10, 0.05f);
  for (int64_t i : {3, 40})
    for (int64_t p = 0; p < k; ++p) a[static_cast<size_t>(i * k + p)] *= 1e5f;
  const std::vector<float> reference = test::reference_product(a, b, m, n, k);

  Host a_amax, b_amax, a_inv, b_inv, aq, bq, tensor_out;
  ops.amax(a_amax.f({1}), f32_view(a, {m, k}));
  ops.amax(b_amax.f({1}), f32_view(b, {n, k}));
  Tensor a8 = aq.q({m, k}, DType::e4m3), b8 = bq.q({n, k}, DType::e4m3);
  ops.fp8_cast(a8, Tensor{}, a_inv.f({1}), f32_view(a, {m, k}), f32_view(a_amax.f32, {1}), DType::e4m3);
  ops.fp8_cast(b8, Tensor{}, b_inv.f({1}), f32_view(b, {n, k}), f32_view(b_amax.f32, {1}), DType::e4m3);
  ops.fp8_gemm(tensor_out.f({m, n}), a8, f32_view(a_inv.f32, {1}), b8, f32_view(b_inv.f32, {1}), false,
               false);

  BlockOperand ab = block_operand(ops, a, m, k, Fp8Blocks::vec128, DType::e4m3);
  BlockOperand bb = block_operand(ops, b, n, k, Fp8Blocks::block128x128, DType::e4m3);
  Host block_out;
  ops.fp8_gemm_blocks(block_out.f({m, n}), ab.fp8, ab.scales, ab.blocks, bb.fp8, bb.scales, bb.blocks, false);

  // Judged on the ordinary rows, whose error the outliers' share of the L2 would hide.
  std::vector<float> ref_rows, tensor_rows, block_rows;
  for (int64_t i = 0; i < m; ++i) {
    if (i == 3 || i == 40) continue;
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = static_cast<size_t>(i * n + j);
      ref_rows.push_back(reference[at]);
      tensor_rows.push_back(tensor_out.f32[at]);
      block_rows.push_back(block_out.f32[at]);
    }
  }
  const double tensor_error = test::relative_l2(tensor_rows, ref_rows),
               block_error = test::relative_l2(block_rows, ref_rows);
  EXPECT_LT(block_error, tensor_error);
  EXPECT_LT(block_error, 0.2 * tensor_error) << "block " << block_error << ", tensor " << tensor_error;
}

TEST(CpuFp8Ops, RefusesTwo128x128BlockedOperands) {
  CpuOps ops;
  Host a, b, ai, bi, out;
  EXPECT_THROW(
      ops.fp8_gemm_blocks(out.f({16, 16}), a.q({16, 16}, DType::e4m3), ai.f({1, 4}), Fp8Blocks::block128x128,
                          b.q({16, 16}, DType::e4m3), bi.f({1, 4}), Fp8Blocks::block128x128, false),
      RuntimeFailure);
}

// Where the cast starts to clamp: half a step past the largest finite value; below it a value
// rounds onto the largest value.
TEST(Fp8Numbers, ClampBoundIsHalfAStepPastTheLargestValue) {
  EXPECT_EQ(fp8_clamp_bound(DType::e4m3), 464.0f);
  EXPECT_EQ(fp8_clamp_bound(DType::e5m2), 61440.0f);
  EXPECT_EQ(fp8_encode(463.0f, DType::e4m3), 0x7e);    // 448
  EXPECT_EQ(fp8_encode(61000.0f, DType::e5m2), 0x7b);  // 57344
}

// The census's counts recounted from x and q by their definition (ops.h fp8_census).
std::pair<int64_t, int64_t> recount(const std::vector<float>& x, const std::vector<uint8_t>& q, DType format,
                                    const std::function<float(size_t)>& scale_inv_of) {
  int64_t flushed = 0, clamped = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] != 0.0f && fp8_decode(q[i], format) == 0.0f) ++flushed;
    if (std::fabs(x[i]) > fp8_clamp_bound(format) * scale_inv_of(i)) ++clamped;
  }
  return {flushed, clamped};
}

Tensor i64_view(std::vector<int64_t>& v) {
  return Tensor{v.data(), {static_cast<int64_t>(v.size())}, DType::i64, Device::cpu};
}

// Under tensor scaling: values far below the amax flush (a zero does not count), NaN is
// neither; with an infinity in the tensor (scale 1) it and the values past the bound clamp.
// The counts add to what the tensor held, the amax is the max with what it held.
TEST(CpuFp8Ops, CensusCountsFlushedAndClampedValues) {
  CpuOps ops;
  std::vector<float> x = {2.0f, 1.0f, 1e-6f, -1e-7f, 0.0f, NAN, 0.5f, -2.0f};
  std::vector<float> y = {INFINITY, 500.0f, -470.0f, 460.0f, 1e-4f, 3.0f, 0.0f, 1.0f};
  std::vector<int64_t> counts = {5, 7};  // what earlier casts left
  std::vector<float> most = {1.5f};
  for (std::vector<float>* v : {&x, &y}) {
    Host amax, q, scale_inv;
    const Tensor vt = f32_view(*v, {2, 4}), amax_t = amax.f({1}), qt = q.q({2, 4}, DType::e4m3),
                 inv = scale_inv.f({1});
    ops.amax(amax_t, vt);
    ops.fp8_cast(qt, Tensor{}, inv, vt, amax_t, DType::e4m3);
    const std::vector<int64_t> before = counts;
    ops.fp8_census(i64_view(counts), f32_view(most, {1}), vt, qt, inv, std::nullopt);
    const auto [flushed, clamped] =
        recount(*v, q.bytes, DType::e4m3, [&](size_t) { return scale_inv.f32[0]; });
    EXPECT_EQ(counts[0] - before[0], flushed);
    EXPECT_EQ(counts[1] - before[1], clamped);
  }
  EXPECT_EQ(counts[0], 5 + 2 + 1);  // x: 1e-6 and -1e-7 at scale 224; y: 1e-4 at scale 1
  EXPECT_EQ(counts[1], 7 + 3);      // y: inf, 500 and -470 (460 rounds onto 448)
  EXPECT_EQ(most[0], INFINITY);
}

// Under block scaling each value is judged under its own block's scale: a block of tiny values
// beside large ones keeps them (1 × 128 rows, 128 × 128 weights), where one scale for the
// tensor flushes them all.
TEST(CpuFp8Ops, CensusReadsEachBlocksScale) {
  CpuOps ops;
  const int64_t r = 130, c = 256;
  std::vector<float> x = random_values(r * c, 9, 1.0f);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 128; j < c; ++j) x[static_cast<size_t>(i * c + j)] *= 1e-7f;  // column block 1: tiny
  const Tensor xt = f32_view(x, {r, c});
  float largest = 0;
  for (float v : x) largest = std::fmax(largest, std::fabs(v));

  Host q, rows_inv, blocks_inv, blocks_inv_t, tensor_inv, amax;
  const Tensor qt = q.q({r, c}, DType::e4m3);
  std::vector<uint8_t> q_t(static_cast<size_t>(r * c));
  const auto census = [&](const Tensor& inv, std::optional<Fp8Blocks> blocks,
                          const std::function<float(size_t)>& of) {
    std::vector<int64_t> counts = {0, 0};
    std::vector<float> most = {0.0f};
    ops.fp8_census(i64_view(counts), f32_view(most, {1}), xt, qt, inv, blocks);
    EXPECT_EQ(most[0], largest);
    const auto [flushed, clamped] = recount(x, q.bytes, DType::e4m3, of);
    EXPECT_EQ(counts[0], flushed);
    EXPECT_EQ(counts[1], clamped);
    EXPECT_EQ(clamped, 0);
    return counts[0];
  };
  const Tensor rows = rows_inv.f({2, r});
  ops.fp8_cast_rows(qt, rows, xt, DType::e4m3);
  const int64_t rows_flushed = census(rows, Fp8Blocks::vec128, [&](size_t i) {
    return rows_inv
        .f32[static_cast<size_t>((static_cast<int64_t>(i) % c) / 128 * r + static_cast<int64_t>(i) / c)];
  });
  const Tensor blocks = blocks_inv.f({2, 4});
  ops.fp8_cast_blocks(qt, Tensor{q_t.data(), {c, r}, DType::e4m3, Device::cpu}, blocks,
                      blocks_inv_t.f({2, 4}), xt, DType::e4m3);
  const int64_t blocks_flushed = census(blocks, Fp8Blocks::block128x128, [&](size_t i) {
    return blocks_inv.f32[static_cast<size_t>(static_cast<int64_t>(i) / c / 128 * 4 +
                                              (static_cast<int64_t>(i) % c) / 128)];
  });
  const Tensor tensor = tensor_inv.f({1}), amax_t = amax.f({1});
  ops.amax(amax_t, xt);
  ops.fp8_cast(qt, Tensor{}, tensor, xt, amax_t, DType::e4m3);
  const int64_t tensor_flushed = census(tensor, std::nullopt, [&](size_t) { return tensor_inv.f32[0]; });
  EXPECT_LT(rows_flushed, r * 128 / 100);  // a normal block's own tail
  EXPECT_LT(blocks_flushed, r * 128 / 100);
  EXPECT_GE(tensor_flushed, r * 128);  // the tiny block entirely
}

}  // namespace
}  // namespace loom
