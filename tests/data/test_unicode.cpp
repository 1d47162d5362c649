#include <gtest/gtest.h>

#include "data/unicode.h"

namespace loom {
namespace {

TEST(Unicode, ClassesOfSampleCodePoints) {
  EXPECT_EQ(unicode_flags('a') & kUnicodeLetter, kUnicodeLetter);
  EXPECT_EQ(unicode_flags(0x105C0) & kUnicodeLetter, kUnicodeLetter);  // Todhri, Unicode 16.0
  EXPECT_EQ(unicode_flags(0x10940) & kUnicodeLetter, 0);               // Sidetic, Unicode 17.0
  EXPECT_EQ(unicode_flags(0x0663) & kUnicodeNumber, kUnicodeNumber);
  EXPECT_EQ(unicode_flags(0x3000) & kUnicodeSpace, kUnicodeSpace);
  EXPECT_EQ(unicode_flags(0x180E) & kUnicodeSpace, 0);  // no longer White_Space since 6.3
  EXPECT_EQ(unicode_flags(0x200B) & kUnicodeSpace, 0);
}

TEST(Unicode, NfcComposesReordersAndKeepsLaterMarks) {
  EXPECT_EQ(unicode_nfc("e\xCC\x81"), "\xC3\xA9");                                 // e + U+0301 -> é
  EXPECT_EQ(unicode_nfc("\xE2\x84\xAB"), "\xC3\x85");                              // U+212B -> Å
  EXPECT_EQ(unicode_nfc("\xC3\xA9\xCC\xA3"), "\xE1\xBA\xB9\xCC\x81");              // é + dot below
  EXPECT_EQ(unicode_nfc("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"), "\xEA\xB0\x81");  // jamo -> 각
  // U+07FD (Unicode 11) has ccc 0 in Unicode 9.0, so it does not move before U+0301.
  EXPECT_EQ(unicode_nfc("a\xDF\xBD\xCC\x81"), "a\xDF\xBD\xCC\x81");
  EXPECT_TRUE(unicode_nfc_quick_check("plain ascii and \xC3\xA9"));
  EXPECT_FALSE(unicode_nfc_quick_check("e\xCC\x81"));
}

TEST(Unicode, InvalidUtf8BecomesReplacementPerMaximalSubpart) {
  EXPECT_EQ(utf8_valid_prefix("ok\xC3"), 2u);
  EXPECT_EQ(utf8_replace_invalid("a\xF0\x9F\x98"), "a\xEF\xBF\xBD");        // truncated 4-byte: one
  EXPECT_EQ(utf8_replace_invalid("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong: two
  EXPECT_EQ(utf8_replace_invalid("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(utf8_replace_invalid("\xE2\x82\xAC"), "\xE2\x82\xAC");
}

}  // namespace
}  // namespace loom
