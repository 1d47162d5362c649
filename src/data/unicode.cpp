#include "data/unicode.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace loom {
namespace {

namespace ut = unicode_tables;

// Hangul syllables compose and decompose algorithmically (Unicode §3.12).
constexpr char32_t kHangulSBase = 0xAC00, kHangulLBase = 0x1100, kHangulVBase = 0x1161, kHangulTBase = 0x11A7;
constexpr char32_t kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr char32_t kHangulNCount = kHangulVCount * kHangulTCount;
constexpr char32_t kHangulSCount = kHangulLCount * kHangulNCount;

// Length of the well-formed UTF-8 sequence at s[i], or 0 when the bytes there are
// ill-formed; *subpart is then the length of the maximal subpart (at least 1).
size_t utf8_sequence_length(const unsigned char* s, size_t n, size_t* subpart) {
  const unsigned char b0 = s[0];
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 < 0x80) return 1;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *subpart = 1;
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    const unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
    if (k >= n || s[k] < lo_k || s[k] > hi_k) {
      *subpart = k;
      return 0;
    }
  }
  return need;
}

uint32_t decomposition_index(char32_t cp) {
  const uint32_t* begin = ut::decomposition_cp;
  const uint32_t* end = begin + ut::decomposition_count;
  const uint32_t* it = std::lower_bound(begin, end, static_cast<uint32_t>(cp));
  return (it != end && *it == cp) ? static_cast<uint32_t>(it - begin) : UINT32_MAX;
}

void decompose_append(char32_t cp, std::vector<char32_t>* out) {
  if (cp >= kHangulSBase && cp < kHangulSBase + kHangulSCount) {
    const char32_t s = cp - kHangulSBase;
    out->push_back(kHangulLBase + s / kHangulNCount);
    out->push_back(kHangulVBase + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out->push_back(kHangulTBase + s % kHangulTCount);
    return;
  }
  if (!(unicode_flags(cp) & kUnicodeDecomposes)) {
    out->push_back(cp);
    return;
  }
  const uint32_t i = decomposition_index(cp);
  if (i == UINT32_MAX) {
    out->push_back(cp);
    return;
  }
  for (uint32_t k = ut::decomposition_offset[i]; k < ut::decomposition_offset[i + 1]; ++k)
    out->push_back(ut::decomposition_pool[k]);
}

// The primary composite of (a, b), or 0 when there is none.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kHangulLBase && a < kHangulLBase + kHangulLCount && b >= kHangulVBase &&
      b < kHangulVBase + kHangulVCount)
    return kHangulSBase + ((a - kHangulLBase) * kHangulVCount + (b - kHangulVBase)) * kHangulTCount;
  if (a >= kHangulSBase && a < kHangulSBase + kHangulSCount && (a - kHangulSBase) % kHangulTCount == 0 &&
      b > kHangulTBase && b < kHangulTBase + kHangulTCount)
    return a + (b - kHangulTBase);
  const uint64_t key = (static_cast<uint64_t>(a) << 21) | b;
  const uint64_t* begin = ut::composition_pair;
  const uint64_t* end = begin + ut::composition_count;
  const uint64_t* it = std::lower_bound(begin, end, key);
  return (it != end && *it == key) ? ut::composition_result[it - begin] : 0;
}

}  // namespace

void utf8_append(std::string* out, char32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t utf8_valid_prefix(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs 8 bytes at a time: most text is mostly ASCII.
    while (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    size_t subpart = 0;
    const size_t len = utf8_sequence_length(p + i, n - i, &subpart);
    if (len == 0) return i;
    i += len;
  }
  return n;
}

std::string utf8_replace_invalid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  std::string out;
  out.reserve(n + 8);
  size_t i = 0;
  while (i < n) {
    size_t subpart = 0;
    const size_t len = utf8_sequence_length(p + i, n - i, &subpart);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      i += subpart;
    } else {
      out.append(s.data() + i, len);
      i += len;
    }
  }
  return out;
}

bool unicode_nfc_quick_check(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    // Every code point below U+0300 (lead bytes below 0xCC) is NFC and composes with
    // nothing before it.
    if (p[i] < 0xCC) {
      i += p[i] < 0x80 ? 1 : 2;
      continue;
    }
    if (unicode_flags(utf8_decode(s, &i)) & kUnicodeNfcCheck) return false;
  }
  return true;
}

std::string unicode_nfc(std::string_view s) {
  if (unicode_nfc_quick_check(s)) return std::string(s);
  std::vector<char32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) decompose_append(utf8_decode(s, &i), &cps);
  // Canonical ordering: a stable sort by ccc of each run of non-starters.
  for (size_t i = 0; i < cps.size();) {
    if (unicode_ccc(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && unicode_ccc(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i),
                     cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return unicode_ccc(a) < unicode_ccc(b); });
    i = j;
  }
  // Canonical composition: each character joins the last starter unless a character in
  // between blocks it (ccc 0, or ccc not below its own).
  std::vector<char32_t> out;
  out.reserve(cps.size());
  size_t starter = SIZE_MAX;
  for (char32_t cp : cps) {
    const uint8_t ccc = unicode_ccc(cp);
    if (starter != SIZE_MAX) {
      const bool adjacent = out.size() == starter + 1;
      const uint8_t last_ccc = adjacent ? 0 : unicode_ccc(out.back());
      if (adjacent || (last_ccc != 0 && last_ccc < ccc)) {
        const char32_t composite = compose_pair(out[starter], cp);
        if (composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (ccc == 0) starter = out.size();
    out.push_back(cp);
  }
  std::string result;
  result.reserve(s.size());
  for (char32_t cp : out) utf8_append(&result, cp);
  return result;
}

}  // namespace loom
