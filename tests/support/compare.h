// How far an array is from a reference, for the tests that judge numbers by a tolerance
// (the CUDA ops against their CPU twins, the trainer against transformers). The Pearson
// correlation of two curves is the convergence check's own (check/convergence.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace loom::test {

// ‖got − ref‖₂ / ‖ref‖₂ over n values, summed in fp64; the absolute ‖got − ref‖₂ where ref
// is all zeros.
inline double relative_l2(const float* got, const float* ref, int64_t n) {
  double err = 0, norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    err += d * d;
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
}

// The same over two arrays; infinite when their sizes differ, so that any bound fails.
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return std::numeric_limits<double>::infinity();
  return relative_l2(got.data(), ref.data(), static_cast<int64_t>(ref.size()));
}

}  // namespace loom::test
