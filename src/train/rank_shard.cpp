#include "train/rank_shard.h"

#include <algorithm>

#include "core/error.h"

namespace loom {
namespace {

// A rank's place among the ranks its distributed optimizer splits the shard over: its DP
// rank, or under context parallelism its dp_cp rank (the CP ranks of a DP rank hold the same
// weights and reduce their grads with DP's, as Megatron's).
int64_t data_parallel_rank(const ParallelLayout& layout, const RankCoords& c) {
  return c.cp + layout.cp * c.dp;
}

int64_t cols_of(const Shape& s) {
  return s.ndim == 1 ? 1 : s[1];
}

// The end of the local tensors [first, end) of the shard (their last one's).
int64_t tensors_end(const RankShard& shard, size_t first, size_t end) {
  if (first == end) return first < shard.table.params.size() ? shard.table.params[first].offset : 0;
  const ParamSpec& last = shard.table.params[end - 1];
  return last.offset + last.numel();
}

// The local elements of a region of the shard whose full offsets are below x. Within a
// region local to full is increasing (its local tensors in the full table's order, each
// one's row blocks in ascending rows, a row's columns in order), so the elements of the
// region a full range [b, e) holds are the local ones [local_below(b), local_below(e)).
int64_t local_below(const RankShard& shard, const ParamTable& full, const ShardRegion& region, int64_t x) {
  const auto full_of = [&](size_t i) -> const ParamSpec& {
    return full.params[static_cast<size_t>(shard.slices[i].full)];
  };
  // The first local tensor of the region whose full tensor ends past x.
  size_t lo = region.first, hi = region.end;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (full_of(mid).offset + full_of(mid).numel() <= x)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == region.end) return tensors_end(shard, region.first, region.end);
  const SliceMap& s = shard.slices[lo];
  const ParamSpec& f = full_of(lo);
  int64_t below = shard.table.params[lo].offset;
  if (x <= f.offset) return below;
  const int64_t full_cols = cols_of(f.shape), row = (x - f.offset) / full_cols,
                col = (x - f.offset) % full_cols;
  for (const RowBlock& b : s.blocks) {
    below += std::clamp<int64_t>(row - b.row, 0, b.rows) * s.cols;
    if (row >= b.row && row < b.row + b.rows) below += std::clamp<int64_t>(col - s.col, 0, s.cols);
  }
  return below;
}

// The slice offset of the local element `local`, which one of `segments` holds.
int64_t slice_offset(const std::vector<SliceSegment>& segments, int64_t local) {
  int64_t at = 0;
  for (const SliceSegment& seg : segments) {
    if (local >= seg.begin && local < seg.begin + seg.count) return at + (local - seg.begin);
    at += seg.count;
  }
  LOOM_ASSERT(false, "a local element outside the slice");
  return 0;
}

// The local ranges [lo, hi), ascending, that a rank with this shard and the DP slice
// `segments` (one a region) sends for a streamed read of the full range [begin, end): its
// elements in the range, in its slice, and counted (of a replicated element, only one holder
// sends). Each range lies in one segment.
std::vector<std::pair<int64_t, int64_t>> streamed_ranges(const RankShard& shard, const ParamTable& full,
                                                         const std::vector<SliceSegment>& segments,
                                                         int64_t begin, int64_t end) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (size_t r = 0; r < shard.regions.size(); ++r) {
    const ShardRegion& region = shard.regions[r];
    const SliceSegment& seg = segments[r];
    const int64_t lo = std::max(local_below(shard, full, region, begin), seg.begin);
    const int64_t hi = std::min(local_below(shard, full, region, end), seg.begin + seg.count);
    if (lo >= hi) continue;
    const auto first = std::partition_point(shard.counted.begin(), shard.counted.end(),
                                            [&](const auto& c) { return c.first + c.second <= lo; });
    for (auto c = first; c != shard.counted.end() && c->first < hi; ++c) {
      const int64_t b = std::max(c->first, lo), e = std::min(c->first + c->second, hi);
      if (b < e) ranges.emplace_back(b, e);
    }
  }
  return ranges;
}

