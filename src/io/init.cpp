#include "io/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"
#include "core/parallel.h"

namespace loom {
namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t stream_key(uint64_t seed, const std::string& hf_name) {
  return mix(seed ^ mix(fnv1a64(hf_name)));
}

double standard_normal(uint64_t key, uint64_t index) {
  uint64_t r1 = mix(key + kGolden * (2 * index + 1));
  uint64_t r2 = mix(key + kGolden * (2 * index + 2));
  double u1 = static_cast<double>((r1 >> 11) + 1) * 0x1p-53;
  double u2 = static_cast<double>(r2 >> 11) * 0x1p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

bool is_norm(ParamKind kind) {
  switch (kind) {
    case ParamKind::input_norm:
    case ParamKind::q_norm:
    case ParamKind::k_norm:
    case ParamKind::post_attn_norm:
    case ParamKind::final_norm: return true;
    default: return false;
  }
}

}  // namespace

double init_standard_normal(uint64_t seed, const std::string& hf_name, uint64_t index) {
  return standard_normal(stream_key(seed, hf_name), index);
}

RandomInitSource::RandomInitSource(const ModelConfig& config, const ParamTable& table, uint64_t seed)
    : table_(table), ranges_(table) {
  LOOM_ASSERT(table.total_numel == config.total_params(), "parameter table does not match the config");
  for (const HfTensorSpec& spec : table.hf_tensors) keys_.push_back(stream_key(seed, spec.hf_name));
}

void RandomInitSource::read(int64_t begin, int64_t count, float* dst) {
  for (const HfTensorRanges::Piece& piece : ranges_.pieces(begin, count)) {
    float* out = dst + piece.at;
    const ParamKind kind = table_.params[static_cast<size_t>(table_.hf_tensors[piece.tensor].param)].kind;
    if (is_norm(kind) || kind == ParamKind::qkv_bias) {
      const float value = kind == ParamKind::qkv_bias ? 0.0f : 1.0f;
      parallel_for(piece.count, int64_t{1} << 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = value;
      });
      continue;
    }
    const uint64_t key = keys_[piece.tensor];
    const int64_t first = piece.first;
    // 4,096 values per task: each costs a log and a cos, ~50 ns.
    parallel_for(piece.count, 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        out[i] =
            static_cast<float>(kInitializerRange * standard_normal(key, static_cast<uint64_t>(first + i)));
    });
  }
}

LoraInitSource::LoraInitSource(const ParamTable& adapters, uint64_t seed)
    : table_(adapters), ranges_(adapters) {
  for (const HfTensorSpec& spec : adapters.hf_tensors) keys_.push_back(stream_key(seed, spec.hf_name));
}

void LoraInitSource::read(int64_t begin, int64_t count, float* dst) {
  for (const HfTensorRanges::Piece& piece : ranges_.pieces(begin, count)) {
    float* out = dst + piece.at;
    const HfTensorSpec& spec = table_.hf_tensors[piece.tensor];
    const bool is_a = spec.hf_name.ends_with(".lora_A.weight");
    LOOM_ASSERT(is_a || spec.hf_name.ends_with(".lora_B.weight"), "a LoRA adapter tensor: " + spec.hf_name);
    if (!is_a) {
      std::fill_n(out, piece.count, 0.0f);
      continue;
    }
    const double bound = 1.0 / std::sqrt(static_cast<double>(spec.shape[1]));
    const uint64_t key = keys_[piece.tensor];
    for (int64_t i = 0; i < piece.count; ++i) {
      const uint64_t r1 = mix(key + kGolden * (2 * static_cast<uint64_t>(piece.first + i) + 1));
      out[i] = static_cast<float>((2.0 * static_cast<double>(r1 >> 11) * 0x1p-53 - 1.0) * bound);
    }
  }
}

void init_random_params(const ModelConfig& config, const ParamTable& table, uint64_t seed, float* params) {
  RandomInitSource(config, table, seed).read(0, table.total_numel, params);
}

}  // namespace loom
