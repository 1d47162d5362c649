#include "data/pretokenizer.h"

#include <array>

#include "data/unicode.h"

namespace loom {

const std::string_view kQwenSplitPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const std::string_view kLlama3SplitPattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

namespace {

constexpr uint8_t kClassMask = kUnicodeLetter | kUnicodeNumber | kUnicodeSpace;

// The class bits of each ASCII byte, so that ASCII text never reaches the Unicode tables.
constexpr std::array<uint8_t, 128> make_ascii_classes() {
  std::array<uint8_t, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) t[c] = kUnicodeLetter;
    if (c >= '0' && c <= '9') t[c] = kUnicodeNumber;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) t[c] = kUnicodeSpace;
  }
  return t;
}
constexpr std::array<uint8_t, 128> kAsciiClasses = make_ascii_classes();

struct Char {
  char32_t cp;
  uint8_t cls;  // kClassMask bits; 0 = "other" ([^\s\p{L}\p{N}])
  size_t end;   // offset just past it
};

class Scanner {
 public:
  Scanner(std::string_view text, int number_digits)
      : s_(text),
        p_(reinterpret_cast<const unsigned char*>(text.data())),
        n_(text.size()),
        number_digits_(number_digits) {}

  size_t size() const { return n_; }

  Char at(size_t i) const {
    if (p_[i] < 0x80) return {p_[i], kAsciiClasses[p_[i]], i + 1};
    size_t j = i;
    const char32_t cp = utf8_decode(s_, &j);
    return {cp, static_cast<uint8_t>(unicode_flags(cp) & kClassMask), j};
  }

  // End of the run of characters whose class is exactly `cls`, starting at i.
  size_t run_end(size_t i, uint8_t cls) const {
    while (i < n_) {
      if (p_[i] < 0x80) {
        if (kAsciiClasses[p_[i]] != cls) break;
        ++i;
        continue;
      }
      const Char c = at(i);
      if (c.cls != cls) break;
      i = c.end;
    }
    return i;
  }

  bool is_letter(size_t i) const { return i < n_ && at(i).cls == kUnicodeLetter; }
  bool is_other(size_t i) const { return i < n_ && at(i).cls == 0; }

  // (?i:'s|'t|'re|'ve|'m|'ll|'d) at i (s[i] is the apostrophe): the match length, or 0.
  size_t contraction(size_t i) const {
    if (i + 1 >= n_) return 0;
    const unsigned char a = fold(p_[i + 1]);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if (p_[i + 1] == 0xC5 && i + 2 < n_ && p_[i + 2] == 0xBF) return 3;  // U+017F folds to s
    if (i + 2 >= n_) return 0;
    const unsigned char b = fold(p_[i + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  // The end of the match that starts at i.
  size_t match(size_t i) const {
    const Char c0 = at(i);
    if (c0.cp == '\'') {
      const size_t len = contraction(i);
      if (len != 0) return i + len;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c0.cls == kUnicodeLetter) return run_end(c0.end, kUnicodeLetter);
    const bool newline = c0.cp == '\r' || c0.cp == '\n';
    if (!newline && c0.cls != kUnicodeNumber && is_letter(c0.end)) {
      return run_end(c0.end, kUnicodeLetter);
    }
    // \p{N}{1,number_digits}
    if (c0.cls == kUnicodeNumber) {
      size_t end = c0.end;
      for (int k = 1; k < number_digits_ && end < n_; ++k) {
        const Char c = at(end);
        if (c.cls != kUnicodeNumber) break;
        end = c.end;
      }
      return end;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    if (c0.cls == 0) return newlines_end(run_end(c0.end, 0));
    if (c0.cp == ' ' && is_other(c0.end)) return newlines_end(run_end(c0.end, 0));
    // c0 is white space. \s*[\r\n]+ backtracks to just after the run's last \r or \n.
    size_t last_newline_end = 0, last_start = i, end = i;
    while (end < n_) {
      const Char c = end == i ? c0 : at(end);
      if (c.cls != kUnicodeSpace) break;
      if (c.cp == '\r' || c.cp == '\n') last_newline_end = c.end;
      last_start = end;
      end = c.end;
    }
    if (last_newline_end != 0) return last_newline_end;
    // \s+(?!\S): the whole run at the end of the text, else all but its last character.
    if (end == n_) return end;
    if (last_start > i) return last_start;
    // \s+
    return end;
  }

 private:
  static unsigned char fold(unsigned char b) { return (b >= 'A' && b <= 'Z') ? b | 0x20 : b; }

  size_t newlines_end(size_t i) const {
    while (i < n_ && (p_[i] == '\r' || p_[i] == '\n')) ++i;
    return i;
  }

  std::string_view s_;
  const unsigned char* p_;
  size_t n_;
  int number_digits_;
};

}  // namespace

void pretokenize(std::string_view text, int number_digits, std::vector<size_t>* ends) {
  const Scanner scanner(text, number_digits);
  for (size_t i = 0; i < scanner.size();) {
    i = scanner.match(i);
    ends->push_back(i);
  }
}

}  // namespace loom
