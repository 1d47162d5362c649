// The rotary position embedding's frequencies, for the variants the supported families use
// (docs/numerics.md): the default, inv_freq[i] = theta^(-2i/hd), and Llama 3's scaling, which
// divides the low frequencies by `factor`, keeps the high ones and blends those between.
// Both backends build their cos/sin tables on the host from these values, so the CPU and
// CUDA twins rotate by the same fp32 angles.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <vector>

namespace loom {

struct RopeSpec {
  float theta = 1e6f;
  // Llama 3's frequency-dependent scaling (rope_type "llama3"); off: the default RoPE.
  bool llama3 = false;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position = 8192;

  bool operator<(const RopeSpec& o) const {
    if (theta != o.theta) return theta < o.theta;
    if (llama3 != o.llama3) return llama3 < o.llama3;
    if (factor != o.factor) return factor < o.factor;
    if (low_freq_factor != o.low_freq_factor) return low_freq_factor < o.low_freq_factor;
    if (high_freq_factor != o.high_freq_factor) return high_freq_factor < o.high_freq_factor;
    return original_max_position < o.original_max_position;
  }
};

// inv_freq[i] for i < head_dim / 2 in fp32, in the order of operations of transformers'
// _compute_default_rope_parameters and _compute_llama3_parameters (torch's `a / tensor` is
// reciprocal(tensor) · a), so the angles match HF's to the last bit or close to it.
inline std::vector<float> rope_inv_freq(const RopeSpec& rope, int64_t head_dim) {
  const int64_t half = head_dim / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    float f = 1.0f / std::pow(rope.theta, exponent);
    if (rope.llama3) {
      const float context = static_cast<float>(rope.original_max_position);
      const float low_freq_wavelen = context / rope.low_freq_factor;
      const float high_freq_wavelen = context / rope.high_freq_factor;
      const float wavelen = (1.0f / f) * static_cast<float>(2.0 * std::numbers::pi);
      if (wavelen > low_freq_wavelen) {
        f = f / rope.factor;
      } else if (!(wavelen < high_freq_wavelen)) {
        const float smooth = ((1.0f / wavelen) * context - rope.low_freq_factor) /
                             (rope.high_freq_factor - rope.low_freq_factor);
        f = (1.0f - smooth) * f / rope.factor + smooth * f;
      }
    }
    inv_freq[static_cast<size_t>(i)] = f;
  }
  return inv_freq;
}

}  // namespace loom