// How much of a local tensor one piece of for_each_local_piece may span: one row, or, where a
// row block has every column of the full tensor (so it is contiguous there too), the block.
enum class PieceSpan { row, block };

// Calls copy(local offset, full offset, count) for the local elements [lo, hi) of the shard
// (hi at most its tensors' end) in ascending order, piece by piece: each piece within one row
// of a tensor, or with PieceSpan::block within one row block that has every column. The
// padding between regions is skipped.
template <typename Copy>
void for_each_local_piece(const RankShard& shard, const ParamTable& full, int64_t lo, int64_t hi,
                          PieceSpan span, Copy copy) {
  const std::vector<ParamSpec>& params = shard.table.params;
  size_t i = static_cast<size_t>(std::partition_point(params.begin(), params.end(),
                                                      [&](const ParamSpec& p) { return p.offset <= lo; }) -
                                 params.begin()) -
             1;
  for (; lo < hi && i < params.size(); ++i) {
    lo = std::max(lo, params[i].offset);
    const SliceMap& s = shard.slices[i];
    const ParamSpec& f = full.params[static_cast<size_t>(s.full)];
    const int64_t full_cols = cols_of(f.shape);
    int64_t at = params[i].offset;  // where the block starts in the local buffer
    for (const RowBlock& b : s.blocks) {
      const int64_t block_end = at + b.rows * s.cols;
      while (lo < hi && lo < block_end) {
        const int64_t row = (lo - at) / s.cols, col = (lo - at) % s.cols;
        const int64_t stop =
            span == PieceSpan::block && s.cols == full_cols ? block_end : lo + (s.cols - col);
        const int64_t n = std::min(hi, stop) - lo;
        copy(lo, f.offset + (b.row + row) * full_cols + s.col + col, n);
        lo += n;
      }
      at = block_end;
    }
  }
}

// A streamed read's request to a rank, sent as i32 words: read (group, begin, count), or done.
struct StreamRequest {
  int64_t done = 0;
  int64_t group = 0;
  int64_t begin = 0;
  int64_t count = 0;
};
constexpr size_t kRequestWords = sizeof(StreamRequest) / sizeof(int32_t);

// The full state on world rank 0, each read asked of the ranks holding its parts
// (DataParallelState::state_source).
class StreamedState final : public StateSource {
 public:
  StreamedState(const ParamTable& full, std::vector<RankShard> positions, const ParallelLayout& layout,
                Comm& world, CommTimeout timeout, SliceRead read)
      : full_(full),
        positions_(std::move(positions)),
        layout_(world.size(), layout),
        world_(world),
        timeout_(timeout),
        read_(std::move(read)) {}

  // Tells every other rank that this source is done: their state_serve returns.
  ~StreamedState() override {
    StreamRequest done{1, 0, 0, 0};
    std::vector<P2POp> ops;
    for (int r = 1; r < world_.size(); ++r)
      ops.push_back({P2POp::Kind::send, &done, kRequestWords, DType::i32, r});
    try {
      world_.exchange(ops, timeout_);
    } catch (const std::exception&) {
      // A rank is gone or hung: the run is failing, and its next collective says so (a
      // destructor, reached while an error unwinds, must not throw).
    }
  }

  int64_t numel() const override { return full_.total_numel; }

