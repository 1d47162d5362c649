// The precision-aware fp32 master of TE FusedAdam (`store_param_remainders`, TE 2.1+ as used by
// Megatron's --use-precision-aware-optimizer): the bf16 model weight holds the high 16 bits of
// the fp32 master, rounded, and an int16 remainder holds the low 16 bits. 4 bytes per parameter
// instead of the 6 of bf16 weight + fp32 master, with no loss: the master rebuilds bit for bit.
//
// Read from transformer_engine/common/multi_tensor/adam.cu, AdamFunctorMasterParamRemainder:
//   split:   p = high 16 bits, rem = low 16 bits (as int16); if rem < 0: p += 1
//   rebuild: if rem < 0: p -= 1; master = (p << 16) | (rem & 0xffff)
// Remainders start at 0 (TE initialize_state: zeros_like(param, int16)), so master == weight.
//
// Why the split rounds to nearest, ties away from zero: below the sign bit an IEEE float's bits
// grow with its magnitude, so truncating to the high half rounds the magnitude down and adding
// 1 to it steps one bf16 ulp away from zero (the mantissa carries into the exponent, which is
// still the next bf16 magnitude). rem < 0 means low ≥ 0x8000, i.e. the dropped part is at least
// half a bf16 ulp: round up in magnitude, ties included. That differs from the round-to-nearest-
// even of float_to_bf16 (core/dtype.h) only on exact ties with an even high half:
// 1 + 2⁻⁸ (0x3f808000) splits to 0x3f81 where RNE gives 0x3f80.
// Edge cases (the round trip stays exact for all 2³² patterns, since rebuild undoes split in
// 16-bit wrapping arithmetic):
//  - the sign never changes for non-NaN values: a carry from 0x7fff or 0xffff needs a NaN.
//  - finite masters ≥ bf16 max + ½ ulp (e.g. FLT_MAX) give a bf16 weight of ±inf, as RNE does.
//  - ±inf splits to ±inf with rem 0.
//  - NaN masters may give a non-NaN weight: 0x7f80'0001..0x7f80'7fff give +inf, and
//    0x7fff'8000..0x7fff'ffff wrap to 0x8000 (−0); likewise for negative NaNs (-inf, +0).
#pragma once

#include <bit>
#include <cstdint>

namespace loom {

inline void master_split(float master, uint16_t* bf16_bits, int16_t* remainder) {
  const uint32_t bits = std::bit_cast<uint32_t>(master);
  uint16_t high = static_cast<uint16_t>(bits >> 16);
  const int16_t rem = std::bit_cast<int16_t>(static_cast<uint16_t>(bits & 0xffffu));
  if (rem < 0) ++high;  // the low half is ≥ half a bf16 ulp: round the magnitude up
  *bf16_bits = high;
  *remainder = rem;
}

inline float master_rebuild(uint16_t bf16_bits, int16_t remainder) {
  uint16_t high = bf16_bits;
  if (remainder < 0) --high;  // undo the split's round-up
  return std::bit_cast<float>((uint32_t{high} << 16) | std::bit_cast<uint16_t>(remainder));
}

// Arrays of n elements, threaded.
void master_split_array(const float* master, int64_t n, uint16_t* bf16_bits, int16_t* remainder);
void master_rebuild_array(const uint16_t* bf16_bits, const int16_t* remainder, int64_t n, float* master);

}  // namespace loom
