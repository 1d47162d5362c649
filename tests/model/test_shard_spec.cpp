// The sharding spec (model/shard_spec.h): the layer split's one definition, the layout
// rules' messages, and over whole layouts of real Qwen3 sizes that the positions' pieces
// tile every tensor and count each element once.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/shard_spec.h"

namespace loom {
namespace {

ModelConfig builtin(const std::string& name) {
  ModelConfig c;
  EXPECT_TRUE(qwen3_config_builtin(name, &c)) << name;
  return c;
}

ShardLayout layout(int64_t tp, int64_t pp, std::vector<int64_t> layer_split = {}, int64_t vpp = 1) {
  ShardLayout l;
  l.tp = tp;
  l.pp = pp;
  l.layer_split = std::move(layer_split);
  l.vpp = vpp;
  return l;
}

ShardLayout sp(ShardLayout l) {
  l.sequence_parallel = true;
  return l;
}

TEST(ShardSpec, AStageHoldsTheLayerSplitsLayersOrLayersOverPpEach) {
  const ModelConfig c = builtin("Qwen3-32B");  // 64 layers
  EXPECT_EQ(stage_layer_counts(c, layout(1, 1)), (std::vector<int64_t>{64}));
  EXPECT_EQ(stage_layer_counts(c, layout(1, 4)), (std::vector<int64_t>{16, 16, 16, 16}));
  const ShardLayout split = layout(1, 2, {30, 34});
  EXPECT_EQ(stage_layer_counts(c, split), (std::vector<int64_t>{30, 34}));
  EXPECT_EQ(stage_layer_range(c, split, 0).begin, 0);
  EXPECT_EQ(stage_layer_range(c, split, 0).end, 30);
  EXPECT_EQ(stage_layer_range(c, split, 1).begin, 30);
  EXPECT_EQ(stage_layer_range(c, split, 1).end, 64);
  EXPECT_EQ(stage_layer_range(c, layout(1, 4), 3).begin, 48);
}

TEST(ShardSpec, AnEvenSplitNeedsPpToDivideTheLayers) {
  // No stage is given a remainder: 64 layers over 3 stages need a layer_split.
  const ModelConfig c = builtin("Qwen3-32B");
  std::vector<ShardViolation> v = shard_layout_check(c, layout(1, 3));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].field, "layout.pp, layout.layer_split");
  EXPECT_EQ(
      v[0].what,
      "found pp = 3 with layer_split null, expected a divisor of the model's 64 layers, or a layer_split");
  EXPECT_TRUE(shard_layout_check(c, layout(1, 3, {21, 21, 22})).empty());
  v = shard_layout_check(c, layout(1, 2, {}, 3));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].field, "layout.pp, layout.vpp, layout.layer_split");
}

TEST(ShardSpec, TheLayoutCheckNamesEachBrokenRule) {
  const ModelConfig c = builtin("Qwen3-32B");  // 64 heads, 8 KV heads, FFN 25,600, vocab 151,936
  std::vector<ShardViolation> v = shard_layout_check(c, layout(3, 1));
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].what, "found 3, expected a divisor of the model's 64 attention heads");
  EXPECT_EQ(
      v[1].what,
      "found 3, expected a divisor of the model's 8 KV heads or a multiple of it (KV heads replicated)");
  EXPECT_EQ(v[2].what, "found 3, expected a divisor of the model's FFN size 25600");
  EXPECT_EQ(v[3].what, "found 3, expected a divisor of the model's vocabulary of 151936");
  for (const ShardViolation& each : v) EXPECT_EQ(each.field, "layout.tp");
  EXPECT_TRUE(shard_layout_check(c, layout(16, 1)).empty());  // KV heads replicated over 2 ranks

  v = shard_layout_check(c, layout(1, 2, {0, 64}));
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].field, "layout.layer_split[0]");
  EXPECT_EQ(v[0].what, "found 0 layers, expected at least 1 (a stage runs a layer)");
  v = shard_layout_check(c, layout(1, 3, {32, 31}));
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].field, "layout.layer_split, layout.pp");
  EXPECT_EQ(v[0].what, "found 2 entries, expected one per pipeline stage (pp = 3)");
  EXPECT_EQ(v[1].field, "layout.layer_split");
  EXPECT_EQ(v[1].what, "found entries summing to 63, expected the model's 64 layers");
  v = shard_layout_check(c, layout(1, 2, {31, 33}, 2));
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].field, "layout.layer_split[0], layout.vpp");
  EXPECT_EQ(v[0].what, "found 31 layers, expected a multiple of vpp = 2");

  try {
    shard_layout_require(c, layout(3, 1));
    ADD_FAILURE() << "shard_layout_require accepted tp = 3";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "layout.tp: found 3, expected a divisor of the model's 64 attention heads");
  }
}

