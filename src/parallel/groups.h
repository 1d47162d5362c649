// Parallel groups: which ranks share a TP, CP, DP or PP group, and a Comm for each.
//
// Rank order is Megatron's default "tp-cp-ep-dp-pp" (megatron/core/parallel_state.py,
// initialize_model_parallel's `order` and RankGenerator; ep = 1 for dense models), tp
// varying fastest:
//
//   rank = tp_rank + tp · (cp_rank + cp · (dp_rank + dp · pp_rank))
//
// Expert parallelism is carved out of the DP ranks, ep varying faster than the rest of dp:
// dp_rank = ep_rank + ep · edp_rank. An EP group is ep consecutive DP ranks (each holds
// E / ep of a sparse layer's experts; tokens travel between them), an expert-data-parallel
// (EDP) group the dp / ep DP ranks with the same ep_rank (they hold the same experts and
// reduce their grads). With ep = 1 the EP groups are single ranks and EDP is DP.
//
// so TP groups are runs of adjacent ranks (one node's NVLink domain) and PP groups stride
// across the world. A rank's position in each of its groups is its coordinate along that
// dimension (dp_cp: cp_rank + cp · dp_rank), because every group lists its world ranks in
// ascending order, as Megatron's do.
//
// The groups are a value passed down explicitly; there is no global parallel state.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm.h"

namespace loom {

struct ParallelLayout {
  int tp = 1;
  int cp = 1;
  int dp = 1;
  int pp = 1;
  int ep = 1;  // a divisor of dp; not a dimension of the world
  int world_size() const { return tp * cp * dp * pp; }
};

struct RankCoords {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
  bool operator==(const RankCoords&) const = default;
};

// Megatron's groups by their parallel_state names:
//   tp, cp, dp, pp  one dimension varying, the others fixed;
//   dp_cp           dp and cp varying (Megatron's data-parallel group with context
//                   parallel: where gradients are reduced);
//   embedding       the first and last stage of a PP group (default_embedding_ranks: the
//                   stages that hold the word embeddings, kept equal when tied); with
//                   pp = 1 the one stage. Ranks of middle stages belong to none;
//   ep, edp         the expert-parallel and expert-data-parallel parts of a DP group
//                   (above; Megatron's expert_model_parallel and expert_data_parallel).
enum class GroupKind : uint8_t { tp, cp, dp, pp, dp_cp, embedding, ep, edp };
std::string group_kind_name(GroupKind kind);  // "tp", ..., "dp_cp", "embedding"

// The pure rank arithmetic, with no Comm.
class RankLayout {
 public:
  // Throws InputError (field "layout") when tp · cp · dp · pp != world_size or a size < 1,
  // ("layout.ep") when ep does not divide dp.
  RankLayout(int world_size, ParallelLayout layout);

  const ParallelLayout& layout() const { return layout_; }
  int world_size() const { return world_size_; }
  RankCoords coords(int rank) const;
  int rank_of(const RankCoords& coords) const;
  // World ranks (ascending) of the `kind` group holding `rank`; empty for an embedding
  // group `rank` is not in.
  std::vector<int> group_of(GroupKind kind, int rank) const;
  // Every `kind` group, in the order Megatron's RankGenerator.get_ranks lists them (the
  // fixed coordinates enumerated with tp fastest).
  std::vector<std::vector<int>> all_groups(GroupKind kind) const;

 private:
  int world_size_;
  ParallelLayout layout_;
};

// This rank's groups. `world` is not owned and must outlive the Groups.
struct Groups {
  ParallelLayout layout;
  RankCoords coords;
  Comm* world = nullptr;
  std::unique_ptr<Comm> tp, cp, dp, pp, dp_cp;
  std::unique_ptr<Comm> embedding;  // nullptr on middle pipeline stages
  std::unique_ptr<Comm> ep, edp;    // only with layout.ep > 1

  int ep_rank() const { return coords.dp % layout.ep; }
  int edp_rank() const { return coords.dp / layout.ep; }

  bool is_first_stage() const { return coords.pp == 0; }
  bool is_last_stage() const { return coords.pp == layout.pp - 1; }
  Comm& group(GroupKind kind) const;  // aborts for an embedding group this rank is not in
};

// Builds the groups by splitting `world` (collective over it: every rank calls it with the
// same layout). Groups are named after their kind. Throws InputError when the layout does
// not cover the world, RuntimeFailure when a peer does not take part within `timeout`.
Groups groups_create(Comm& world, const ParallelLayout& layout, CommTimeout timeout);

}  // namespace loom
