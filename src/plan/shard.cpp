#include "plan/shard.h"

#include "model/lora.h"
#include "model/param_table.h"
#include "model/shard_spec.h"

namespace loom {

int64_t GpuShard::stage_params(int64_t s) const {
  int64_t total = 0;
  for (int64_t n : stage_tensor_sizes(s)) total += n;
  return total;
}

int64_t GpuShard::stage_trained_params(int64_t s) const {
  int64_t total = 0;
  for (int64_t n : stage_trained_tensor_sizes(s)) total += n;
  return total;
}

GpuShard gpu_shard(const ModelConfig& m, const LayoutSpec& layout, const MicroBatchShape& micro,
                   const LoraConfig& lora) {
  const ShardLayout spec{layout.tp,          layout.pp,  layout.sequence_parallel,
                         layout.layer_split, layout.vpp, layout.ep};
  GpuShard g;
  g.ep = layout.ep;
  g.top_k = m.num_experts > 0 ? m.num_experts_per_tok : 0;
  g.tp = layout.tp;
  g.pp = layout.pp;
  g.cp = layout.cp;
  g.dp = layout.dp;
  g.sp = layout.sequence_parallel && layout.tp > 1;
  g.hidden = m.hidden_size;
  g.head_dim = m.head_dim;
  const HeadLayout heads = shard_heads(m, g.tp);
  g.q_heads = heads.q_heads;
  g.kv_heads = heads.kv_heads;
  g.q_dim = g.q_heads * m.head_dim;
  g.qkv_dim = heads.total_heads() * m.head_dim;
  g.ffn = shard_ffn(m, g.tp);
  g.vocab = shard_vocab(m, g.tp);
  g.tied = m.tie_word_embeddings;
  g.qk_norm = m.qk_norm;
  g.stage_layers = stage_layer_counts(m, spec);
  // TP (and EP) rank 0's tensors stand for every rank's: the spec splits each tensor evenly.
  const ParamTable table = param_table_build(m);
  for (int64_t s = 0; s < g.pp; ++s) {
    std::vector<int64_t>& sizes = g.stage_tensors.emplace_back();
    int64_t& experts = g.stage_experts.emplace_back(0);
    for (const ParamSpec& p : table.params) {
      const TensorShard t = tensor_shard(m, spec, 0, s, p);
      if (!t.held) continue;
      sizes.push_back(t.shape.numel());
      if (is_expert_kind(p.kind)) experts += t.shape.numel();
    }
    const LayerRange layers = stage_layer_range(m, spec, s);
    int64_t& sparse = g.stage_sparse_layers.emplace_back(0);
    for (int64_t l = layers.begin; l < layers.end; ++l) sparse += m.sparse_layer(l) ? 1 : 0;
  }
  const ParamTable adapters = lora.enabled() ? lora_table_build(m, lora) : ParamTable{};
  if (lora.enabled())
    for (int64_t s = 0; s < g.pp; ++s) {
      std::vector<int64_t>& sizes = g.stage_adapter_tensors.emplace_back();
      for (const ParamSpec& p : adapters.params) {
        const TensorShard t = tensor_shard(m, spec, 0, s, p);
        if (t.held) sizes.push_back(t.shape.numel());
      }
    }
  g.tokens = micro.tokens / g.cp;
  g.seq_tokens = g.sp ? g.tokens / g.tp : g.tokens;
  g.rows = micro.rows;
  g.row_tokens = micro.row_tokens / g.cp;
  return g;
}

}  // namespace loom
