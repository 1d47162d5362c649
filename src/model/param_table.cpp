#include "model/param_table.h"

#include "core/error.h"

namespace loom {

int ParamTable::find(ParamKind kind, int64_t layer) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].kind == kind && params[i].layer == layer) return static_cast<int>(i);
  return -1;
}

const HfTensorSpec* ParamTable::find_hf(const std::string& hf_name) const {
  for (const HfTensorSpec& t : hf_tensors)
    if (t.hf_name == hf_name) return &t;
  return nullptr;
}

int ParamTable::lm_head_param() const {
  int lm = find(ParamKind::lm_head);
  return lm >= 0 ? lm : find(ParamKind::embedding);
}

ParamTable param_table_build(const ModelConfig& c) {
  ParamTable table;
  auto add = [&](std::string name, ParamKind kind, int64_t layer, Shape shape) {
    int index = static_cast<int>(table.params.size());
    table.params.push_back({std::move(name), kind, layer, shape, table.total_numel});
    table.total_numel += shape.numel();
    return index;
  };
  auto hf = [&](std::string hf_name, int param, int64_t row_offset, Shape shape) {
    table.hf_tensors.push_back({std::move(hf_name), param, row_offset, shape});
  };
  const int64_t h = c.hidden_size, f = c.intermediate_size, hd = c.head_dim;

  int embed = add("embedding", ParamKind::embedding, -1, {c.vocab_size, h});
  hf("model.embed_tokens.weight", embed, 0, {c.vocab_size, h});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    const std::string hp = "model.layers." + std::to_string(l) + ".";
    int in_norm = add(p + "input_norm", ParamKind::input_norm, l, {h});
    hf(hp + "input_layernorm.weight", in_norm, 0, {h});
    int qkv = add(p + "qkv", ParamKind::qkv, l, {c.qkv_dim(), h});
    hf(hp + "self_attn.q_proj.weight", qkv, 0, {c.q_dim(), h});
    hf(hp + "self_attn.k_proj.weight", qkv, c.q_dim(), {c.kv_dim(), h});
    hf(hp + "self_attn.v_proj.weight", qkv, c.q_dim() + c.kv_dim(), {c.kv_dim(), h});
    if (c.qkv_bias) {
      int bias = add(p + "qkv_bias", ParamKind::qkv_bias, l, {c.qkv_dim()});
      hf(hp + "self_attn.q_proj.bias", bias, 0, {c.q_dim()});
      hf(hp + "self_attn.k_proj.bias", bias, c.q_dim(), {c.kv_dim()});
      hf(hp + "self_attn.v_proj.bias", bias, c.q_dim() + c.kv_dim(), {c.kv_dim()});
    }
    if (c.qk_norm) {
      int qn = add(p + "q_norm", ParamKind::q_norm, l, {hd});
      hf(hp + "self_attn.q_norm.weight", qn, 0, {hd});
      int kn = add(p + "k_norm", ParamKind::k_norm, l, {hd});
      hf(hp + "self_attn.k_norm.weight", kn, 0, {hd});
    }
    int o = add(p + "o_proj", ParamKind::o_proj, l, {h, c.q_dim()});
    hf(hp + "self_attn.o_proj.weight", o, 0, {h, c.q_dim()});
    int post = add(p + "post_attn_norm", ParamKind::post_attn_norm, l, {h});
    hf(hp + "post_attention_layernorm.weight", post, 0, {h});
    if (c.sparse_layer(l)) {
      const int64_t e_count = c.num_experts, ef = c.moe_intermediate_size;
      int router = add(p + "router", ParamKind::router, l, {e_count, h});
      hf(hp + "mlp.gate.weight", router, 0, {e_count, h});
      int gu = add(p + "experts_gate_up", ParamKind::experts_gate_up, l, {e_count * 2 * ef, h});
      int down = add(p + "experts_down", ParamKind::experts_down, l, {e_count * h, ef});
      for (int64_t e = 0; e < e_count; ++e) {
        const std::string ep = hp + "mlp.experts." + std::to_string(e) + ".";
        hf(ep + "gate_proj.weight", gu, e * 2 * ef, {ef, h});
        hf(ep + "up_proj.weight", gu, e * 2 * ef + ef, {ef, h});
        hf(ep + "down_proj.weight", down, e * h, {h, ef});
      }
      continue;
    }
    int gu = add(p + "gate_up", ParamKind::gate_up, l, {2 * f, h});
    hf(hp + "mlp.gate_proj.weight", gu, 0, {f, h});
    hf(hp + "mlp.up_proj.weight", gu, f, {f, h});
    int down = add(p + "down", ParamKind::down, l, {h, f});
    hf(hp + "mlp.down_proj.weight", down, 0, {h, f});
  }
  int norm = add("final_norm", ParamKind::final_norm, -1, {h});
  hf("model.norm.weight", norm, 0, {h});
  if (!c.tie_word_embeddings) {
    int lm = add("lm_head", ParamKind::lm_head, -1, {c.vocab_size, h});
    hf("lm_head.weight", lm, 0, {c.vocab_size, h});
  }
  return table;
}

std::vector<TensorRange> param_table_ranges(const ParamTable& table) {
  std::vector<TensorRange> ranges;
  for (size_t i = 0; i < table.params.size(); ++i)
    ranges.push_back({table.params[i].offset, table.params[i].numel(), static_cast<int>(i)});
  return ranges;
}

}  // namespace loom
