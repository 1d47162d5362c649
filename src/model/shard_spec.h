// The Qwen3 sharding spec (docs/parallel.md): how each parameter kind splits over the
// tensor-parallel (TP) ranks and the pipeline (PP) stages, which group sums the parts of its
// grad that are partial sums, which replica counts it in the grad norm, and which layouts
// split the model at all. The one statement of these rules: the engines' shards
// (train/rank_shard.h), the memory and time model (plan/shard.h), the recipe's layout check
// (recipe/rules.h) and the model's own heads, FFN slice and vocabulary range
// (model/decoder.h) all read it.
//
// Per kind, on TP rank r of tp (Megatron's split; V vocabulary, F FFN size):
//   embedding, lm_head  vocab-parallel: rows [r·V/tp, (r+1)·V/tp). The first stage holds the
//                       embedding, the last the lm_head; a tied embedding is held by both
//                       (pp > 1: two copies whose grads are summed over the embedding group,
//                       counted on the first stage)
//   qkv                 column-parallel: rank r's q heads' rows, then its k heads', then its v
//                       heads'. With fewer KV heads than tp, the one KV head its q heads use,
//                       shared by tp / kv consecutive ranks: their k/v rows' grads are summed
//                       over those ranks (the kv group) and counted on the first of them
//   o_proj              row-parallel: the columns of rank r's q heads
//   gate_up             column-parallel: rank r's F/tp gate rows, then its F/tp up rows
//   down                row-parallel: the columns of its FFN slice
//   router              replicated, counted on TP rank 0, grads partial over TP under sequence
//                       parallel (each rank routes its own tokens)
//   experts             split over the EP ranks (layout.ep, carved out of DP: parallel/groups.h):
//                       EP rank j holds experts [j·E/ep, (j+1)·E/ep), a contiguous block of
//                       rows of the stored [E·N, K] tensor; whole on each TP rank (they run
//                       on the rank's tokens), counted on TP rank 0, grads partial over TP
//                       under sequence parallel
//   norms               replicated, counted on TP rank 0; their grads are partial over TP:
//                       the q/k norms' always (each rank has its heads), the others' under
//                       sequence parallel (each rank has its tokens)
// Per stage: stage s holds the layers stage_layer_range(s); the first stage embeds, the last
// holds the final norm, the lm_head and the loss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"
#include "model/param_table.h"
#include "ops/ops.h"

