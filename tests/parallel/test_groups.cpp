// The rank → group mapping against Megatron's, and Groups built over CPU ranks.
//
// Megatron core (megatron/core/parallel_state.py at the seed's commit 1dcf0daf):
// initialize_model_parallel uses order "tp-cp-ep-dp-pp"; RankGenerator.get_ranks(token)
// calls generate_masked_orthogonal_rank_groups(world, [tp, cp, ep, dp, pp], mask). The
// expected lists below are worked out by hand from that rule, and a port of the function
// checks the rest.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/error.h"
#include "parallel/groups.h"
#include "parallel/in_process_comm.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
using Lists = std::vector<std::vector<int>>;

// generate_masked_orthogonal_rank_groups, line for line.
Lists megatron_groups(int world_size, const std::vector<int>& parallel_size, const std::vector<bool>& mask) {
  auto prefix_product = [](const std::vector<int>& a) {
    std::vector<int> r{1};
    for (int v : a) r.push_back(r.back() * v);
    return r;
  };
  auto inner_product = [](const std::vector<int>& a, const std::vector<int>& b) {
    int s = 0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
    return s;
  };
  auto decompose = [&](int index, const std::vector<int>& shape) {
    std::vector<int> stride = prefix_product(shape), idx;
    for (size_t i = 0; i < shape.size(); ++i) idx.push_back((index / stride[i]) % shape[i]);
    return idx;
  };
  std::vector<int> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  std::vector<int> global_stride = prefix_product(parallel_size);
  for (size_t i = 0; i < parallel_size.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  int group_size = prefix_product(masked_shape).back();
  Lists ranks;
  for (int g = 0; g < world_size / group_size; ++g) {
    std::vector<int> group_idx = decompose(g, unmasked_shape), rank;
    for (int i = 0; i < group_size; ++i)
      rank.push_back(inner_product(decompose(i, masked_shape), masked_stride) +
                     inner_product(group_idx, unmasked_stride));
    ranks.push_back(rank);
  }
  return ranks;
}

// RankGenerator(tp, ep=1, dp, pp, cp, order="tp-cp-ep-dp-pp").get_ranks(token).
Lists megatron_get_ranks(const ParallelLayout& l, const std::string& token) {
  const std::vector<std::string> order = {"tp", "cp", "ep", "dp", "pp"};
  std::vector<bool> mask(order.size(), false);
  size_t start = 0;
  while (start <= token.size()) {
    size_t end = token.find('-', start);
    std::string t = token.substr(start, end == std::string::npos ? std::string::npos : end - start);
    mask[static_cast<size_t>(std::find(order.begin(), order.end(), t) - order.begin())] = true;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return megatron_groups(l.world_size(), {l.tp, l.cp, 1, l.dp, l.pp}, mask);
}

TEST(RankLayout, HandDerivedTp2Dp2Pp2) {
  // rank = tp + 2·(dp + 2·pp)
  RankLayout layout(8, {.tp = 2, .cp = 1, .dp = 2, .pp = 2});
  EXPECT_EQ(layout.all_groups(GroupKind::tp), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::dp), (Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::pp), (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::cp), (Lists{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::dp_cp), layout.all_groups(GroupKind::dp));
  EXPECT_EQ(layout.all_groups(GroupKind::embedding), layout.all_groups(GroupKind::pp));
  EXPECT_EQ(layout.coords(6), (RankCoords{.tp = 0, .cp = 0, .dp = 1, .pp = 1}));
}

TEST(RankLayout, HandDerivedSeedTp4Pp2) {
  // The seed recipe's layout: TP within each half of the node, PP across the halves.
  RankLayout layout(8, {.tp = 4, .cp = 1, .dp = 1, .pp = 2});
  EXPECT_EQ(layout.all_groups(GroupKind::tp), (Lists{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::pp), (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::dp), (Lists{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

TEST(RankLayout, HandDerivedTp2Cp2Dp2Pp2) {
  // rank = tp + 2·(cp + 2·(dp + 2·pp)), 16 ranks.
  RankLayout layout(16, {.tp = 2, .cp = 2, .dp = 2, .pp = 2});
  EXPECT_EQ(layout.all_groups(GroupKind::cp),
            (Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(layout.all_groups(GroupKind::dp),
            (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(layout.all_groups(GroupKind::pp),
            (Lists{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(layout.all_groups(GroupKind::dp_cp),
            (Lists{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(layout.group_of(GroupKind::dp_cp, 13), (std::vector<int>{9, 11, 13, 15}));
  EXPECT_EQ(layout.rank_of({.tp = 1, .cp = 0, .dp = 1, .pp = 1}), 13);
}

TEST(RankLayout, HandDerivedPp4Dp2Embedding) {
  // rank = dp + 2·pp; the embedding groups are each PP group's first and last stage.
  RankLayout layout(8, {.tp = 1, .cp = 1, .dp = 2, .pp = 4});
  EXPECT_EQ(layout.all_groups(GroupKind::pp), (Lists{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::dp), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(layout.all_groups(GroupKind::embedding), (Lists{{0, 6}, {1, 7}}));
  EXPECT_EQ(layout.group_of(GroupKind::embedding, 7), (std::vector<int>{1, 7}));
  EXPECT_TRUE(layout.group_of(GroupKind::embedding, 3).empty());
  // pp = 1: the one stage is the embedding group (default_embedding_ranks).
  EXPECT_EQ(RankLayout(2, {.tp = 2}).all_groups(GroupKind::embedding), (Lists{{0}, {1}}));
}

TEST(RankLayout, MatchesMegatronsGenerator) {
  const std::vector<ParallelLayout> layouts = {{1, 1, 1, 1}, {8, 1, 1, 1}, {1, 1, 8, 1}, {1, 1, 1, 8},
                                               {2, 1, 2, 2}, {4, 1, 1, 2}, {2, 2, 2, 2}, {2, 3, 1, 2},
                                               {3, 1, 2, 4}, {1, 2, 3, 2}, {4, 2, 1, 3}, {2, 2, 3, 1}};
  const std::vector<std::pair<GroupKind, std::string>> kinds = {{GroupKind::tp, "tp"},
                                                                {GroupKind::cp, "cp"},
                                                                {GroupKind::dp, "dp"},
                                                                {GroupKind::pp, "pp"},
                                                                {GroupKind::dp_cp, "dp-cp"}};
  for (const ParallelLayout& l : layouts) {
    RankLayout layout(l.world_size(), l);
    for (const auto& [kind, token] : kinds) {
      Lists expected = megatron_get_ranks(l, token);
      EXPECT_EQ(layout.all_groups(kind), expected)
          << token << " of tp " << l.tp << " cp " << l.cp << " dp " << l.dp << " pp " << l.pp;
      for (const auto& group : expected)
        for (int rank : group) EXPECT_EQ(layout.group_of(kind, rank), group);
    }
    for (int rank = 0; rank < l.world_size(); ++rank) {
      RankCoords c = layout.coords(rank);
      EXPECT_EQ(rank, c.tp + l.tp * (c.cp + l.cp * (c.dp + l.dp * c.pp)));
      EXPECT_EQ(layout.rank_of(c), rank);
    }
  }
}

TEST(RankLayout, LayoutMustCoverTheWorld) {
  try {
    RankLayout(8, {.tp = 2, .cp = 1, .dp = 2, .pp = 1});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "layout: tp · cp · dp · pp = 2 · 1 · 2 · 1 = 4, expected the world size 8"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(RankLayout(0, {.tp = 0}), InputError);
}

TEST(Groups, BuiltOverCpuRanks) {
  const ParallelLayout l{.tp = 2, .cp = 1, .dp = 2, .pp = 2};
  RankLayout expected(8, l);
  run_in_process(8, [&](Comm& world) {
    Groups g = groups_create(world, l, 20s);
    const int r = world.rank();
    EXPECT_EQ(g.coords, expected.coords(r));
    for (GroupKind kind : {GroupKind::tp, GroupKind::cp, GroupKind::dp, GroupKind::pp, GroupKind::dp_cp}) {
      Comm& c = g.group(kind);
      EXPECT_EQ(c.world_ranks(), expected.group_of(kind, r)) << group_kind_name(kind);
      EXPECT_EQ(c.name(), group_kind_name(kind));
    }
    EXPECT_EQ(g.tp->rank(), g.coords.tp);
    EXPECT_EQ(g.dp->rank(), g.coords.dp);
    EXPECT_EQ(g.pp->rank(), g.coords.pp);
    EXPECT_EQ(g.is_first_stage(), g.coords.pp == 0);
    EXPECT_EQ(g.is_last_stage(), g.coords.pp == 1);
    ASSERT_NE(g.embedding, nullptr);  // with pp = 2 every rank is on the first or last stage
    // A sum over the TP group adds the world ranks of its members.
    int32_t x = r;
    g.tp->all_reduce_sum(&x, 1, DType::i32, 20s);
    EXPECT_EQ(x, 2 * (r / 2) * 2 + 1);
  });
}

// Expert parallelism carved out of DP, ep varying faster (Megatron's tp-cp-ep-dp-pp): on
// TP2 × DP4 × EP2 the DP group {0, 2, 4, 6} of TP rank 0 holds the EP groups {0, 2} and
// {4, 6} and the EDP groups {0, 4} and {2, 6}. An ep that does not divide dp is refused.
TEST(RankLayout, HandDerivedTp2Dp4Ep2) {
  const RankLayout l(8, {.tp = 2, .cp = 1, .dp = 4, .pp = 1, .ep = 2});
  EXPECT_EQ(l.group_of(GroupKind::ep, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(l.group_of(GroupKind::ep, 6), (std::vector<int>{4, 6}));
  EXPECT_EQ(l.group_of(GroupKind::edp, 2), (std::vector<int>{2, 6}));
  EXPECT_EQ(l.group_of(GroupKind::edp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.all_groups(GroupKind::ep), (std::vector<std::vector<int>>{{0, 2}, {4, 6}, {1, 3}, {5, 7}}));
  EXPECT_EQ(l.all_groups(GroupKind::edp), (std::vector<std::vector<int>>{{0, 4}, {2, 6}, {1, 5}, {3, 7}}));
  try {
    RankLayout(8, {.tp = 2, .cp = 1, .dp = 4, .pp = 1, .ep = 3});
    ADD_FAILURE() << "ep 3 of dp 4 accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("layout.ep, layout.dp: found ep 3, expected a divisor of dp = 4"),
              std::string::npos)
        << e.what();
  }
}

TEST(Groups, ExpertGroupsOverCpuRanks) {
  const ParallelLayout l{.tp = 1, .cp = 1, .dp = 4, .pp = 1, .ep = 2};
  RankLayout expected(4, l);
  run_in_process(4, [&](Comm& world) {
    Groups g = groups_create(world, l, 20s);
    const int r = world.rank();
    for (GroupKind kind : {GroupKind::ep, GroupKind::edp})
      EXPECT_EQ(g.group(kind).world_ranks(), expected.group_of(kind, r)) << group_kind_name(kind);
    EXPECT_EQ(g.ep->rank(), g.ep_rank());
    EXPECT_EQ(g.edp->rank(), g.edp_rank());
  });
}

TEST(Groups, MiddleStagesHaveNoEmbeddingGroup) {
  run_in_process(4, [&](Comm& world) {
    Groups g = groups_create(world, {.tp = 1, .cp = 1, .dp = 1, .pp = 4}, 20s);
    EXPECT_EQ(g.embedding == nullptr, world.rank() == 1 || world.rank() == 2);
    if (g.embedding) {
      EXPECT_EQ(g.embedding->world_ranks(), (std::vector<int>{0, 3}));
    }
  });
}

}  // namespace
}  // namespace loom
