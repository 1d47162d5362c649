#include "model/lora.h"

#include "core/error.h"
#include "model/shard_spec.h"
#include "ops/lora_dropout.h"

namespace loom {
namespace {

constexpr const char* kModules[kLoraTargets] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};

// The module's path under a decoder layer, as transformers names it.
std::string module_path(LoraTarget target) {
  const bool attention = target == LoraTarget::q || target == LoraTarget::k || target == LoraTarget::v ||
                         target == LoraTarget::o;
  return std::string(attention ? "self_attn." : "mlp.") + lora_target_module(target);
}

}  // namespace

LoraDropoutMask lora_dropout_mask(const LoraDropoutBatch& batch, int64_t layer, LoraTarget target,
                                  int64_t feature_begin) {
  LOOM_ASSERT(batch.active() && batch.p < 1, "a LoRA dropout mask needs 0 < p < 1");
  LoraDropoutMask mask;
  mask.stream = lora_dropout_stream(batch.seed, batch.step, layer, static_cast<int>(target));
  mask.threshold = lora_dropout_threshold(batch.p);
  mask.scale = static_cast<float>(1.0 / (1.0 - batch.p));
  mask.tokens = batch.tokens;
  mask.feature_begin = feature_begin;
  return mask;
}

const char* lora_target_module(LoraTarget target) {
  return kModules[static_cast<size_t>(target)];
}

bool lora_target_parse(const std::string& module, LoraTarget* target) {
  for (int i = 0; i < kLoraTargets; ++i)
    if (module == kModules[i]) {
      *target = static_cast<LoraTarget>(i);
      return true;
    }
  return false;
}

ParamKind lora_layer_of(LoraTarget target) {
  switch (target) {
    case LoraTarget::q:
    case LoraTarget::k:
    case LoraTarget::v: return ParamKind::qkv;
    case LoraTarget::o: return ParamKind::o_proj;
    case LoraTarget::gate:
    case LoraTarget::up: return ParamKind::gate_up;
    case LoraTarget::down: return ParamKind::down;
  }
  LOOM_ASSERT(false, "not a LoRA target");
  return ParamKind::qkv;
}

std::vector<LoraTarget> lora_layer_targets(ParamKind layer) {
  switch (layer) {
    case ParamKind::qkv: return {LoraTarget::q, LoraTarget::k, LoraTarget::v};
    case ParamKind::o_proj: return {LoraTarget::o};
    case ParamKind::gate_up: return {LoraTarget::gate, LoraTarget::up};
    case ParamKind::down: return {LoraTarget::down};
    default: LOOM_ASSERT(false, "LoRA adapts the four linear layers only"); return {};
  }
}

ParamKind lora_a_kind(ParamKind layer) {
  switch (layer) {
    case ParamKind::qkv: return ParamKind::lora_qkv_a;
    case ParamKind::o_proj: return ParamKind::lora_o_proj_a;
    case ParamKind::gate_up: return ParamKind::lora_gate_up_a;
    case ParamKind::down: return ParamKind::lora_down_a;
    default: LOOM_ASSERT(false, "LoRA adapts the four linear layers only"); return layer;
  }
}

ParamKind lora_b_kind(LoraTarget target) {
  constexpr ParamKind kinds[kLoraTargets] = {
      ParamKind::lora_q_b,    ParamKind::lora_k_b,  ParamKind::lora_v_b,   ParamKind::lora_o_b,
      ParamKind::lora_gate_b, ParamKind::lora_up_b, ParamKind::lora_down_b};
  return kinds[static_cast<size_t>(target)];
}

int64_t lora_target_row(const ModelConfig& c, LoraTarget target, int64_t tp) {
  const HeadLayout heads = shard_heads(c, tp);
  const int64_t q_rows = heads.q_heads * c.head_dim, kv_rows = heads.kv_heads * c.head_dim;
  switch (target) {
    case LoraTarget::k: return q_rows;
    case LoraTarget::v: return q_rows + kv_rows;
    case LoraTarget::up: return shard_ffn(c, tp);
    default: return 0;
  }
}

int64_t lora_target_rows(const ModelConfig& c, LoraTarget target) {
  switch (target) {
    case LoraTarget::q: return c.q_dim();
    case LoraTarget::k:
    case LoraTarget::v: return c.kv_dim();
    case LoraTarget::o:
    case LoraTarget::down: return c.hidden_size;
    case LoraTarget::gate:
    case LoraTarget::up: return c.intermediate_size;
  }
  LOOM_ASSERT(false, "not a LoRA target");
  return 0;
}

ParamTable lora_table_build(const ModelConfig& c, const LoraConfig& lora) {
  LOOM_ASSERT(lora.enabled() && c.num_experts == 0, "LoRA adapters of a dense model");
  ParamTable table;
  auto add = [&](std::string name, ParamKind kind, int64_t layer, Shape shape) {
    const int index = static_cast<int>(table.params.size());
    table.params.push_back({std::move(name), kind, layer, shape, table.total_numel});
    table.total_numel += shape.numel();
    return index;
  };
  const int64_t r = lora.rank;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string hp = "base_model.model.model.layers." + std::to_string(l) + ".";
    for (ParamKind layer : {ParamKind::qkv, ParamKind::o_proj, ParamKind::gate_up, ParamKind::down}) {
      std::vector<LoraTarget> targets;
      for (LoraTarget t : lora_layer_targets(layer))
        if (lora.targets_module(t)) targets.push_back(t);
      if (targets.empty()) continue;
      const int64_t k = layer == ParamKind::o_proj ? c.q_dim()
                        : layer == ParamKind::down ? c.intermediate_size
                                                   : c.hidden_size;
      const int64_t stacked = static_cast<int64_t>(targets.size()) * r;
      const int a = add(p + "lora_a." + lora_target_module(targets[0]), lora_a_kind(layer), l, {stacked, k});
      for (size_t j = 0; j < targets.size(); ++j)
        table.hf_tensors.push_back(
            {hp + module_path(targets[j]) + ".lora_A.weight", a, static_cast<int64_t>(j) * r, {r, k}});
      for (LoraTarget t : targets) {
        const int64_t rows = lora_target_rows(c, t);
        const int b = add(p + "lora_b." + lora_target_module(t), lora_b_kind(t), l, {rows, r});
        table.hf_tensors.push_back({hp + module_path(t) + ".lora_B.weight", b, 0, {rows, r}});
      }
    }
  }
  return table;
}

int64_t mfu_params(const ModelConfig& config, const LoraConfig& lora) {
  if (!lora.enabled()) return config.matmul_params();
  return (4 * config.matmul_params() + 6 * lora_table_build(config, lora).total_numel) / 6;
}

}  // namespace loom