namespace loom {

// What the rules read of a layout.
struct ShardLayout {
  int64_t tp = 1;
  int64_t pp = 1;
  bool sequence_parallel = false;    // has an effect only with tp > 1
  std::vector<int64_t> layer_split;  // layers per PP stage; empty: an even split
  int64_t vpp = 1;                   // virtual stages per PP rank: checked, not run
  int64_t ep = 1;                    // expert-parallel ranks (a mixture of experts)
};

// A broken rule: the recipe fields it relates ("layout.tp") and what was found and expected.
struct ShardViolation {
  std::string field;
  std::string what;
};

// The model-dependent layout rules; empty when the layout splits the model:
//   num_attention_heads % tp = 0; num_key_value_heads % tp = 0, or tp % kv = 0 (KV heads
//     replicated over tp / kv ranks); intermediate_size % tp = 0; vocab_size % tp = 0
//     (loom splits these without padding)
//   layer_split empty: layers % (pp·vpp) = 0; else pp entries, each at least 1 and a
//     multiple of vpp, summing to the layers
//   ep > 1 only for a mixture of experts, and then num_experts % ep = 0
// Sizes must be >= 1 (the recipe's schema and recipe_rules see to it first).
std::vector<ShardViolation> shard_layout_check(const ModelConfig& config, const ShardLayout& layout);
// Throws InputError naming the first violation's fields, if any.
void shard_layout_require(const ModelConfig& config, const ShardLayout& layout);

// The layers of each PP stage: layout.layer_split when given, else layers / pp each. The
// one definition of the split; an even split exists only where pp divides the layers (the
// check refuses the other layouts, so no stage is ever given a remainder). Needs a layout
// that shard_layout_check accepts.
std::vector<int64_t> stage_layer_counts(const ModelConfig& config, const ShardLayout& layout);
// Stage `stage`'s layers [begin, end).
struct LayerRange {
  int64_t begin = 0;
  int64_t end = 0;
};
LayerRange stage_layer_range(const ModelConfig& config, const ShardLayout& layout, int64_t stage);

// A TP rank's heads: q heads / tp; KV heads / tp, or 1 when replicated (kv < tp).
HeadLayout shard_heads(const ModelConfig& config, int64_t tp);
// The TP ranks that share one KV head: tp / kv when kv < tp, else 1 (each has its own).
int64_t shard_kv_share(const ModelConfig& config, int64_t tp);
// A TP rank's gate rows (and up rows): F / tp.
int64_t shard_ffn(const ModelConfig& config, int64_t tp);
// An EP rank's experts of a sparse layer: E / ep, from ep_rank · E / ep.
int64_t shard_experts(const ModelConfig& config, int64_t ep);
// A TP rank's vocabulary rows [shard_vocab_begin, + shard_vocab): V / tp of them.
int64_t shard_vocab(const ModelConfig& config, int64_t tp);
int64_t shard_vocab_begin(const ModelConfig& config, int64_t tp, int64_t tp_rank);

// The GEMM widths of a TP rank's linear layers, the one place they are derived (the recipe's
// FP8 rules read them, recipe/rules.h). A linear layer's weight on the rank is W [n, k]
// (tensor_shard's shape), so its GEMMs over the micro-batch's T tokens are
//   forward          [T, k] · [n, k]ᵀ   (GEMM n = n, k = k)
//   input gradient   [T, n] · [k, n]ᵀ   (GEMM n = k, k = n)
//   weight gradient  [n, T] · [k, T]ᵀ   (GEMM n = k, k = T, padded by the layer)
// and every width below is a GEMM's n or k:
//   qkv      n (q + 2·kv heads) · head_dim   k hidden_size     column-parallel: q, k, v rows
//   o_proj   n hidden_size                   k q heads · head_dim   row-parallel
//   gate_up  n 2 · intermediate_size / tp    k hidden_size     column-parallel: gate, up rows
//   down     n hidden_size                   k intermediate_size / tp   row-parallel
// with q heads / tp and KV heads / tp (1, replicated, where tp exceeds them) a rank.
struct GemmWidth {
  std::string what;  // the model's dims it is, as messages name them ("intermediate_size")
  int64_t width = 0;
};
struct RankGemm {
  ParamKind kind = ParamKind::qkv;  // qkv, o_proj, gate_up or down
  GemmWidth n, k;
  // The rank's pieces of the dimension TP splits, each a contiguous block of the full tensor:
  // q and kv heads' rows (qkv), gate / up rows (gate_up), or k (o_proj, down).
  std::vector<GemmWidth> sharded;
};
std::vector<RankGemm> shard_gemms(const ModelConfig& config, int64_t tp);

// The group over which a part of a local grad is a partial sum: tp (norms), kv (the ranks
// sharing a KV head) or embedding (a tied embedding held by the first and the last stage).
enum class PartialGroup : uint8_t { tp, kv, embedding };

// Rows [row, row + rows) of a full tensor, one piece of a local one.
struct RowBlock {
  int64_t row = 0;
  int64_t rows = 0;
};

// What one position (a TP rank of a PP stage) holds of one full tensor.
struct TensorShard {
  bool held = false;
  // Its row blocks of the full tensor laid end to end, each over the columns
  // [col, col + cols) (1-D tensors: rows of one column).
  std::vector<RowBlock> blocks;
  int64_t col = 0;
  int64_t cols = 0;
  Shape shape;  // the local tensor's
  // The local elements [partial_offset, partial_offset + partial_numel) whose grad is a
  // partial sum over partial_group (numel 0: none).
  PartialGroup partial_group = PartialGroup::tp;
  int64_t partial_offset = 0;
  int64_t partial_numel = 0;
  // The local elements [0, counted) this position counts in the grad norm: each element of
  // the model is counted by one position (replicas by their first holder).
  int64_t counted = 0;
};

// Whether a kind is a sparse layer's experts (split over EP, its grads reduced over EDP).
bool is_expert_kind(ParamKind kind);

// What TP rank `tp_rank` of stage `stage` and EP rank `ep_rank` holds of `full`, a tensor of
// the model's param_table_build table. Needs a layout that shard_layout_check accepts.
TensorShard tensor_shard(const ModelConfig& config, const ShardLayout& layout, int64_t tp_rank, int64_t stage,
                         const ParamSpec& full, int64_t ep_rank = 0);

}  // namespace loom
