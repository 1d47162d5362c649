// Element types and bf16 conversion.
//
// bf16 is the high 16 bits of an IEEE fp32. fp32 -> bf16 rounds to nearest, ties to even,
// as PyTorch and the hardware do; NaN stays NaN (quiet). bf16 -> fp32 is exact.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>

namespace loom {

// e4m3 and e5m2 are OCP FP8 (core/fp8.h): the FP8 linear layers' GEMM operands.
enum class DType : uint8_t { f32, bf16, i32, i16, u8, i64, f64, e4m3, e5m2 };

size_t dtype_size(DType dtype);
std::string dtype_name(DType dtype);  // the safetensors spelling: F32, BF16, I32, ...
// Parses a safetensors dtype name; returns false for one loom does not handle.
bool dtype_from_name(const std::string& name, DType* dtype);

struct bf16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(bf16 value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16);
}

inline bf16 float_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return bf16{static_cast<uint16_t>((bits + rounding) >> 16)};
}

}  // namespace loom
