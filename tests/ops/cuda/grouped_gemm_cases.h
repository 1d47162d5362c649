// The MoE shapes and routing splits that test_grouped_gemm checks and grouped_gemm_perf
// times (ops/cuda/grouped_gemm.h), and the host-side data both make: bf16 values from a
// counter-based hash (hundreds of millions of them in a few hundred milliseconds, where a
// std::mt19937 normal takes seconds), and the experts' row counts.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom::test {

// Qwen3 MoE expert shapes: each expert's gate_up weight is [2·moe_ffn, hidden] and its
// down weight [hidden, moe_ffn].
struct ExpertShape {
  const char* name;
  int64_t n, k;
};
// Qwen3-30B-A3B: hidden 2,048, moe_intermediate 768, 128 experts.
constexpr ExpertShape kA3bGateUp{"30b-a3b gate_up", 1536, 2048};
constexpr ExpertShape kA3bDown{"30b-a3b down", 2048, 768};
// Qwen3-235B-A22B: hidden 4,096, moe_intermediate 1,536, 128 experts (16 a rank at EP 8).
constexpr ExpertShape k235bGateUp{"235b-a22b gate_up", 3072, 4096};
constexpr ExpertShape k235bDown{"235b-a22b down", 4096, 1536};

// The experts' row counts, as a router hands them over.
inline std::vector<int32_t> even_counts(int64_t experts, int32_t rows) {
  return std::vector<int32_t>(static_cast<size_t>(experts), rows);
}
// Each expert mean/2 .. 3·mean/2 rows, uniformly.
inline std::vector<int32_t> uneven_counts(int64_t experts, int32_t mean, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> rows(mean / 2, mean + mean / 2);
  std::vector<int32_t> counts(static_cast<size_t>(experts));
  for (int32_t& c : counts) c = rows(rng);
  return counts;
}
// `total` rows over the experts by Zipf's law (the i-th most popular gets ∝ 1/i), the ranks
// shuffled over the experts: a router with no load balancing. With 128 experts the busiest
// holds 18% of the rows, the least busy 0.14%.
inline std::vector<int32_t> zipf_counts(int64_t experts, int64_t total, uint32_t seed) {
  std::vector<double> weight(static_cast<size_t>(experts));
  for (size_t i = 0; i < weight.size(); ++i) weight[i] = 1.0 / static_cast<double>(i + 1);
  const double sum = std::accumulate(weight.begin(), weight.end(), 0.0);
  std::vector<int32_t> counts(weight.size());
  int64_t given = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    counts[i] = static_cast<int32_t>(std::floor(static_cast<double>(total) * weight[i] / sum));
    given += counts[i];
  }
  counts[0] += static_cast<int32_t>(total - given);
  std::shuffle(counts.begin(), counts.end(), std::mt19937(seed));
  return counts;
}

// offsets[e] = Σ counts before e, E + 1 of them.
inline std::vector<int32_t> offsets_of(const std::vector<int32_t>& counts) {
  std::vector<int32_t> offsets(counts.size() + 1, 0);
  for (size_t e = 0; e < counts.size(); ++e) offsets[e + 1] = offsets[e] + counts[e];
  return offsets;
}

// n bf16 values (their bits), uniform in [-scale, scale) from a hash of (seed, index).
inline std::vector<uint16_t> random_bf16_bits(int64_t n, uint64_t seed, float scale) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * 0x1p-24f;  // [0, 1)
    bits[static_cast<size_t>(i)] = float_to_bf16((2.0f * u - 1.0f) * scale).bits;
  }
  return bits;
}

inline std::vector<float> random_floats(int64_t n, uint64_t seed, float scale) {
  const std::vector<uint16_t> bits = random_bf16_bits(n, seed, scale);
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_float(bf16{bits[i]});
  return values;
}

}  // namespace loom::test
