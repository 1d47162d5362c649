// Where two arrays that must be bitwise equal differ, in words, for the failure messages of
// the tests that compare runs bit for bit (GPU optimizer, offload engine).
#pragma once

#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace loom {

// A value with its bits, so that a one-ulp difference shows.
template <typename T>
std::string describe_bits(T value) {
  char text[64];
  if constexpr (std::is_floating_point_v<T>)
    std::snprintf(text, sizeof(text), "%.9g (bits 0x%llx)", static_cast<double>(value),
                  static_cast<unsigned long long>(
                      std::bit_cast<std::conditional_t<sizeof(T) == 8, uint64_t, uint32_t>>(value)));
  else
    std::snprintf(text, sizeof(text), "0x%llx",
                  static_cast<unsigned long long>(static_cast<std::make_unsigned_t<T>>(value)));
  return text;
}

// "" when got and want hold the same bits; else the first differing element, both values
// and how many elements differ.
template <typename T>
std::string first_difference(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size())
    return "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      int64_t count = 0;
      for (size_t j = i; j < got.size(); ++j) count += std::memcmp(&got[j], &want[j], sizeof(T)) != 0;
      return "first at element " + std::to_string(i) + " (got " + describe_bits(got[i]) + ", want " +
             describe_bits(want[i]) + "), " + std::to_string(count) + " elements differ";
    }
  return "";
}

}  // namespace loom