TEST(ShardSpec, ATpRankHoldsItsHeadsFfnSliceAndVocabularyRows) {
  const ModelConfig c = builtin("Qwen3-32B");
  const HeadLayout split = shard_heads(c, 4);
  EXPECT_EQ(split.q_heads, 16);
  EXPECT_EQ(split.kv_heads, 2);
  EXPECT_EQ(shard_kv_share(c, 4), 1);
  const HeadLayout replicated = shard_heads(c, 16);
  EXPECT_EQ(replicated.q_heads, 4);
  EXPECT_EQ(replicated.kv_heads, 1);
  EXPECT_EQ(shard_kv_share(c, 16), 2);
  EXPECT_EQ(shard_ffn(c, 4), 6400);
  EXPECT_EQ(shard_vocab(c, 4), 37984);
  EXPECT_EQ(shard_vocab_begin(c, 4, 3), 3 * 37984);
}

// A rank's GEMM widths are its linear layers' weight shards [n, k], the same tensor_shard
// gives, and the column-parallel pieces tile n (KV heads replicated where tp exceeds them).
TEST(ShardSpec, ARanksGemmWidthsAreItsLinearLayersShards) {
  for (const auto& [model, tp] : std::vector<std::pair<std::string, int64_t>>{
           {"Qwen3-32B", 1}, {"Qwen3-32B", 4}, {"Qwen3-32B", 16}, {"Qwen3-0.6B", 16}}) {
    SCOPED_TRACE(model + " tp " + std::to_string(tp));
    const ModelConfig c = builtin(model);
    const std::vector<RankGemm> gemms = shard_gemms(c, tp);
    ASSERT_EQ(gemms.size(), 4u);
    const ParamTable table = param_table_build(c);
    for (const RankGemm& g : gemms) {
      const auto full = std::find_if(table.params.begin(), table.params.end(),
                                     [&](const ParamSpec& p) { return p.kind == g.kind && p.layer == 0; });
      ASSERT_NE(full, table.params.end());
      const TensorShard t = tensor_shard(c, layout(tp, 1), tp - 1, 0, *full);
      EXPECT_EQ(g.n.width, t.shape[0]) << full->name;
      EXPECT_EQ(g.k.width, t.shape[1]) << full->name;
      const bool column = g.kind == ParamKind::qkv || g.kind == ParamKind::gate_up;
      int64_t pieces = 0;
      for (const RowBlock& b : t.blocks) {
        const bool named = std::any_of(g.sharded.begin(), g.sharded.end(), [&](const GemmWidth& w) {
          return w.width == (column ? b.rows : t.cols);
        });
        EXPECT_TRUE(named) << full->name << ": a piece of " << (column ? b.rows : t.cols);
        pieces += b.rows;
      }
      EXPECT_EQ(pieces, t.shape[0]) << full->name;
    }
    EXPECT_EQ(gemms[3].k.what, "intermediate_size");
    EXPECT_EQ(gemms[3].k.width, c.intermediate_size / tp);
  }
}

struct Case {
  std::string model;
  ShardLayout layout;
};

// Every element of each full tensor is held by some position of each stage that holds the
// tensor, by the TP ranks without overlap where it is split, and is counted in the grad norm
// by exactly one position of the layout.
TEST(ShardSpec, ThePositionsTileEveryTensorAndCountEachElementOnce) {
  const std::vector<Case> cases = {
      {"Qwen3-0.6B", {}},  // tied, 8 KV heads
      {"Qwen3-0.6B", sp(layout(2, 2))},
      {"Qwen3-0.6B", layout(16, 4)},    // KV heads shared by 2 ranks
      {"Qwen3-32B", sp(layout(4, 2))},  // the seed's
      {"Qwen3-32B", layout(8, 2, {30, 34})},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.model + " tp " + std::to_string(k.layout.tp) + " pp " + std::to_string(k.layout.pp));
    const ModelConfig c = builtin(k.model);
    ASSERT_TRUE(shard_layout_check(c, k.layout).empty());
    const ParamTable table = param_table_build(c);
    int64_t counted = 0;
    for (const ParamSpec& p : table.params) {
      int64_t held = 0, holders = 0;
      for (int64_t s = 0; s < k.layout.pp; ++s) {
        bool stage_holds = false;
        int64_t stage_held = 0;
        for (int64_t r = 0; r < k.layout.tp; ++r) {
          const TensorShard t = tensor_shard(c, k.layout, r, s, p);
          if (!t.held) continue;
          stage_holds = true;
          stage_held += t.shape.numel();
          counted += t.counted;
          EXPECT_LE(t.partial_offset + t.partial_numel, t.shape.numel()) << p.name;
        }
        if (stage_holds) {
          ++holders;
          held = stage_held;
        }
      }
      ASSERT_GE(holders, 1) << p.name;
      // The pieces of a stage add up to the tensor, more where replicated (the norms, a
      // shared KV head's rows).
      EXPECT_GE(held, p.numel()) << p.name;
      if (p.shape.ndim == 2 && p.kind != ParamKind::qkv) {
        EXPECT_EQ(held, p.numel()) << p.name;
      }
    }
    EXPECT_EQ(counted, table.total_numel);
  }
}

