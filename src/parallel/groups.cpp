#include "parallel/groups.h"

#include <array>

#include "core/error.h"

namespace loom {

namespace {

// Dimensions in rank order, fastest first.
constexpr int kDims = 4;  // tp, cp, dp, pp

std::array<int, kDims> sizes_of(const ParallelLayout& l) {
  return {l.tp, l.cp, l.dp, l.pp};
}
std::array<int, kDims> coords_array(const RankCoords& c) {
  return {c.tp, c.cp, c.dp, c.pp};
}
RankCoords coords_from(const std::array<int, kDims>& a) {
  return {a[0], a[1], a[2], a[3]};
}

// Which dimensions vary inside a group of `kind` (embedding: the pp dimension; its members
// are then cut to the first and last stage).
std::array<bool, kDims> varying(GroupKind kind) {
  switch (kind) {
    case GroupKind::tp: return {true, false, false, false};
    case GroupKind::cp: return {false, true, false, false};
    case GroupKind::dp: return {false, false, true, false};
    case GroupKind::pp:
    case GroupKind::embedding: return {false, false, false, true};
    case GroupKind::dp_cp: return {false, true, true, false};
    case GroupKind::ep:
    case GroupKind::edp: return {false, false, true, false};  // then cut (expert_cut)
  }
  return {};
}

// Ranks of the group with the fixed coordinates of `base`, enumerating the varying
// dimensions with the fastest first (ascending, since strides grow with the dimension).
std::vector<int> enumerate_group(const RankLayout& layout, GroupKind kind, std::array<int, kDims> base) {
  const auto sizes = sizes_of(layout.layout());
  const auto vary = varying(kind);
  int count = 1;
  for (int d = 0; d < kDims; ++d)
    if (vary[d]) count *= sizes[d];
  std::vector<int> ranks;
  for (int i = 0; i < count; ++i) {
    int rest = i;
    for (int d = 0; d < kDims; ++d) {
      if (!vary[d]) continue;
      base[d] = rest % sizes[d];
      rest /= sizes[d];
    }
    ranks.push_back(layout.rank_of(coords_from(base)));
  }
  if (kind == GroupKind::embedding && ranks.size() > 2) ranks.erase(ranks.begin() + 1, ranks.end() - 1);
  return ranks;
}

// The EP or EDP part of a DP group `dp_ranks` (in dp_rank order) holding the DP rank
// `dp_rank`: dp_rank = ep_rank + ep · edp_rank.
std::vector<int> expert_cut(GroupKind kind, const std::vector<int>& dp_ranks, int ep, int dp_rank) {
  std::vector<int> out;
  for (int d = 0; d < static_cast<int>(dp_ranks.size()); ++d)
    if (kind == GroupKind::ep ? d / ep == dp_rank / ep : d % ep == dp_rank % ep)
      out.push_back(dp_ranks[static_cast<size_t>(d)]);
  return out;
}

}  // namespace

std::string group_kind_name(GroupKind kind) {
  switch (kind) {
    case GroupKind::tp: return "tp";
    case GroupKind::cp: return "cp";
    case GroupKind::dp: return "dp";
    case GroupKind::pp: return "pp";
    case GroupKind::dp_cp: return "dp_cp";
    case GroupKind::embedding: return "embedding";
    case GroupKind::ep: return "ep";
    case GroupKind::edp: return "edp";
  }
  return "?";
}

RankLayout::RankLayout(int world_size, ParallelLayout layout) : world_size_(world_size), layout_(layout) {
  for (int size : sizes_of(layout))
    if (size < 1)
      throw_input_error("layout", "tp, cp, dp and pp must each be at least 1 (found tp " +
                                      std::to_string(layout.tp) + ", cp " + std::to_string(layout.cp) +
                                      ", dp " + std::to_string(layout.dp) + ", pp " +
                                      std::to_string(layout.pp) + ")");
  if (layout.world_size() != world_size)
    throw_input_error("layout", "tp · cp · dp · pp = " + std::to_string(layout.tp) + " · " +
                                    std::to_string(layout.cp) + " · " + std::to_string(layout.dp) + " · " +
                                    std::to_string(layout.pp) + " = " + std::to_string(layout.world_size()) +
                                    ", expected the world size " + std::to_string(world_size));
  if (layout.ep < 1 || layout.dp % layout.ep != 0)
    throw_input_error("layout.ep, layout.dp",
                      "found ep " + std::to_string(layout.ep) + ", expected a divisor of dp = " +
                          std::to_string(layout.dp) + " (EP ranks are carved out of the DP ranks)");
}

RankCoords RankLayout::coords(int rank) const {
  LOOM_ASSERT(rank >= 0 && rank < world_size_, "rank outside the world");
  const auto sizes = sizes_of(layout_);
  std::array<int, kDims> c{};
  for (int d = 0; d < kDims; ++d) {
    c[d] = rank % sizes[d];
    rank /= sizes[d];
  }
  return coords_from(c);
}

int RankLayout::rank_of(const RankCoords& coords) const {
  const auto sizes = sizes_of(layout_);
  const auto c = coords_array(coords);
  int rank = 0;
  for (int d = kDims - 1; d >= 0; --d) {
    LOOM_ASSERT(c[d] >= 0 && c[d] < sizes[d], "coordinate outside the layout");
    rank = rank * sizes[d] + c[d];
  }
  return rank;
}

std::vector<int> RankLayout::group_of(GroupKind kind, int rank) const {
  if (kind == GroupKind::ep || kind == GroupKind::edp)
    return expert_cut(kind, group_of(GroupKind::dp, rank), layout_.ep, coords(rank).dp);
  std::vector<int> ranks = enumerate_group(*this, kind, coords_array(coords(rank)));
  if (kind == GroupKind::embedding && ranks.front() != rank && ranks.back() != rank) return {};
  return ranks;
}

std::vector<std::vector<int>> RankLayout::all_groups(GroupKind kind) const {
  if (kind == GroupKind::ep || kind == GroupKind::edp) {
    // Each DP group's parts, in the order of their first DP rank.
    std::vector<std::vector<int>> out;
    for (const std::vector<int>& dp : all_groups(GroupKind::dp))
      for (int d = 0; d < layout_.dp; ++d)
        if (kind == GroupKind::ep ? d % layout_.ep == 0 : d < layout_.ep)
          out.push_back(expert_cut(kind, dp, layout_.ep, d));
    return out;
  }
  // Enumerate the fixed dimensions' coordinates with the fastest first, as Megatron's
  // generate_masked_orthogonal_rank_groups enumerates its group index.
  const auto sizes = sizes_of(layout_);
  const auto vary = varying(kind);
  int groups = 1;
  for (int d = 0; d < kDims; ++d)
    if (!vary[d]) groups *= sizes[d];
  std::vector<std::vector<int>> out;
  for (int g = 0; g < groups; ++g) {
    std::array<int, kDims> base{};
    int rest = g;
    for (int d = 0; d < kDims; ++d) {
      if (vary[d]) continue;
      base[d] = rest % sizes[d];
      rest /= sizes[d];
    }
    out.push_back(enumerate_group(*this, kind, base));
  }
  return out;
}

Comm& Groups::group(GroupKind kind) const {
  const std::unique_ptr<Comm>* comm = nullptr;
  switch (kind) {
    case GroupKind::tp: comm = &tp; break;
    case GroupKind::cp: comm = &cp; break;
    case GroupKind::dp: comm = &dp; break;
    case GroupKind::pp: comm = &pp; break;
    case GroupKind::dp_cp: comm = &dp_cp; break;
    case GroupKind::embedding: comm = &embedding; break;
    case GroupKind::ep: comm = &ep; break;
    case GroupKind::edp: comm = &edp; break;
  }
  LOOM_ASSERT(comm && *comm, "this rank is not in a " + group_kind_name(kind) + " group");
  return **comm;
}

Groups groups_create(Comm& world, const ParallelLayout& layout, CommTimeout timeout) {
  LOOM_ASSERT(world.world_ranks().size() == static_cast<size_t>(world.size()) &&
                  world.world_ranks().back() == world.size() - 1,
              "groups_create needs the world group");
  RankLayout ranks(world.size(), layout);
  Groups groups;
  groups.layout = layout;
  groups.coords = ranks.coords(world.rank());
  groups.world = &world;
  for (GroupKind kind : {GroupKind::tp, GroupKind::cp, GroupKind::dp, GroupKind::pp, GroupKind::dp_cp,
                         GroupKind::embedding, GroupKind::ep, GroupKind::edp}) {
    // Without expert parallelism its groups would be single ranks and DP again: not made
    // (every rank knows, so every rank skips the same splits).
    if ((kind == GroupKind::ep || kind == GroupKind::edp) && layout.ep == 1) continue;
    std::unique_ptr<Comm> comm =
        world.split(ranks.group_of(kind, world.rank()), group_kind_name(kind), timeout);
    switch (kind) {
      case GroupKind::ep: groups.ep = std::move(comm); break;
      case GroupKind::edp: groups.edp = std::move(comm); break;
      case GroupKind::tp: groups.tp = std::move(comm); break;
      case GroupKind::cp: groups.cp = std::move(comm); break;
      case GroupKind::dp: groups.dp = std::move(comm); break;
      case GroupKind::pp: groups.pp = std::move(comm); break;
      case GroupKind::dp_cp: groups.dp_cp = std::move(comm); break;
      case GroupKind::embedding: groups.embedding = std::move(comm); break;
    }
  }
  return groups;
}

}  // namespace loom
