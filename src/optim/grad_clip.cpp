#include "optim/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/parallel.h"

namespace loom {

double grad_sum_squares(const float* grad, int64_t n) {
  if (n <= 0) return 0.0;
  const int64_t chunks = (n + kGradNormChunk - 1) / kGradNormChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  parallel_for(chunks, 1, [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      const int64_t end = std::min(n, (c + 1) * kGradNormChunk);
      double sum = 0.0;
      for (int64_t i = c * kGradNormChunk; i < end; ++i) {
        const double g = grad[i];
        sum += g * g;
      }
      partial[static_cast<size_t>(c)] = sum;
    }
  });
  double total = 0.0;
  for (double sum : partial) total += sum;
  return total;
}

double grad_norm_l2(const float* grad, int64_t n) {
  return std::sqrt(grad_sum_squares(grad, n));
}

float grad_clip_coefficient(double norm, double clip) {
  if (!(clip > 0.0)) return 1.0f;
  const double coeff = clip / (norm + 1.0e-6);
  return coeff < 1.0 ? static_cast<float>(coeff) : 1.0f;
}

void grad_scale(float* grad, int64_t n, float factor) {
  parallel_for(n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) grad[i] *= factor;
  });
}

}  // namespace loom