  void read(StateGroup group, int64_t begin, int64_t count, float* dst) override {
    LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= full_.total_numel, "state range past the end");
    // Each rank's part, packed in its local order: parts_[k] its ranges, into buffer_ from at.
    parts_.clear();
    buffer_.resize(std::max(buffer_.size(), static_cast<size_t>(count)));
    std::vector<P2POp> ops;
    StreamRequest request{0, static_cast<int64_t>(group), begin, count};
    int64_t at = 0;
    for (int r = 0; r < world_.size(); ++r) {
      const RankCoords c = layout_.coords(r);
      const RankShard& shard = position_of(c);
      const std::vector<SliceSegment> segments =
          shard_slice_segments(shard, data_parallel_rank(layout_.layout(), c));
      Part part{r, streamed_ranges(shard, full_, segments, begin, begin + count), at};
      int64_t n = 0;
      for (const auto& [lo, hi] : part.ranges) {
        if (r == 0) read_(group, slice_offset(segments, lo), hi - lo, buffer_.data() + at + n);
        n += hi - lo;
      }
      if (n == 0) continue;
      if (r != 0) {
        ops.push_back({P2POp::Kind::send, &request, kRequestWords, DType::i32, r});
        ops.push_back({P2POp::Kind::recv, buffer_.data() + at, static_cast<size_t>(n), DType::f32, r});
      }
      parts_.push_back(std::move(part));
      at += n;
    }
    LOOM_ASSERT(at == count, "the ranks' parts of a streamed read do not tile it");
    if (!ops.empty()) world_.exchange(ops, timeout_);
    for (const Part& part : parts_) {
      const RankShard& shard = position_of(layout_.coords(part.rank));
      const float* from = buffer_.data() + part.at;
      for (const auto& [lo, hi] : part.ranges) {
        for_each_local_piece(shard, full_, lo, hi, PieceSpan::block,
                             [&](int64_t local, int64_t full_at, int64_t n) {
                               std::copy_n(from + (local - lo), n, dst + (full_at - begin));
                             });
        from += hi - lo;
      }
    }
  }

 private:
  // The shard of the TP × PP × EP position of a rank.
  const RankShard& position_of(const RankCoords& c) const {
    const ParallelLayout& l = layout_.layout();
    return positions_[static_cast<size_t>((c.pp * l.tp + c.tp) * l.ep + c.dp % l.ep)];
  }
  struct Part {
    int rank;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    int64_t at;
  };
  const ParamTable& full_;
  std::vector<RankShard> positions_;  // per TP × PP × EP position, (pp · tp + tp) · ep + ep rank
  RankLayout layout_;
  Comm& world_;
  CommTimeout timeout_;
  SliceRead read_;
  std::vector<Part> parts_;
  std::vector<float> buffer_;
};

}  // namespace

std::vector<SliceSegment> shard_slice_segments(const RankShard& shard, int64_t dp_rank) {
  std::vector<SliceSegment> segments;
  for (const ShardRegion& region : shard.regions) {
    const int64_t rank = region.group == GroupKind::edp ? dp_rank / shard.ep : dp_rank;
    segments.push_back({region.begin + rank * region.chunk(), region.chunk()});
  }
  return segments;
}

RankShard rank_shard(const ModelConfig& c, const ParamTable& full, const ParallelLayout& layout,
                     const RankCoords& at, const EngineOptions& options) {
  const ShardLayout spec{layout.tp, layout.pp, options.sequence_parallel, options.layer_split, 1, layout.ep};
  shard_layout_require(c, spec);
  if (layout.cp > 1 && layout.ep > 1)
    throw_input_error("layout.cp, layout.ep",
                      "context parallel beside expert parallel is not implemented (expected ep = 1)");
  RankShard shard;
  shard.ep = layout.ep;
  ModelShard& m = shard.model;
  m.tp = layout.tp;
  m.tp_rank = at.tp;
  m.sequence_parallel = options.sequence_parallel && layout.tp > 1;
  m.ep = layout.ep;
  m.ep_rank = at.dp % layout.ep;
  const LayerRange layers = stage_layer_range(c, spec, at.pp);
  m.layer_begin = layers.begin;
  m.layer_end = layers.end;
  m.first_stage = at.pp == 0;
  m.last_stage = at.pp == layout.pp - 1;
  // One region of every tensor over DP (over dp_cp under context parallelism); with ep > 1 the
  // dense tensors', then the experts' over EDP (ShardRegion). Each region is padded to a
  // multiple of its group's size.
  const int64_t dp = layout.dp * layout.cp, edp = layout.dp / layout.ep;
  auto add_region = [&](GroupKind group, int64_t ranks, bool experts) {
    ShardRegion region{group, shard.table.params.size(), 0, shard.table.total_numel, 0, ranks};
    for (size_t i = 0; i < full.params.size(); ++i) {
      const ParamSpec& f = full.params[i];
      if (layout.ep > 1 && is_expert_kind(f.kind) != experts) continue;
      TensorShard t = tensor_shard(c, spec, at.tp, at.pp, f, m.ep_rank);
      if (!t.held) continue;
      const int64_t offset = shard.table.total_numel;
      shard.table.params.push_back({f.name, f.kind, f.layer, t.shape, offset});
      shard.table.total_numel += t.shape.numel();
      shard.slices.push_back({static_cast<int>(i), std::move(t.blocks), t.col, t.cols});
      if (t.partial_numel > 0)
        shard.partials.push_back({t.partial_group, offset + t.partial_offset, t.partial_numel});
      if (t.counted > 0) shard.counted.emplace_back(offset, t.counted);
    }
    region.end = shard.table.params.size();
    const int64_t numel = shard.table.total_numel - region.begin;
    region.padded = (numel + ranks - 1) / ranks * ranks;
    shard.regions.push_back(region);
  };
  add_region(layout.cp > 1 ? GroupKind::dp_cp : GroupKind::dp, dp, false);
  if (layout.ep > 1) {
    // The experts' region starts past the dense one's padding.
    shard.table.total_numel = shard.regions.back().begin + shard.regions.back().padded;
    add_region(GroupKind::edp, edp, true);
  }
  // Adjacent ranges as one: the grad norm sums each with one pass (and, on GPU ranks, one
  // wait for the device) instead of one a tensor.
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& [offset, numel] : shard.counted) {
    if (!merged.empty() && merged.back().first + merged.back().second == offset)
      merged.back().second += numel;
    else
      merged.emplace_back(offset, numel);
  }
  shard.counted = std::move(merged);
  return shard;
}

