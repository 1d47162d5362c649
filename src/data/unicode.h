// UTF-8 and the Unicode properties the tokenizer needs: character classes of the
// pre-tokenizer regex and NFC normalisation.
//
// Versions follow the oracle (Hugging Face `tokenizers`): classes are Unicode 16.0, NFC is
// Unicode 9.0 (see gen_unicode_tables.py for how each was established).
//
// Invalid UTF-8: loom replaces every maximal ill-formed subsequence (Unicode §3.9, "U+FFFD
// substitution of maximal subparts", what Python's errors="replace" and Rust's
// from_utf8_lossy do) with U+FFFD before tokenizing. Text is bytes to loom and valid UTF-8
// to the oracle, so the oracle is run on bytes.decode("utf-8", "replace").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "data/unicode_tables.h"

namespace loom {

// Bits of unicode_flags().
inline constexpr uint8_t kUnicodeLetter = 1;       // general category L*: \p{L}
inline constexpr uint8_t kUnicodeNumber = 2;       // general category N*: \p{N}
inline constexpr uint8_t kUnicodeSpace = 4;        // White_Space: \s
inline constexpr uint8_t kUnicodeWord = 8;         // Rust regex's \w
inline constexpr uint8_t kUnicodeNfcCheck = 16;    // NFC quick check not "Yes", or ccc != 0
inline constexpr uint8_t kUnicodeDecomposes = 32;  // has a canonical decomposition (not Hangul)

inline uint8_t unicode_flags(char32_t cp) {
  if (cp >= 0x110000) return 0;
  return unicode_tables::flags_stage2[unicode_tables::flags_stage1[cp >> 8] * 256u + (cp & 0xFFu)];
}

// Canonical combining class (Unicode 9.0).
inline uint8_t unicode_ccc(char32_t cp) {
  if (cp >= 0x110000) return 0;
  return unicode_tables::ccc_stage2[unicode_tables::ccc_stage1[cp >> 8] * 256u + (cp & 0xFFu)];
}

// Decodes the code point at s[*pos] of VALID UTF-8 and advances *pos past it.
inline char32_t utf8_decode(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  if (p[0] < 0x80) {
    *pos += 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *pos += 2;
    return static_cast<char32_t>(((p[0] & 0x1F) << 6) | (p[1] & 0x3F));
  }
  if (p[0] < 0xF0) {
    *pos += 3;
    return static_cast<char32_t>(((p[0] & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F));
  }
  *pos += 4;
  return static_cast<char32_t>(((p[0] & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) |
                               (p[3] & 0x3F));
}

// Appends the UTF-8 encoding of cp (a Unicode scalar value).
void utf8_append(std::string* out, char32_t cp);

// Length of the longest valid UTF-8 prefix of s (s.size() when s is valid).
size_t utf8_valid_prefix(std::string_view s);

// s with each maximal ill-formed subsequence replaced by U+FFFD (EF BF BD).
std::string utf8_replace_invalid(std::string_view s);

// Whether valid UTF-8 `s` is certainly NFC by the quick check (false: maybe not).
bool unicode_nfc_quick_check(std::string_view s);

// NFC of valid UTF-8 `s` (Unicode 9.0 data: decompose, reorder by ccc, compose).
std::string unicode_nfc(std::string_view s);

}  // namespace loom