TEST(ShardSpec, PartialGradsLieWhereAPositionHoldsAPartOfASum) {
  const ModelConfig c = builtin("Qwen3-0.6B");  // tied: the last stage keeps a copy at pp > 1
  const ParamTable table = param_table_build(c);
  const ParamSpec& embedding = table.params[static_cast<size_t>(table.find(ParamKind::embedding))];
  const ParamSpec& q_norm = table.params[static_cast<size_t>(table.find(ParamKind::q_norm, 0))];
  const ParamSpec& input_norm = table.params[static_cast<size_t>(table.find(ParamKind::input_norm, 0))];
  const ParamSpec& qkv = table.params[static_cast<size_t>(table.find(ParamKind::qkv, 0))];

  const ShardLayout pp2 = layout(1, 2);
  const TensorShard copy = tensor_shard(c, pp2, 0, 1, embedding);
  ASSERT_TRUE(copy.held);
  EXPECT_EQ(copy.partial_group, PartialGroup::embedding);
  EXPECT_EQ(copy.counted, 0);  // the first stage counts it
  EXPECT_EQ(tensor_shard(c, pp2, 0, 0, embedding).counted, embedding.numel());

  const ShardLayout tp2 = layout(2, 1);
  EXPECT_EQ(tensor_shard(c, tp2, 1, 0, q_norm).partial_group, PartialGroup::tp);
  EXPECT_EQ(tensor_shard(c, tp2, 1, 0, q_norm).partial_numel, c.head_dim);
  EXPECT_EQ(tensor_shard(c, tp2, 1, 0, q_norm).counted, 0);  // TP rank 0 counts the replicas
  EXPECT_EQ(tensor_shard(c, tp2, 0, 0, input_norm).partial_numel, 0);
  EXPECT_EQ(tensor_shard(c, sp(layout(2, 1)), 0, 0, input_norm).partial_numel, c.hidden_size);

  // 8 KV heads over 16 ranks: ranks 2k and 2k + 1 share KV head k; the odd one counts only its q rows.
  const ShardLayout tp16 = layout(16, 1);
  const TensorShard odd = tensor_shard(c, tp16, 5, 0, qkv);
  const int64_t q_rows = c.num_attention_heads / 16 * c.head_dim;
  EXPECT_EQ(odd.partial_group, PartialGroup::kv);
  EXPECT_EQ(odd.partial_offset, q_rows * c.hidden_size);
  EXPECT_EQ(odd.partial_numel, 2 * c.head_dim * c.hidden_size);
  EXPECT_EQ(odd.counted, q_rows * c.hidden_size);
  ASSERT_EQ(odd.blocks.size(), 3u);
  EXPECT_EQ(odd.blocks[1].row, c.q_dim() + 2 * c.head_dim);  // KV head 2
  EXPECT_EQ(tensor_shard(c, tp16, 4, 0, qkv).blocks[1].row, odd.blocks[1].row);
}

// Expert parallelism: EP rank j holds experts [j·E/ep, (j+1)·E/ep) of each sparse layer, whole
// on every TP rank (counted on TP rank 0); the router stays whole on every rank. The check
// names layout.ep where it does not divide the experts, or where the model has none.
TEST(ShardSpec, EpRanksHoldContiguousBlocksOfExperts) {
  const ModelConfig c = builtin("Qwen3-30B-A3B");  // 128 experts, expert FFN 768
  ShardLayout l = sp(layout(2, 2));
  l.ep = 4;
  ASSERT_TRUE(shard_layout_check(c, l).empty());
  const ParamTable table = param_table_build(c);
  const int gate_up = table.find(ParamKind::experts_gate_up, 0), router = table.find(ParamKind::router, 0);
  ASSERT_GE(gate_up, 0);
  ASSERT_GE(router, 0);
  const ParamSpec& full = table.params[static_cast<size_t>(gate_up)];
  const int64_t rows = full.shape[0] / 4;  // 32 experts' 2 · 768 rows
  int64_t counted = 0;
  for (int64_t e = 0; e < 4; ++e)
    for (int64_t r = 0; r < 2; ++r) {
      const TensorShard t = tensor_shard(c, l, r, 0, full, e);
      ASSERT_TRUE(t.held);
      ASSERT_EQ(t.blocks.size(), 1u);
      EXPECT_EQ(t.blocks[0].row, e * rows);
      EXPECT_EQ(t.blocks[0].rows, rows);
      EXPECT_EQ(t.shape, (Shape{rows, c.hidden_size}));
      EXPECT_EQ(t.partial_numel, t.shape.numel());  // partial over TP under SP
      counted += t.counted;
      const TensorShard g = tensor_shard(c, l, r, 0, table.params[static_cast<size_t>(router)], e);
      EXPECT_EQ(g.shape, (Shape{c.num_experts, c.hidden_size}));
    }
  EXPECT_EQ(counted, full.numel());

  l.ep = 3;
  std::vector<ShardViolation> v = shard_layout_check(c, l);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].field, "layout.ep");
  EXPECT_EQ(v[0].what, "found 3, expected a divisor of the model's 128 experts (num_experts)");
  ShardLayout dense = layout(1, 1);
  dense.ep = 2;
  v = shard_layout_check(builtin("Qwen3-8B"), dense);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].what, "found 2, expected 1 (a dense model has no experts)");
}

}  // namespace
}  // namespace loom