void full_to_local(const RankShard& shard, const ParamTable& full, const float* in, float* out) {
  for_each_local_piece(shard, full, 0, shard.table.total_numel, PieceSpan::row,
                       [&](int64_t local, int64_t at, int64_t n) { std::copy_n(in + at, n, out + local); });
}

void local_to_full(const RankShard& shard, const ParamTable& full, const float* in, float* out,
                   int64_t from) {
  for_each_local_piece(shard, full, from, shard.table.total_numel, PieceSpan::row,
                       [&](int64_t local, int64_t at, int64_t n) { std::copy_n(in + local, n, out + at); });
}

void shard_read(const RankShard& shard, const ParamTable& full, ParamSource& source, int64_t begin,
                int64_t count, float* dst) {
  // A row at a time, even where a block of rows is contiguous in the full tensor too: a
  // source is asked for at most one row piece a read, so one that stages what a read asks
  // for (a streamed state's buffer) holds a row, not a tensor. The padding past the shard's
  // tensors is in no source: its part of dst is left as it is.
  for_each_local_piece(
      shard, full, begin, std::min(begin + count, shard.table.total_numel), PieceSpan::row,
      [&](int64_t local, int64_t at, int64_t n) { source.read(at, n, dst + (local - begin)); });
}

std::vector<ParamRange> shard_slice_ranges(const RankShard& shard,
                                           const std::vector<SliceSegment>& segments) {
  std::vector<ParamRange> ranges;
  int64_t at = 0;
  for (const SliceSegment& seg : segments) {
    const int64_t lo = seg.begin, hi = seg.begin + seg.count;
    for (const ParamSpec& p : shard.table.params) {
      const int64_t b = std::max(p.offset, lo), e = std::min(p.offset + p.numel(), hi);
      if (b < e) ranges.push_back({at + b - lo, e - b, p.decay()});
    }
    at += seg.count;
  }
  return ranges;
}

std::vector<int> kv_share_members(const ModelConfig& config, const ParallelLayout& layout,
                                  const RankCoords& at) {
  const int share = static_cast<int>(shard_kv_share(config, layout.tp));
  if (share == 1) return {};
  std::vector<int> members;
  for (int i = 0; i < share; ++i) members.push_back(at.tp / share * share + i);
  return members;
}

DataParallelState::DataParallelState(const ModelConfig& config, const ParamTable& full,
                                     const EngineOptions& options, Groups& host, Groups& data)
    : config_(config),
      full_(full),
      options_(options),
      host_(host),
      data_(data),
      shard_(rank_shard(config, full, host.layout, host.coords, options)),
      dp_(host.layout.dp * host.layout.cp),
      dp_rank_(data_parallel_rank(host.layout, host.coords)),
      segments_(shard_slice_segments(shard_, dp_rank_)),
      slice_(0) {
  for (const SliceSegment& seg : segments_) slice_ += seg.count;
  const std::vector<int> members = kv_share_members(config, host.layout, host.coords);
  if (!members.empty()) kv_group_ = data.tp->split(members, "tp_kv", options.comm_timeout);
}

