// FP8 numbers as the FP8 linear layers use them (docs/numerics.md, "FP8 linear layers"):
// the OCP formats Hopper's tensor cores read, and the tensor-wise scale that maps a tensor
// onto one of them.
//
//   e4m3  4 exponent bits (bias 7), 3 mantissa bits; no infinity, NaN = S.1111.111;
//         largest finite 448. Activations and weights.
//   e5m2  5 exponent bits (bias 15), 2 mantissa bits; IEEE-like (inf, NaNs);
//         largest finite 57,344. Gradients, by default.
//
// This is the CPU twin of the GPU's conversion (cvt.rn.satfinite): round to nearest, ties to
// even; a value beyond the largest finite one, infinity included, becomes the largest finite
// one of its sign; NaN stays NaN. Subnormals are kept.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace loom {

bool is_fp8(DType dtype);
// The largest finite value of an FP8 dtype.
float fp8_max(DType format);
uint8_t fp8_encode(float value, DType format);
// Where the cast starts to clamp: the largest finite value plus half the step below it (464
// for e4m3, 61,440 for e5m2). A scaled magnitude beyond it would round past the largest
// finite value; the cast (satfinite) puts it on that value instead. The FP8 census
// (Ops::fp8_census) counts such values as clamped.
float fp8_clamp_bound(DType format);
float fp8_decode(uint8_t bits, DType format);

// Current scaling (no amax history): scale = fp8_max / amax, so the tensor's largest
// magnitude lands on the format's largest finite value. Where amax is 0, NaN or infinite
// there is nothing to map and the scale is 1; a scale that would overflow fp32 (amax below
// ~1e-36) is the largest finite fp32. So a scale is always finite and positive, and a run
// computes it again bit for bit from the same amax.
float fp8_scale(float amax, DType format);

// Block scaling (DeepSeek-V3's; docs/numerics.md): each block of a tensor (1 × 128 values of
// a row, or 128 × 128 of a weight) has its own scale, a power of two, so that its inverse is
// exact and a GEMM's dequantization multiplies by it without rounding:
// 2^floor(log2(fp8_scale(amax))), fp8_scale's fp32 result with its mantissa bits cleared
// (the scale is always a normal number: fp8_max ≥ 448 over amax ≤ FLT_MAX). The block's
// largest magnitude lands in (fp8_max / 2, fp8_max] (beyond by the rounding of fp8_scale's
// division at most, which saturation absorbs).
constexpr int64_t kFp8BlockSize = 128;
float fp8_block_scale(float amax, DType format);

}  // namespace loom
