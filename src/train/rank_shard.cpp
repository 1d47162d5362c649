#include "train/rank_shard.h"

#include <algorithm>

#include "core/error.h"

namespace loom {
namespace {

int64_t cols_of(const Shape& s) {
  return s.ndim == 1 ? 1 : s[1];
}

// The PP stage's layers [begin, end) of `layers`: layer_split or an even split.
std::pair<int64_t, int64_t> stage_layers(int64_t layers, int pp, int stage,
                                         const std::vector<int64_t>& split) {
  if (split.empty()) return {layers / pp * stage, layers / pp * (stage + 1)};
  int64_t begin = 0;
  for (int s = 0; s < stage; ++s) begin += split[static_cast<size_t>(s)];
  return {begin, begin + split[static_cast<size_t>(stage)]};
}

// What the shards need of the layout (recipe_load's layout_check makes the same checks).
void check_layout(const Qwen3Config& c, const ParallelLayout& layout, const EngineOptions& options) {
  const int64_t tp = layout.tp, kv = c.num_key_value_heads;
  if (c.num_attention_heads % tp != 0 || (kv % tp != 0 && tp % kv != 0) || c.intermediate_size % tp != 0 ||
      c.vocab_size % tp != 0)
    throw_input_error(
        "layout.tp",
        std::to_string(tp) + " does not split the heads, the KV heads, the FFN and the vocabulary evenly");
  if (layout.cp != 1) throw_input_error("layout.cp", "context parallel is not implemented (expected 1)");
  int64_t layers = 0;
  for (int64_t n : options.layer_split) layers += n;
  if (options.layer_split.empty()
          ? c.num_hidden_layers % layout.pp != 0
          : static_cast<int>(options.layer_split.size()) != layout.pp || layers != c.num_hidden_layers ||
                *std::min_element(options.layer_split.begin(), options.layer_split.end()) < 1)
    throw_input_error("layout.layer_split", "does not split the " + std::to_string(c.num_hidden_layers) +
                                                " layers into " + std::to_string(layout.pp) + " stages");
}

// Calls copy(local offset, full offset, count) for every row piece of the shard.
template <typename Copy>
void for_each_slice_row(const RankShard& shard, const ParamTable& full, Copy copy) {
  for (size_t i = 0; i < shard.slices.size(); ++i) {
    const SliceMap& s = shard.slices[i];
    const ParamSpec& f = full.params[static_cast<size_t>(s.full)];
    const int64_t full_cols = cols_of(f.shape);
    int64_t local = shard.table.params[i].offset;
    for (const RowBlock& b : s.blocks)
      for (int64_t row = b.row; row < b.row + b.rows; ++row, local += s.cols)
        copy(local, f.offset + row * full_cols + s.col, s.cols);
  }
}

}  // namespace

RankShard rank_shard(const Qwen3Config& c, const ParamTable& full, const ParallelLayout& layout,
                     const RankCoords& at, const EngineOptions& options) {
  check_layout(c, layout, options);
  const int64_t tp = layout.tp, r = at.tp, hd = c.head_dim;
  RankShard shard;
  ModelShard& m = shard.model;
  m.tp = tp;
  m.tp_rank = r;
  m.sequence_parallel = options.sequence_parallel && tp > 1;
  std::tie(m.layer_begin, m.layer_end) =
      stage_layers(c.num_hidden_layers, layout.pp, at.pp, options.layer_split);
  m.first_stage = at.pp == 0;
  m.last_stage = at.pp == layout.pp - 1;
  const HeadLayout heads = shard_heads(c, m);
  const int64_t q_rows = heads.q_heads * hd, kv_rows = heads.kv_heads * hd;
  const bool kv_replicated = c.num_key_value_heads < tp;
  // The KV heads of this rank: its own when split; when replicated, the one its q heads
  // use, shared by tp / kv_heads consecutive ranks.
  const int64_t kv_first = kv_replicated ? r / (tp / c.num_key_value_heads) : r * heads.kv_heads;
  const bool kv_holder = !kv_replicated || r % (tp / c.num_key_value_heads) == 0;
  const int64_t vocab = c.vocab_size / tp, ffn = c.intermediate_size / tp;
  const bool tied_copy = c.tie_word_embeddings && layout.pp > 1;

  auto add = [&](int full_index, std::vector<RowBlock> blocks, int64_t col, int64_t cols, bool replicated) {
    const ParamSpec& f = full.params[static_cast<size_t>(full_index)];
    int64_t rows = 0;
    for (const RowBlock& b : blocks) rows += b.rows;
    const Shape shape = f.shape.ndim == 1 ? Shape{rows} : Shape{rows, cols};
    const int64_t offset = shard.table.total_numel;
    shard.table.params.push_back({f.name, f.kind, f.layer, shape, offset});
    shard.table.total_numel += shape.numel();
    shard.slices.push_back({full_index, std::move(blocks), col, cols});
    if (!replicated || r == 0) shard.counted.emplace_back(offset, shape.numel());
    return offset;
  };
  auto full_param = [&](int i) { return full.params[static_cast<size_t>(i)]; };
  auto whole = [&](int i) {
    const ParamSpec& f = full_param(i);
    return add(i, {{0, f.shape[0]}}, 0, cols_of(f.shape), tp > 1);
  };
  // A norm's weight: replicated over TP; its grad is partial under SP (each rank's tokens).
  auto norm = [&](int i, bool partial) {
    const int64_t offset = whole(i);
    if (partial && tp > 1) shard.partials.push_back({PartialGroup::tp, offset, full_param(i).numel()});
  };
  auto vocab_rows = [&](int i) {
    const ParamSpec& f = full_param(i);
    const int64_t offset = add(i, {{r * vocab, vocab}}, 0, f.shape[1], false);
    if (tied_copy) {
      shard.partials.push_back({PartialGroup::embedding, offset, vocab * f.shape[1]});
      // The last stage's copy is the first stage's tensor again.
      if (!m.first_stage) shard.counted.pop_back();
    }
  };

  for (size_t i = 0; i < full.params.size(); ++i) {
    const ParamSpec& f = full.params[i];
    const int index = static_cast<int>(i);
    const bool in_stage = f.layer >= m.layer_begin && f.layer < m.layer_end;
    switch (f.kind) {
      case ParamKind::embedding:
        if (m.first_stage || (m.last_stage && c.tie_word_embeddings)) vocab_rows(index);
        break;
      case ParamKind::lm_head:
        if (m.last_stage) vocab_rows(index);
        break;
      case ParamKind::final_norm:
        if (m.last_stage) norm(index, m.sequence_parallel);
        break;
      case ParamKind::input_norm:
      case ParamKind::post_attn_norm:
        if (in_stage) norm(index, m.sequence_parallel);
        break;
      case ParamKind::q_norm:
      case ParamKind::k_norm:
        if (in_stage) norm(index, true);
        break;
      case ParamKind::qkv:
        if (in_stage) {
          const int64_t offset = add(index,
                                     {{r * q_rows, q_rows},
                                      {c.q_dim() + kv_first * hd, kv_rows},
                                      {c.q_dim() + c.kv_dim() + kv_first * hd, kv_rows}},
                                     0, c.hidden_size, false);
          if (kv_replicated) {
            const int64_t kv_offset = offset + q_rows * c.hidden_size, kv_numel = 2 * kv_rows * c.hidden_size;
            shard.partials.push_back({PartialGroup::kv, kv_offset, kv_numel});
            if (!kv_holder) shard.counted.back().second = q_rows * c.hidden_size;
          }
        }
        break;
      case ParamKind::o_proj:
        if (in_stage) add(index, {{0, c.hidden_size}}, r * q_rows, q_rows, false);
        break;
      case ParamKind::gate_up:
        if (in_stage)
          add(index, {{r * ffn, ffn}, {c.intermediate_size + r * ffn, ffn}}, 0, c.hidden_size, false);
        break;
      case ParamKind::down:
        if (in_stage) add(index, {{0, c.hidden_size}}, r * ffn, ffn, false);
        break;
    }
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
  for_each_slice_row(shard, full,
                     [&](int64_t local, int64_t at, int64_t n) { std::copy_n(in + at, n, out + local); });
}

void local_to_full(const RankShard& shard, const ParamTable& full, const float* in, float* out) {
  for_each_slice_row(shard, full,
                     [&](int64_t local, int64_t at, int64_t n) { std::copy_n(in + local, n, out + at); });
}

void shard_read(const RankShard& shard, const ParamTable& full, ParamSource& source, int64_t begin,
                int64_t count, float* dst) {
  const int64_t end = begin + count;
  for_each_slice_row(shard, full, [&](int64_t local, int64_t at, int64_t n) {
    const int64_t b = std::max(local, begin), e = std::min(local + n, end);
    if (b < e) source.read(at + (b - local), e - b, dst + (b - begin));
  });
}

std::vector<ParamRange> shard_slice_ranges(const RankShard& shard, int64_t lo, int64_t count) {
  std::vector<ParamRange> ranges;
  const int64_t hi = lo + count;
  for (const ParamSpec& p : shard.table.params) {
    const int64_t b = std::max(p.offset, lo), e = std::min(p.offset + p.numel(), hi);
    if (b < e) ranges.push_back({b - lo, e - b, p.decay()});
  }
  return ranges;
}

std::vector<int> kv_share_members(const Qwen3Config& config, const ParallelLayout& layout,
                                  const RankCoords& at) {
  if (config.num_key_value_heads >= layout.tp) return {};
  // tp / kv_heads consecutive TP ranks share a KV head.
  const int share = static_cast<int>(layout.tp / config.num_key_value_heads);
  std::vector<int> members;
  for (int i = 0; i < share; ++i) members.push_back(at.tp / share * share + i);
  return members;
}

ShardedModel::ShardedModel(const Qwen3Config& config, const ParamTable& full, const EngineOptions& options,
                           Groups& host, Groups& data)
    : config_(config),
      full_(full),
      options_(options),
      host_(host),
      data_(data),
      shard_(rank_shard(config, full, host.layout, host.coords, options)),
      dp_(host.layout.dp),
      dp_rank_(host.coords.dp),
      slice_((shard_.table.total_numel + dp_ - 1) / dp_) {
  const std::vector<int> members = kv_share_members(config, host.layout, host.coords);
  if (!members.empty()) kv_group_ = data.tp->split(members, "tp_kv", options.comm_timeout);
}

Comm& ShardedModel::partial_comm(PartialGroup group) const {
  switch (group) {
    case PartialGroup::tp: return *data_.tp;
    case PartialGroup::kv: return *kv_group_;
    case PartialGroup::embedding: break;
  }
  return *data_.embedding;
}

double ShardedModel::counted_sum(const std::function<double(int64_t, int64_t)>& sum) const {
  double total = 0;
  const int64_t lo = slice_begin();
  for (const auto& [offset, numel] : shard_.counted) {
    const int64_t b = std::max(offset, lo), e = std::min(offset + numel, lo + slice_);
    if (b < e) total += sum(b - lo, e - b);
  }
  host_.world->all_reduce_sum(&total, 1, DType::f64, options_.comm_timeout);
  return total;
}

std::vector<float> ShardedModel::gather_full(const std::vector<float>& local) const {
  // Point to point into world rank 0 alone, one shard at a time: an all-gather would hold
  // world × shard on every rank (8 × 16 GB for a Qwen3-32B TP4 × PP2 shard's masters).
  Comm& world = *host_.world;
  const RankLayout layout(world.size(), host_.layout);
  if (world.rank() != 0) {
    if (host_.coords.dp == 0)
      world.send(local.data(), static_cast<size_t>(shard_.table.total_numel), DType::f32, 0,
                 options_.comm_timeout);
    return {};
  }
  std::vector<float> out(static_cast<size_t>(full_.total_numel));
  local_to_full(shard_, full_, local.data(), out.data());
  std::vector<float> received;
  for (int r = 1; r < world.size(); ++r) {
    if (layout.coords(r).dp != 0) continue;
    const RankShard other = rank_shard(config_, full_, layout.layout(), layout.coords(r), options_);
    received.resize(static_cast<size_t>(other.table.total_numel));
    world.recv(received.data(), received.size(), DType::f32, r, options_.comm_timeout);
    local_to_full(other, full_, received.data(), out.data());
  }
  return out;
}

void ShardedModel::read_state(StateSource& state, StateGroup group, int64_t begin, int64_t count,
                              float* dst) const {
  // One group of the state as a source of flat ranges of the full table.
  class GroupSource final : public ParamSource {
   public:
    GroupSource(StateSource& state, StateGroup group) : state_(state), group_(group) {}
    void read(int64_t b, int64_t n, float* out) override { state_.read(group_, b, n, out); }

   private:
    StateSource& state_;
    StateGroup group_;
  } source(state, group);
  // The padding past the shard's tensors reads as 0.
  std::fill(dst, dst + count, 0.0f);
  shard_read(shard_, full_, source, begin, count, dst);
}

std::vector<float> ShardedModel::gather_slices(const float* slice) const {
  Comm& dp = *host_.dp;
  if (dp.rank() != 0) {
    dp.send(slice, static_cast<size_t>(slice_), DType::f32, 0, options_.comm_timeout);
    return {};
  }
  std::vector<float> local(static_cast<size_t>(padded()));
  std::copy_n(slice, slice_, local.begin());
  for (int r = 1; r < dp.size(); ++r)
    dp.recv(local.data() + r * slice_, static_cast<size_t>(slice_), DType::f32, r, options_.comm_timeout);
  return local;
}

}  // namespace loom
