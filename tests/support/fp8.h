// What the FP8 op tests share: a tensor's own quantization error (tensor or block scaling),
// the bound an FP8 GEMM's error is judged by, and the exact product it is measured against.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/fp8.h"
#include "support/compare.h"

namespace loom::test {

// Relative L2 of x's quantize-dequantize in `format` under its own amax (core/fp8.h).
inline double fp8_qdq_error(const std::vector<float>& x, DType format) {
  float amax = 0;
  for (float v : x) amax = std::fmax(amax, std::fabs(v));
  const float scale = fp8_scale(amax, format);
  std::vector<float> back(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    back[i] = fp8_decode(fp8_encode(x[i] * scale, format), format) / scale;
  return relative_l2(back, x);
}

// The same under block scaling (core/fp8.h fp8_block_scale): x [rows, cols] in blocks of
// block_rows × 128 (1 for activations and gradients, 128 for weights), each under its own
// amax; a last block shorter than 128 is a block of its own, as the CPU twin has it.
inline double fp8_block_qdq_error(const std::vector<float>& x, int64_t rows, int64_t cols, int64_t block_rows,
                                  DType format) {
  std::vector<float> back(x.size());
  for (int64_t r0 = 0; r0 < rows; r0 += block_rows)
    for (int64_t c0 = 0; c0 < cols; c0 += kFp8BlockSize) {
      const int64_t r1 = std::min(rows, r0 + block_rows), c1 = std::min(cols, c0 + kFp8BlockSize);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(r * cols + c)]));
      const float scale = fp8_block_scale(amax, format);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const size_t i = static_cast<size_t>(r * cols + c);
          back[i] = fp8_decode(fp8_encode(x[i] * scale, format), format) / scale;
        }
    }
  return relative_l2(back, x);
}

// out[m, n] = a[m, k] · b[n, k]ᵀ summed in fp64: what an FP8 GEMM's error is measured against.
inline std::vector<float> reference_product(const std::vector<float>& a, const std::vector<float>& b,
                                            int64_t m, int64_t n, int64_t k) {
  std::vector<float> out(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p)
        s += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(j * k + p)];
      out[static_cast<size_t>(i * n + j)] = static_cast<float>(s);
    }
  return out;
}

}  // namespace loom::test
