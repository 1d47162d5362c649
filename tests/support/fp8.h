// What the FP8 op tests share: a tensor's own quantization error, the bound an FP8 GEMM's
// error is judged by.
#pragma once

#include <cmath>
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

}  // namespace loom::test
