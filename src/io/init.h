// Random initialization of a model, as transformers' PreTrainedModel._init_weights does it:
// every linear weight and the embedding ~ Normal(0, initializer_range = 0.02) (the config
// default of every supported family; no truncation), every RMSNorm weight = 1, every linear
// bias (Qwen2's q/k/v) = 0. A tied model's lm_head is the embedding.
//
// The values are a pure function of (seed, HF tensor name, element index), independent of
// the machine, the thread count and loom's fused layout, so another implementation can
// reproduce them tensor by tensor. With mix() the SplitMix64 finalizer
//   mix(z): z = (z ^ (z >> 30)) · 0xbf58476d1ce4e5b9; z = (z ^ (z >> 27)) · 0x94d049bb133111eb;
//           return z ^ (z >> 31)                       (all arithmetic mod 2^64),
// golden = 0x9e3779b97f4a7c15 and fnv1a64 the 64-bit FNV-1a hash of the name's bytes
// (offset basis 0xcbf29ce484222325, prime 0x100000001b3):
//   key    = mix(seed ^ mix(fnv1a64(hf_name)))        one SplitMix64 stream per tensor
//   r1, r2 = mix(key + golden · (2i + 1)), mix(key + golden · (2i + 2))
//                                                      outputs 2i+1 and 2i+2 of that stream,
//                                                      for element i (row-major) of the tensor
//   u1     = ((r1 >> 11) + 1) · 2^-53                  in (0, 1], so log(u1) is finite
//   u2     = (r2 >> 11) · 2^-53                        in [0, 1)
//   value  = (float)(0.02 · (sqrt(−2 · log(u1)) · cos(2π · u2)))  Box–Muller in double,
//                                                      2π being 2 · (the double nearest π)
// sqrt is exact in IEEE double; log and cos may differ between math libraries in the last
// bit of the double, which the rounding to float absorbs in all but ~1 in 2^29 values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/param_source.h"
#include "model/config.h"
#include "model/param_table.h"

namespace loom {

constexpr double kInitializerRange = 0.02;

// The values described above, any flat range of them (each element is computed on its own,
// so a range equals the same elements of the whole buffer bit for bit). `table` must outlive
// the source.
class RandomInitSource final : public ParamSource {
 public:
  RandomInitSource(const ModelConfig& config, const ParamTable& table, uint64_t seed);
  void read(int64_t begin, int64_t count, float* dst) override;

 private:
  const ParamTable& table_;
  HfTensorRanges ranges_;
  std::vector<uint64_t> keys_;  // per HF tensor: its stream's key
};

// LoRA's adapters as PEFT initializes them (init_lora_weights=True): each lora_A tensor
// [r, K] ~ Uniform(-1/√K, 1/√K) (torch's kaiming_uniform_ with a = √5), each lora_B zero, so the
// adapted model starts as the base. The values are a pure function of (seed, PEFT tensor
// name, element index) as above: with key and r1 as there (r1 the stream's output 2i + 1),
//   value = (float)((2 · (r1 >> 11) · 2^-53 − 1) / sqrt(K))
// `adapters` (model/lora.h lora_table_build) must outlive the source.
class LoraInitSource final : public ParamSource {
 public:
  LoraInitSource(const ParamTable& adapters, uint64_t seed);
  void read(int64_t begin, int64_t count, float* dst) override;

 private:
  const ParamTable& table_;
  HfTensorRanges ranges_;
  std::vector<uint64_t> keys_;  // per HF tensor: its stream's key
};

// Fills params[0, table.total_numel) as described above (RandomInitSource's whole range).
void init_random_params(const ModelConfig& config, const ParamTable& table, uint64_t seed, float* params);

// Element `index` of the Normal(0, 1) stream of the tensor `hf_name` (the formula above
// without the 0.02), exposed so that tests and other tools can check single values.
double init_standard_normal(uint64_t seed, const std::string& hf_name, uint64_t index);

}  // namespace loom
