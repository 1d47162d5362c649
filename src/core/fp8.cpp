#include "core/fp8.h"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace loom {
namespace {

struct Fp8Format {
  int exponent_bits, mantissa_bits, bias;
  uint8_t largest_code;  // of the largest finite positive value
};

Fp8Format format_of(DType dtype) {
  LOOM_ASSERT(is_fp8(dtype), "not an FP8 dtype");
  return dtype == DType::e4m3 ? Fp8Format{4, 3, 7, 0x7e} : Fp8Format{5, 2, 15, 0x7b};
}

// The value of a positive code: subnormal below the smallest exponent, else 1.m · 2^(e − bias).
float positive_value(uint8_t code, const Fp8Format& f) {
  const int exponent = code >> f.mantissa_bits;
  const int mantissa = code & ((1 << f.mantissa_bits) - 1);
  const float fraction = static_cast<float>(mantissa) / static_cast<float>(1 << f.mantissa_bits);
  if (exponent == 0) return std::ldexp(fraction, 1 - f.bias);
  return std::ldexp(1.0f + fraction, exponent - f.bias);
}

}  // namespace

bool is_fp8(DType dtype) {
  return dtype == DType::e4m3 || dtype == DType::e5m2;
}

float fp8_max(DType format) {
  const Fp8Format f = format_of(format);
  return positive_value(f.largest_code, f);
}

float fp8_clamp_bound(DType format) {
  const Fp8Format f = format_of(format);
  const float largest = positive_value(f.largest_code, f);
  const float below = positive_value(static_cast<uint8_t>(f.largest_code - 1), f);
  return largest + (largest - below) / 2;
}

uint8_t fp8_encode(float value, DType format) {
  const Fp8Format f = format_of(format);
  const uint8_t sign = std::signbit(value) ? 0x80 : 0x00;
  if (std::isnan(value)) return sign | 0x7f;  // a NaN of either format
  const double magnitude = std::fabs(static_cast<double>(value));
  if (magnitude >= positive_value(f.largest_code, f)) return sign | f.largest_code;
  // The positive codes up to the largest finite one increase with their values: find the
  // last at or below the magnitude, then round between it and the next.
  uint8_t low = 0, high = f.largest_code;
  while (high - low > 1) {
    const auto mid = static_cast<uint8_t>((low + high) / 2);
    if (positive_value(mid, f) <= magnitude)
      low = mid;
    else
      high = mid;
  }
  // Exact in double: both sides are fp32 values within a factor of two of each other.
  const double below = magnitude - positive_value(low, f), above = positive_value(high, f) - magnitude;
  uint8_t code = low;
  if (above < below || (above == below && (low & 1u))) code = high;
  return sign | code;
}

float fp8_decode(uint8_t bits, DType format) {
  const Fp8Format f = format_of(format);
  const uint8_t code = bits & 0x7f;
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  if (code > f.largest_code) {
    if (format == DType::e5m2 && code == 0x7c) return sign * INFINITY;
    return NAN;
  }
  return sign * positive_value(code, f);
}

float fp8_scale(float amax, DType format) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  const float scale = fp8_max(format) / amax;
  return std::isfinite(scale) ? scale : FLT_MAX;
}

float fp8_block_scale(float amax, DType format) {
  const float scale = fp8_scale(amax, format);
  uint32_t bits = 0;
  std::memcpy(&bits, &scale, sizeof bits);
  bits &= 0xff800000u;  // sign and exponent: the power of two at or below
  float power = 0;
  std::memcpy(&power, &bits, sizeof power);
  return power;
}

}  // namespace loom