Comm& DataParallelState::partial_comm(PartialGroup group) const {
  switch (group) {
    case PartialGroup::tp: return *data_.tp;
    case PartialGroup::kv: return *kv_group_;
    case PartialGroup::embedding: break;
  }
  return *data_.embedding;
}

Comm& DataParallelState::region_comm(const ShardRegion& region) const {
  switch (region.group) {
    case GroupKind::edp: return *data_.edp;
    case GroupKind::dp_cp: return *data_.dp_cp;
    default: return *data_.dp;
  }
}

std::vector<TensorRange> DataParallelState::counted_tensor_ranges() const {
  std::vector<TensorRange> ranges;
  int64_t at = 0;
  for (const SliceSegment& seg : segments_) {
    const int64_t lo = seg.begin, hi = lo + seg.count;
    for (size_t i = 0; i < shard_.table.params.size(); ++i) {
      const ParamSpec& p = shard_.table.params[i];
      for (const auto& [offset, numel] : shard_.counted) {
        const int64_t b = std::max({offset, p.offset, lo});
        const int64_t e = std::min({offset + numel, p.offset + p.numel(), hi});
        if (b < e) ranges.push_back({at + b - lo, e - b, shard_.slices[i].full});
      }
    }
    at += seg.count;
  }
  return ranges;
}

void DataParallelState::slice_read(ParamSource& source, int64_t begin, int64_t count, float* dst) const {
  int64_t at = 0;  // the segment's first slice offset
  for (const SliceSegment& seg : segments_) {
    const int64_t b = std::max(begin, at), e = std::min(begin + count, at + seg.count);
    if (b < e) shard_read(shard_, full_, source, seg.begin + (b - at), e - b, dst + (b - begin));
    at += seg.count;
  }
}

void DataParallelState::sum_over_world(std::vector<int64_t>& per_tensor) const {
  LOOM_ASSERT(per_tensor.size() == full_.params.size(), "per-tensor values of another table");
  std::vector<double> sums(per_tensor.begin(), per_tensor.end());
  host_.world->all_reduce_sum(sums.data(), sums.size(), DType::f64, options_.comm_timeout);
  for (size_t i = 0; i < sums.size(); ++i) per_tensor[i] = static_cast<int64_t>(sums[i]);
}

std::vector<float> DataParallelState::gather_full(const std::vector<float>& local) const {
  // Point to point into world rank 0 alone, one shard at a time: an all-gather would hold
  // world × shard on every rank (8 × 16 GB for a Qwen3-32B TP4 × PP2 shard's masters). DP
  // rank 0 sends its whole shard, DP ranks 1 to ep − 1 their experts (the dense tensors are
  // DP rank 0's again).
  Comm& world = *host_.world;
  const RankLayout layout(world.size(), host_.layout);
  const int ep = host_.layout.ep;
  const auto sent_from = [&](const RankShard& shard, int dp_rank) {
    const int64_t begin = dp_rank == 0 ? 0 : shard.regions.back().begin;
    return std::pair{begin, shard.table.total_numel};
  };
  if (world.rank() != 0) {
    if (dp_rank_ < ep) {
      const auto [begin, end] = sent_from(shard_, static_cast<int>(dp_rank_));
      world.send(local.data() + begin, static_cast<size_t>(end - begin), DType::f32, 0,
                 options_.comm_timeout);
    }
    return {};
  }
  std::vector<float> out(static_cast<size_t>(full_.total_numel));
  local_to_full(shard_, full_, local.data(), out.data());
  std::vector<float> received;
  for (int r = 1; r < world.size(); ++r) {
    const RankCoords c = layout.coords(r);
    const auto dp_rank = static_cast<int>(data_parallel_rank(layout.layout(), c));
    if (dp_rank >= ep) continue;
    const RankShard other = rank_shard(config_, full_, layout.layout(), c, options_);
    const auto [begin, end] = sent_from(other, dp_rank);
    received.assign(static_cast<size_t>(other.table.total_numel), 0.0f);
    world.recv(received.data() + begin, static_cast<size_t>(end - begin), DType::f32, r,
               options_.comm_timeout);
    local_to_full(other, full_, received.data(), out.data(), begin);
  }
  return out;
}

