#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/parallel.h"

namespace loom {
namespace {

TEST(ParallelFor, CoversEveryIndexOnce) {
  for (int64_t n : {0, 1, 7, 1000, 100003}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << i;
  }
}

TEST(ParallelFor, NestedRegionsRunInline) {
  std::atomic<int64_t> total{0};
  parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(10, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  EXPECT_EQ(total.load(), 80);
}

}  // namespace
}  // namespace loom
