// One rank's shard of a TP × PP layout (docs/parallel.md): which layers, which rows and
// columns of each tensor it holds (the rules are model/shard_spec.h's), and how its local
// flat buffer maps onto the full one.
// The engine (engine.cpp) holds it on every device: the parameter store decides where the
// shard lives, not what it is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/param_source.h"
#include "model/config.h"
#include "model/decoder.h"
#include "model/param_table.h"
#include "model/shard_spec.h"
#include "parallel/groups.h"
#include "train/engine.h"

namespace loom {

// Where a local tensor comes from: its row blocks of the full tensor, laid end to end,
// each over the columns [col, col + cols) (1-D tensors: rows of one column).
struct SliceMap {
  int full = 0;  // index into the full table
  std::vector<RowBlock> blocks;
  int64_t col = 0;
  int64_t cols = 0;
};

// A part of a local tensor's grad that is a partial sum, all-reduced over its group
// (model/shard_spec.h says which parts are).
struct PartialGrad {
  PartialGroup group;
  int64_t offset = 0;  // in the local flat buffer
  int64_t numel = 0;
};

// A part of the shard's flat buffer that the distributed optimizer splits over one group:
// tensors [first, end) of the local table, from local offset `begin`, padded to `padded`
// elements, a multiple of the group's size, so that each member owns padded / ranks of them.
// With ep = 1 one region holds every tensor, split over DP. With ep > 1 the dense tensors
// come first, split over DP, then the EP rank's experts, split over its EDP group (the
// dp / ep ranks holding the same experts), as Megatron's distributed optimizer groups them.
struct ShardRegion {
  GroupKind group = GroupKind::dp;  // dp (dp_cp under context parallelism) or edp
  size_t first = 0, end = 0;
  int64_t begin = 0;
  int64_t padded = 0;
  int64_t ranks = 1;
  int64_t chunk() const { return padded / ranks; }
};

// A DP rank's slice of a region: local elements [begin, begin + count).
struct SliceSegment {
  int64_t begin = 0;
  int64_t count = 0;
};

struct RankShard {
  ModelShard model;
  ParamTable table;              // local shapes, the full table's kinds and layers
  std::vector<SliceMap> slices;  // per local tensor
  std::vector<PartialGrad> partials;
  // Local ranges counted once in the model: the grad norm sums these; replicas of a tensor
  // held by several ranks are counted on one of them.
  std::vector<std::pair<int64_t, int64_t>> counted;
  std::vector<ShardRegion> regions;
  int64_t ep = 1;
  // The flat buffer's elements: the regions' with their padding.
  int64_t padded() const { return regions.back().begin + regions.back().padded; }
};

// What DP rank `dp_rank` owns of each region: its slice of the shard, the segments laid end
// to end (slice offsets).
std::vector<SliceSegment> shard_slice_segments(const RankShard& shard, int64_t dp_rank);

// The shard of the rank at `at`. Throws InputError when the layout does not split the model
// (layout.tp, layout.cp, layout.layer_split).
RankShard rank_shard(const ModelConfig& config, const ParamTable& full, const ParallelLayout& layout,
                     const RankCoords& at, const EngineOptions& options);

// Copies between a local flat buffer laid out by shard.table and a full one laid out by `full`.
void full_to_local(const RankShard& shard, const ParamTable& full, const float* in, float* out);
// local_to_full places the local elements from `from` on.
void local_to_full(const RankShard& shard, const ParamTable& full, const float* in, float* out,
                   int64_t from = 0);

// The local elements [begin, begin + count) of the shard, read from a source of the full
// flat buffer row piece by row piece (so no full array exists); the padding between regions
// is left as it is.
void shard_read(const RankShard& shard, const ParamTable& full, ParamSource& source, int64_t begin,
                int64_t count, float* dst);

// The tensor ranges of the segments, as slice offsets (the segments laid end to end): what a
// DP rank's slice of the distributed optimizer steps (a slice may cut a tensor).
std::vector<ParamRange> shard_slice_ranges(const RankShard& shard, const std::vector<SliceSegment>& segments);

// The ranks sharing this rank's KV head when the model has fewer KV heads than tp (their
// k/v rows' grads are partial sums); empty otherwise.
std::vector<int> kv_share_members(const ModelConfig& config, const ParallelLayout& layout,
                                  const RankCoords& at);

// Reads of this rank's DP slice of the state, what its distributed optimizer holds:
// dst[0, count) = the elements [offset, offset + count) of `group` in the slice.
using SliceRead = std::function<void(StateGroup group, int64_t offset, int64_t count, float* dst)>;

// The engine's data-parallel state around the shard: the DP slice each rank's distributed
// optimizer owns (under context parallelism the slice of its dp_cp rank, cp_rank + cp ·
// dp_rank: the CP ranks hold the same weights and split them as DP ranks do), the groups that reduce the
// partial grads, the grad norm's count of each element once, and the full tensors gathered from every rank's
// shard or streamed from them.
//
// `host` groups carry host memory (the scalars, the gathers of full tensors and the streamed
// reads); `data` groups carry the engine's tensors (the same groups on CPU ranks; device
// Comms on GPU ranks). Both must outlive this.
class DataParallelState {
 public:
  DataParallelState(const ModelConfig& config, const ParamTable& full, const EngineOptions& options,
                    Groups& host, Groups& data);