std::unique_ptr<StateSource> DataParallelState::state_source(SliceRead read) const {
  Comm& world = *host_.world;
  LOOM_ASSERT(world.rank() == 0, "a streamed state is read on world rank 0; the others serve it");
  // Every TP × PP position's shard (a few hundred tensor specs each): which local elements
  // each rank holds, to ask it for them and place what it sends.
  std::vector<RankShard> positions;
  for (int pp = 0; pp < host_.layout.pp; ++pp)
    for (int tp = 0; tp < host_.layout.tp; ++tp)
      for (int ep = 0; ep < host_.layout.ep; ++ep)
        positions.push_back(rank_shard(config_, full_, host_.layout, RankCoords{tp, 0, ep, pp}, options_));
  return std::make_unique<StreamedState>(full_, std::move(positions), host_.layout, world,
                                         options_.comm_timeout, std::move(read));
}

void DataParallelState::state_serve(const SliceRead& read) const {
  Comm& world = *host_.world;
  LOOM_ASSERT(world.rank() != 0, "world rank 0 reads a streamed state; the others serve it");
  std::vector<float> part;
  for (;;) {
    StreamRequest request;
    world.recv(&request, kRequestWords, DType::i32, 0, options_.comm_timeout);
    if (request.done) return;
    // The ranges world rank 0 computed for this rank, in the same order.
    const auto ranges =
        streamed_ranges(shard_, full_, segments_, request.begin, request.begin + request.count);
    int64_t n = 0;
    for (const auto& [lo, hi] : ranges) n += hi - lo;
    LOOM_ASSERT(n > 0, "asked for a streamed read this rank holds no part of");
    part.resize(static_cast<size_t>(n));
    int64_t at = 0;
    for (const auto& [lo, hi] : ranges) {
      read(static_cast<StateGroup>(request.group), slice_offset(segments_, lo), hi - lo, part.data() + at);
      at += hi - lo;
    }
    world.send(part.data(), part.size(), DType::f32, 0, options_.comm_timeout);
  }
}

std::vector<float> DataParallelState::gather_slices(const float* slice) const {
  // Each region's chunks into the DP ranks that send it on (gather_full): DP rank 0 takes
  // every region's, EDP rank 0 of another EP rank its experts'.
  Comm& dp = host_.layout.cp > 1 ? *host_.dp_cp : *host_.dp;
  const int ep = static_cast<int>(shard_.ep);
  std::vector<float> local;
  if (dp_rank_ < ep) local.assign(static_cast<size_t>(padded()), 0.0f);
  int64_t at = 0;  // the region's segment in the slice
  for (size_t r = 0; r < shard_.regions.size(); ++r) {
    const ShardRegion& region = shard_.regions[r];
    const int64_t chunk = region.chunk();
    const bool experts = region.group == GroupKind::edp;
    // The DP ranks of this rank's group for the region (edp: those of its EP rank), in order.
    std::vector<int> members;
    for (int d = 0; d < dp.size(); ++d)
      if (!experts || d % ep == dp_rank_ % ep) members.push_back(d);
    const int root = experts ? static_cast<int>(dp_rank_ % ep) : 0;
    if (dp_rank_ != root) {
      dp.send(slice + at, static_cast<size_t>(chunk), DType::f32, root, options_.comm_timeout);
    } else {
      for (size_t k = 0; k < members.size(); ++k) {
        float* to = local.data() + region.begin + static_cast<int64_t>(k) * chunk;
        if (members[k] == dp_rank_)
          std::copy_n(slice + at, chunk, to);
        else
          dp.recv(to, static_cast<size_t>(chunk), DType::f32, members[k], options_.comm_timeout);
      }
    }
    at += chunk;
  }
  return local;
}

}  // namespace loom
