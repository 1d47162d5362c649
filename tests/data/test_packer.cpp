#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "data/packer.h"

namespace loom {
namespace {

// The literals come from following packer.h's description in Python, independently of the
// C++ (M = 2^64 - 1):
//   def perm(n, s):
//     def nxt():
//       nonlocal s; s = (s + 0x9E3779B97F4A7C15) & M; z = s
//       z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M; z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
//       return z ^ (z >> 31)
//     p = list(range(n))
//     for i in range(n - 1, 0, -1): j = (nxt() * (i + 1)) >> 64; p[i], p[j] = p[j], p[i]
//     return p
TEST(DataPermutation, MatchesTheDocumentedGenerator) {
  EXPECT_EQ(data_permutation(10, 1234), (std::vector<uint64_t>{8, 6, 0, 9, 3, 4, 2, 1, 5, 7}));
  EXPECT_EQ(data_permutation(10, 1235), (std::vector<uint64_t>{6, 7, 8, 1, 2, 0, 4, 5, 3, 9}));
  EXPECT_EQ(data_permutation(1, 7), (std::vector<uint64_t>{0}));
  EXPECT_EQ(data_permutation(2, 0), (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(data_permutation(0, 0).empty());
}

TEST(DataPermutation, IsAReproduciblePermutation) {
  const std::vector<uint64_t> p = data_permutation(1000, 99);
  EXPECT_EQ(p, data_permutation(1000, 99));
  EXPECT_NE(p, data_permutation(1000, 100));
  std::vector<uint64_t> sorted = p, iota(1000);
  std::sort(sorted.begin(), sorted.end());
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
}

struct Rows {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<uint8_t>> masks;
};

RowPacker packer_into(Rows* rows, int64_t row_tokens, int32_t eos) {
  return RowPacker(row_tokens, eos, [rows, row_tokens](const int32_t* t, const uint8_t* m) {
    rows->tokens.emplace_back(t, t + row_tokens);
    rows->masks.emplace_back(m, m + row_tokens);
  });
}

// EOS (mask 0) between conversations, not before the first; consecutive rows; a row with
// no supervised target skipped; the partial tail dropped; nothing padded.
TEST(RowPacker, PacksByTheRules) {
  Rows rows;
  RowPacker packer = packer_into(&rows, 4, 99);
  packer.add(std::vector<int32_t>{1, 2, 3}, std::vector<uint8_t>{0, 1, 1});
  packer.add(std::vector<int32_t>{4, 5}, std::vector<uint8_t>{0, 0});
  packer.add(std::vector<int32_t>{6, 7, 8, 9, 10, 11, 12}, std::vector<uint8_t>{0, 0, 0, 0, 1, 0, 0});
  // Stream: 1 2 3 99 | 4 5 99 6 | 7 8 9 10 | 11 12
  const PackStats stats = packer.finish();
  ASSERT_EQ(rows.tokens.size(), 2u);
  EXPECT_EQ(rows.tokens[0], (std::vector<int32_t>{1, 2, 3, 99}));
  EXPECT_EQ(rows.masks[0], (std::vector<uint8_t>{0, 1, 1, 0}));
  EXPECT_EQ(rows.tokens[1], (std::vector<int32_t>{7, 8, 9, 10}));
  EXPECT_EQ(rows.masks[1], (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(stats.conversations, 3);
  EXPECT_EQ(stats.rows, 2);
  EXPECT_EQ(stats.rows_without_target, 1);
  EXPECT_EQ(stats.tail_tokens_dropped, 2);
  EXPECT_EQ(stats.supervised_tokens, 3);
}

// Token 0 of a row is no position's target: a row whose only mask 1 is there is skipped.
TEST(RowPacker, PositionZeroIsNotATarget) {
  Rows rows;
  RowPacker packer = packer_into(&rows, 3, 99);
  packer.add(std::vector<int32_t>{5, 6, 7}, std::vector<uint8_t>{1, 0, 0});
  packer.add(std::vector<int32_t>{8, 9}, std::vector<uint8_t>{0, 1});
  const PackStats stats = packer.finish();
  ASSERT_EQ(rows.tokens.size(), 1u);
  EXPECT_EQ(rows.tokens[0], (std::vector<int32_t>{99, 8, 9}));
  EXPECT_EQ(rows.masks[0], (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(stats.rows_without_target, 1);
  EXPECT_EQ(stats.tail_tokens_dropped, 0);
}

// A conversation longer than a row runs on into the next rows.
TEST(RowPacker, SplitsLongConversationsAcrossRows) {
  Rows rows;
  RowPacker packer = packer_into(&rows, 2, 99);
  packer.add(std::vector<int32_t>{1, 2, 3, 4, 5}, std::vector<uint8_t>{1, 1, 1, 1, 1});
  const PackStats stats = packer.finish();
  ASSERT_EQ(rows.tokens.size(), 2u);
  EXPECT_EQ(rows.tokens[1], (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(stats.tail_tokens_dropped, 1);
  EXPECT_EQ(stats.supervised_tokens, 4);
}

TEST(RowPacker, RefusesRowsWithoutRoomForATarget) {
  EXPECT_THROW(RowPacker(1, 0, [](const int32_t*, const uint8_t*) {}), InputError);
}

}  // namespace
}  // namespace loom