  const RankShard& shard() const { return shard_; }
  const ParamTable& full() const { return full_; }
  // The shard's flat buffer with each region padded to a multiple of its group, this DP
  // rank's slice of it (its segments, one a region, laid end to end).
  int64_t padded() const { return shard_.padded(); }
  int64_t slice() const { return slice_; }
  const std::vector<SliceSegment>& segments() const { return segments_; }
  std::vector<ParamRange> slice_ranges() const { return shard_slice_ranges(shard_, segments_); }
  // dst[0, count) = the slice's elements [begin, begin + count) read from a source of the full
  // flat buffer (0 in the padding).
  void slice_read(ParamSource& source, int64_t begin, int64_t count, float* dst) const;

  // The data group that reduces a partial grad.
  Comm& partial_comm(PartialGroup group) const;
  // The data group that splits a region (DP, or EDP for the experts).
  Comm& region_comm(const ShardRegion& region) const;
  // The parts of the slice counted once in the model (what the grad norm sums), cut at the shard's
  // tensors: offsets into the slice, each with its tensor's index in the full table. What a
  // rank counts of a per-tensor sum over the world (the non-finite grads of a failing step).
  std::vector<TensorRange> counted_tensor_ranges() const;
  // per_tensor (one value per entry of the full table) summed over the world, in place
  // (collective over the host world; fp64, so exact below 2⁵³).
  void sum_over_world(std::vector<int64_t>& per_tensor) const;
  // The full tensors laid out by the full table, on world rank 0 (empty elsewhere), from the
  // local buffers of DP rank 0 of each TP × PP position and, with ep > 1, the experts of
  // DP ranks 1 to ep − 1 (EDP rank 0 of the other EP ranks) (collective over the host
  // world; the other ranks' `local` is not read).
  std::vector<float> gather_full(const std::vector<float>& local) const;
  // The local buffer from every DP rank's slice: on DP rank 0 whole, on the other ranks of
  // EDP rank 0 its expert region (empty elsewhere; collective over the host DP group).
  std::vector<float> gather_slices(const float* slice) const;

  // The full state streamed (a checkpoint, final/'s masters) without a full tensor anywhere:
  // on world rank 0, a source whose every read of [begin, begin + count) asks each rank that
  // holds a part of that range for it, point to point over the host world, and places the
  // parts; meanwhile every other world rank runs state_serve, which answers those asks from
  // `read` until the source is destroyed. Each element of the model comes from one rank: the
  // DP rank whose slice holds it, of the one TP × PP position that counts it (`counted`: of a
  // replicated norm, KV head or tied embedding, its first holder; the replicas are equal bit
  // for bit), so the bytes are gather_full's. A read costs a request and a reply per rank
  // that holds part of it (the readers of io/ ask for at most kSafetensorsPieceNumel elements
  // of one tensor at a time: the ranks of that tensor's stage, not the world). World rank 0
  // holds, beside its own shard and the reader's dst, one buffer of `count` elements; the
  // others one of their part of it. state_source only on world rank 0;
  // what `read` reads (the engine) must outlive the source.
  //
  // Rank 0 asks and the others serve, rather than every rank running the writer's loop in
  // step (each read a collective): the other ranks then need not know in which order and
  // pieces io/'s writers read the state (no second copy of that iteration, nor a writer
  // that writes nothing), and a rank that holds no part of a read does nothing for it.
  std::unique_ptr<StateSource> state_source(SliceRead read) const;
  // On the other world ranks, once for each source world rank 0 makes.
  void state_serve(const SliceRead& read) const;

 private:
  ModelConfig config_;
  ParamTable full_;
  EngineOptions options_;
  Groups& host_;
  Groups& data_;
  RankShard shard_;
  int64_t dp_, dp_rank_;
  std::vector<SliceSegment> segments_;
  int64_t slice_;
  std::unique_ptr<Comm> kv_group_;  // of `data`, when KV heads are shared
};

}  // namespace loom
