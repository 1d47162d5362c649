// The generated Unicode tables (unicode_tables.cpp, made by gen_unicode_tables.py); read
// them through unicode.h, not directly.
#pragma once

#include <cstdint>

namespace loom::unicode_tables {

// Two-stage lookups: value(cp) = stage2[stage1[cp >> 8] * 256 + (cp & 0xFF)].
extern const uint8_t flags_stage1[0x110000 >> 8];
extern const uint8_t flags_stage2[];
extern const uint8_t ccc_stage1[0x110000 >> 8];
extern const uint8_t ccc_stage2[];

// Full canonical decompositions (Unicode 9.0, Hangul excluded), sorted by code point:
// decomposition_cp[i] decomposes to decomposition_pool[offset[i] .. offset[i + 1]).
extern const uint32_t decomposition_cp[];
extern const uint16_t decomposition_offset[];
extern const uint32_t decomposition_pool[];
extern const int decomposition_count;

// Primary composition pairs (Unicode 9.0, Hangul excluded), sorted by (first << 21) | second.
extern const uint64_t composition_pair[];
extern const uint32_t composition_result[];
extern const int composition_count;

}  // namespace loom::unicode_tables
