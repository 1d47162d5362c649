// LoRA dropout's mask (docs/numerics.md, "LoRA"): which input values of an adapter a training
// micro-batch drops, as a pure function of where the value sits, so that the CPU twin and the
// CUDA kernel (both include this header) draw the same bits, every layout draws one rank's, a
// recomputed forward and the backward draw the forward's, and a resume draws the straight
// run's. Nothing is stored and no generator state travels between steps.
//
// The draws are SplitMix64's outputs (Steele, Lea and Flood, "Fast splittable pseudorandom
// number generators", 2014): output n of a generator seeded with s is mix(s + (n + 1) · γ),
// γ = 0x9E3779B97F4A7C15, mix the finalizer below. Each level of the value's address seeds the
// next with one of its outputs:
//
//   stream  = out(out(out(train.seed, step), layer), target)        (host, once a layer and target)
//   token   = out(out(stream, row), index)                          row: the token's row in the
//                                                                   step's global batch; index:
//                                                                   its place in that row
//   draw    = out(token, feature) >> 32                             feature: the input column's
//                                                                   index in the whole layer
//
// and the value is dropped where draw < threshold = ⌊p · 2³²⌋ (kept with probability 1 − p up
// to 2⁻³²), else scaled by 1 / (1 − p).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

namespace loom {

// SplitMix64's output n from seed s.
LOOM_HOST_DEVICE inline uint64_t lora_dropout_draw(uint64_t s, uint64_t n) {
  uint64_t z = s + (n + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The seed of one adapter's masks in one optimizer step (`target`: model/lora.h LoraTarget's
// value, q 0 ... down 6).
inline uint64_t lora_dropout_stream(uint64_t seed, int64_t step, int64_t layer, int target) {
  uint64_t s = lora_dropout_draw(seed, static_cast<uint64_t>(step));
  s = lora_dropout_draw(s, static_cast<uint64_t>(layer));
  return lora_dropout_draw(s, static_cast<uint64_t>(target));
}

// The seed of one token's draws.
LOOM_HOST_DEVICE inline uint64_t lora_dropout_token(uint64_t stream, int32_t row, int32_t index) {
  return lora_dropout_draw(lora_dropout_draw(stream, static_cast<uint64_t>(row)),
                           static_cast<uint64_t>(index));
}

// Whether the token's value in input column `feature` is kept.
LOOM_HOST_DEVICE inline bool lora_dropout_kept(uint64_t token, int64_t feature, uint32_t threshold) {
  return static_cast<uint32_t>(lora_dropout_draw(token, static_cast<uint64_t>(feature)) >> 32) >= threshold;
}

// ⌊p · 2³²⌋ for p in [0, 1).
inline uint32_t lora_dropout_threshold(double p) {
  return static_cast<uint32_t>(std::floor(p * 4294967296.0));
}

}  // namespace loom
