#include "plan/shard.h"

#include <algorithm>

namespace loom {

int64_t GpuShard::stage_params(int64_t s) const {
  int64_t total = 0;
  for (int64_t n : stage_tensor_sizes(s)) total += n;
  return total;
}

std::vector<int64_t> GpuShard::stage_tensor_sizes(int64_t s) const {
  std::vector<int64_t> sizes;
  const int64_t embedding = vocab * hidden;  // vocabulary-parallel: 1/tp of the rows
  if (first(s)) sizes.push_back(embedding);
  for (int64_t l = 0; l < stage_layers[static_cast<size_t>(s)]; ++l) {
    // input_norm, qkv, q_norm, k_norm, o_proj, post_attn_norm, gate_up, down (param_table.h)
    for (int64_t n : {hidden, qkv_dim * hidden, head_dim, head_dim, hidden * q_dim, hidden, 2 * ffn * hidden,
                      hidden * ffn})
      sizes.push_back(n);
  }
  if (last(s)) {
    sizes.push_back(hidden);  // final norm
    // An untied lm_head; a tied one is the embedding, which the last stage keeps a copy
    // of when it is not also the first (Megatron's shared embedding).
    if (!tied || pp > 1) sizes.push_back(embedding);
  }
  return sizes;
}

GpuShard gpu_shard(const Qwen3Config& m, const LayoutSpec& layout, const MicroBatchShape& micro) {
  GpuShard g;
  g.tp = layout.tp;
  g.pp = layout.pp;
  g.cp = layout.cp;
  g.dp = layout.dp;
  g.sp = layout.sequence_parallel && layout.tp > 1;
  g.hidden = m.hidden_size;
  g.head_dim = m.head_dim;
  g.q_heads = std::max<int64_t>(1, m.num_attention_heads / g.tp);
  g.kv_heads = m.num_key_value_heads % g.tp == 0 ? m.num_key_value_heads / g.tp : 1;
  g.q_dim = g.q_heads * m.head_dim;
  g.qkv_dim = (g.q_heads + 2 * g.kv_heads) * m.head_dim;
  g.ffn = m.intermediate_size / g.tp;
  g.vocab = m.vocab_size / g.tp;
  g.tied = m.tie_word_embeddings;
  if (!layout.layer_split.empty()) {
    g.stage_layers = layout.layer_split;
  } else {
    // Even split; layout_check refuses layers % pp != 0, the remainder goes to the first stages.
    for (int64_t s = 0; s < g.pp; ++s)
      g.stage_layers.push_back(m.num_hidden_layers / g.pp + (s < m.num_hidden_layers % g.pp ? 1 : 0));
  }
  g.tokens = micro.tokens / g.cp;
  g.seq_tokens = g.sp ? g.tokens / g.tp : g.tokens;
  g.rows = micro.rows;
  g.row_tokens = micro.row_tokens / g.cp;
  return g;
}

}  // namespace loom
