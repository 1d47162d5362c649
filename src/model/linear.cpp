#include "model/linear.h"

#include "core/error.h"

namespace loom {
namespace {

// The token count of the weight gradient's transposed operands: FP8 GEMMs need their K in
// multiples of 16, and the casts write zeros past the tokens (ops.h fp8_cast).
int64_t padded_tokens(int64_t tokens) {
  return (tokens + 15) / 16 * 16;
}

// The same under block scaling: whole 128-blocks of tokens where cuBLASLt's block-scaled GEMMs
// need their K so (the zeros change no block's amax, nor where the blocks fall); the CPU twin
// takes a partial last block, so it sums over the tokens alone, to the same values.
int64_t block_padded_tokens(int64_t tokens, Device device) {
  if (device == Device::cpu) return tokens;
  return (tokens + kFp8BlockSize - 1) / kFp8BlockSize * kFp8BlockSize;
}

// Where x_stats holds x's 1/scale: 16 bytes past its amax, since cuBLASLt reads the scales
// through pointers it wants 16-byte aligned.
constexpr int64_t kScaleInvAt = 4;

// Element i of an f32 tensor, as an f32[1].
Tensor element(const Tensor& t, int64_t i) {
  return Tensor{static_cast<float*>(t.data) + i, {1}, DType::f32, t.device};
}

}  // namespace

LinearSplit linear_split(ParamKind kind) {
  LOOM_ASSERT(kind == ParamKind::qkv || kind == ParamKind::o_proj || kind == ParamKind::gate_up ||
                  kind == ParamKind::down,
              "not a linear layer of the decoder block");
  return kind == ParamKind::qkv || kind == ParamKind::gate_up ? LinearSplit::column : LinearSplit::row;
}

std::string Fp8Stats::kind_name(int kind) {
  static const char* const layers[kLayers] = {"qkv", "o_proj", "gate_up", "down"};
  static const char* const roles[3] = {"input", "weight", "output_grad"};
  return std::string(layers[kind / 3]) + "." + roles[kind % 3];
}

int Fp8Stats::kind_of(ParamKind layer, Role role) {
  (void)linear_split(layer);  // asserts a linear layer
  const int index = layer == ParamKind::qkv       ? 0
                    : layer == ParamKind::o_proj  ? 1
                    : layer == ParamKind::gate_up ? 2
                                                  : 3;
  return 3 * index + role;
}

BlockLinears::BlockLinears(Ops& ops, LinearPrecision precision, int64_t layers, TensorAllocator* weight_cache,
                           TpCollectives* tp, int64_t tp_size, int64_t tp_rank)
    : ops_(ops),
      precision_(precision),
      layers_(layers),
      weight_cache_(weight_cache),
      tp_(tp),
      tp_size_(tp_size),
      tp_rank_(tp_rank) {
  LOOM_ASSERT(!precision.fp8 || weight_cache, "FP8 linear layers need memory for their FP8 weights");
  LOOM_ASSERT(tp_size == 1 || tp, "a tensor-parallel shard needs its TP collectives");
}

void BlockLinears::set_precision(const LinearPrecision& precision, TensorAllocator* weight_cache) {
  LOOM_ASSERT(!precision.fp8 || weight_cache, "FP8 linear layers need memory for their FP8 weights");
  precision_ = precision;
  weight_cache_ = weight_cache;
  weights_.clear();
  census_amax_ = census_counts_ = Tensor{};
}

void BlockLinears::census_begin() {
  LOOM_ASSERT(precision_.fp8, "FP8 statistics need FP8 linear layers");
  if (!census_amax_.data) {
    census_amax_ = weight_cache_->allocate({Fp8Stats::kKinds}, DType::f32, "FP8 statistics (amax)");
    census_counts_ = weight_cache_->allocate({Fp8Stats::kKinds, 2}, DType::i64, "FP8 statistics (counts)");
  }
  ops_.fill_zero(census_amax_);
  ops_.fill_zero(census_counts_);
  census_values_.fill(0);
  census_on_ = true;
  census_paused_ = false;
  weights_changed();
}

Fp8Stats BlockLinears::census_end() {
  LOOM_ASSERT(census_on_, "census_end without census_begin");
  census_on_ = false;
  std::array<float, Fp8Stats::kKinds> amax{};
  std::array<int64_t, 2 * Fp8Stats::kKinds> counts{};
  ops_.copy_to_host(amax.data(), census_amax_);
  ops_.copy_to_host(counts.data(), census_counts_);
  Fp8Stats stats;
  for (size_t k = 0; k < Fp8Stats::kKinds; ++k)
    stats.kinds[k] = {amax[k], census_values_[k], counts[2 * k], counts[2 * k + 1]};
  return stats;
}

void BlockLinears::census(int kind, bool replicated, Tensor x, Tensor q, Tensor scale_inv,
                          std::optional<Fp8Blocks> blocks) {
  if (!census_on_ || census_paused_ || (replicated && tp_rank_ != 0)) return;
  census_values_[static_cast<size_t>(kind)] += x.numel();
  ops_.fp8_census(census_counts_.rows(kind, 1).reshaped({2}), census_amax_.rows(kind, 1), x, q, scale_inv,
                  blocks);
}

bool BlockLinears::fp8(int64_t layer) const {
  return precision_.fp8 && layer >= precision_.bf16_first_layers &&
         layer < layers_ - precision_.bf16_last_layers;
}

void BlockLinears::reduce_amax(Tensor amax, TensorAllocator& scratch) {
  if (tp_size_ == 1) return;
  Tensor every = scratch.allocate({tp_size_}, DType::f32, "amax (every TP rank's)");
  tp_->all_gather(every, amax);
  ops_.amax(amax, every);
}

const BlockLinears::Fp8Weight& BlockLinears::fp8_weight(Tensor weight, int param, ParamKind kind,
                                                        TensorAllocator& scratch) {
  if (weights_.size() <= static_cast<size_t>(param)) weights_.resize(static_cast<size_t>(param) + 1);
  Fp8Weight& q = weights_[static_cast<size_t>(param)];
  if (q.generation == generation_) return q;
  const int64_t n = weight.shape[0], k = weight.shape[1];
  if (!q.w.data) {
    q.w = weight_cache_->allocate({n, k}, DType::e4m3, "FP8 weight");
    q.w_t = weight_cache_->allocate({k, n}, DType::e4m3, "FP8 weight (transposed)");
    if (block_scaled()) {
      q.scale_inv = weight_cache_->allocate(fp8_block_scales_shape(Fp8Blocks::block128x128, n, k), DType::f32,
                                            "FP8 weight block scales");
      q.scale_inv_t = weight_cache_->allocate(fp8_block_scales_shape(Fp8Blocks::block128x128, k, n),
                                              DType::f32, "FP8 weight block scales (transposed)");
    } else {
      q.scale_inv = weight_cache_->allocate({1}, DType::f32, "FP8 weight scale");
      q.amax = weight_cache_->allocate({1}, DType::f32, "FP8 weight amax");
      q.scale_inv_t = q.scale_inv;
    }
  }
  if (block_scaled()) {
    ops_.fp8_cast_blocks(q.w, q.w_t, q.scale_inv, q.scale_inv_t, weight, DType::e4m3);
    census(Fp8Stats::kind_of(kind, Fp8Stats::weight), false, weight, q.w, q.scale_inv,
           Fp8Blocks::block128x128);
    q.generation = generation_;
    return q;
  }
  ops_.amax(q.amax, weight);
  const size_t mark = scratch.mark();
  reduce_amax(q.amax, scratch);
  scratch.release_to(mark);
  ops_.fp8_cast(q.w, q.w_t, q.scale_inv, weight, q.amax, DType::e4m3);
  census(Fp8Stats::kind_of(kind, Fp8Stats::weight), false, weight, q.w, q.scale_inv, std::nullopt);
  q.generation = generation_;
  return q;
}

Tensor BlockLinears::input_amax(const Tensor& x_stats) {
  return element(x_stats, 0);
}

Shape BlockLinears::transposed_input_shape(const Tensor& x) {
  return {x.shape[1], padded_tokens(x.shape[0])};
}

void BlockLinears::forward(Tensor out, Tensor x, Tensor weight, Tensor bias, int param, int64_t layer,
                           ParamKind kind, Tensor x_stats, TensorAllocator& scratch, Tensor keep_t,
                           ProducedAmax produced) {
  const LinearSplit split = linear_split(kind);
  if (!fp8(layer)) {
    ops_.linear_forward(out, x, weight, bias);
    return;
  }
  const Fp8Weight& w = fp8_weight(weight, param, kind, scratch);
  const int census_kind = Fp8Stats::kind_of(kind, Fp8Stats::input);
  const size_t mark = scratch.mark();
  if (block_scaled()) {
    LOOM_ASSERT(!keep_t.data, "block scaling keeps no FP8 transpose of a linear layer's input");
    Tensor xq = scratch.allocate(x.shape, DType::e4m3, "FP8 linear input");
    Tensor x_scales = scratch.allocate(fp8_block_scales_shape(Fp8Blocks::vec128, x.shape[0], x.shape[1]),
                                       DType::f32, "FP8 linear input block scales");
    ops_.fp8_cast_rows(xq, x_scales, x, DType::e4m3);
    census(census_kind, split == LinearSplit::column, x, xq, x_scales, Fp8Blocks::vec128);
    ops_.fp8_gemm_blocks(out, xq, x_scales, Fp8Blocks::vec128, w.w, w.scale_inv, Fp8Blocks::block128x128,
                         false);
    if (bias.data) ops_.bias_add_forward(out, bias);
    scratch.release_to(mark);
    return;
  }
  const Tensor x_amax = element(x_stats, 0), x_scale_inv = element(x_stats, kScaleInvAt);
  if (produced.amax.data) {
    LOOM_ASSERT(produced.amax.data == x_amax.data, "a produced input amax belongs in the layer's x_stats");
    if (produced.rank_part) reduce_amax(x_amax, scratch);
  } else {
    ops_.amax(x_amax, x);
    if (split == LinearSplit::row) reduce_amax(x_amax, scratch);
  }
  Tensor xq = scratch.allocate(x.shape, DType::e4m3, "FP8 linear input");
  ops_.fp8_cast(xq, keep_t, x_scale_inv, x, x_amax, DType::e4m3);
  census(census_kind, split == LinearSplit::column, x, xq, x_scale_inv, std::nullopt);
  ops_.fp8_gemm(out, xq, x_scale_inv, w.w, w.scale_inv, false, true);
  if (bias.data) ops_.bias_add_forward(out, bias);
  scratch.release_to(mark);
}

BlockLinears::Gradient BlockLinears::gradient(Tensor d_out, int64_t layer, ParamKind kind,
                                              TensorAllocator& scratch, ProducedAmax produced) {
  const LinearSplit split = linear_split(kind);
  Gradient g;
  g.d_out = d_out;
  g.layer = layer;
  g.kind = kind;
  g.mark = scratch.mark();
  if (!fp8(layer)) return g;
  const int64_t t = d_out.shape[0], n = d_out.shape[1];
  const DType format = precision_.gradient_format;
  const int census_kind = Fp8Stats::kind_of(kind, Fp8Stats::output_grad);
  if (block_scaled()) {
    const int64_t padded = block_padded_tokens(t, ops_.device());
    g.fp8 = scratch.allocate({t, n}, format, "FP8 output gradient");
    g.scale_inv = scratch.allocate(fp8_block_scales_shape(Fp8Blocks::vec128, t, n), DType::f32,
                                   "FP8 output gradient block scales");
    g.fp8_t = scratch.allocate({n, padded}, format, "FP8 output gradient (transposed, blocks along tokens)");
    g.scale_inv_t = scratch.allocate(fp8_block_scales_shape(Fp8Blocks::vec128, n, padded), DType::f32,
                                     "FP8 output gradient block scales (transposed)");
    ops_.fp8_cast_rows(g.fp8, g.scale_inv, d_out, format);
    ops_.fp8_cast_columns(g.fp8_t, g.scale_inv_t, d_out, format);
    census(census_kind, split == LinearSplit::row, d_out, g.fp8, g.scale_inv, Fp8Blocks::vec128);
    return g;
  }
  Tensor amax = produced.amax;
  if (amax.data) {
    if (produced.rank_part) reduce_amax(amax, scratch);
  } else {
    amax = scratch.allocate({1}, DType::f32, "FP8 output gradient amax");
    ops_.amax(amax, d_out);
    if (split == LinearSplit::column) reduce_amax(amax, scratch);
  }
  g.fp8 = scratch.allocate({t, n}, format, "FP8 output gradient");
  g.fp8_t = scratch.allocate({n, padded_tokens(t)}, format, "FP8 output gradient (transposed)");
  g.scale_inv = scratch.allocate({1}, DType::f32, "FP8 output gradient scale");
  g.scale_inv_t = g.scale_inv;
  ops_.fp8_cast(g.fp8, g.fp8_t, g.scale_inv, d_out, amax, format);
  census(census_kind, split == LinearSplit::row, d_out, g.fp8, g.scale_inv, std::nullopt);
  return g;
}

void BlockLinears::backward_input(Tensor d_x, const Gradient& g, Tensor weight, int param,
                                  TensorAllocator& scratch) {
  if (!fp8(g.layer)) {
    ops_.linear_backward(d_x, Tensor{}, g.d_out, Tensor{}, weight);
    return;
  }
  const Fp8Weight& w = fp8_weight(weight, param, g.kind, scratch);
  if (block_scaled())
    ops_.fp8_gemm_blocks(d_x, g.fp8, g.scale_inv, Fp8Blocks::vec128, w.w_t, w.scale_inv_t,
                         Fp8Blocks::block128x128, false);
  else
    ops_.fp8_gemm(d_x, g.fp8, g.scale_inv, w.w_t, w.scale_inv, false, false);
}

void BlockLinears::backward_weight(Tensor d_weight, const Gradient& g, Tensor x, Tensor x_stats,
                                   Tensor weight, TensorAllocator& scratch, Tensor x_t) {
  if (!fp8(g.layer)) {
    ops_.linear_backward(Tensor{}, d_weight, g.d_out, x, weight);
    return;
  }
  const size_t mark = scratch.mark();
  if (block_scaled()) {
    LOOM_ASSERT(!x_t.data, "block scaling casts the weight gradient's xᵀ from x");
    const int64_t padded = block_padded_tokens(x.shape[0], ops_.device()), k = x.shape[1];
    x_t = scratch.allocate({k, padded}, DType::e4m3, "FP8 linear input (transposed, blocks along tokens)");
    Tensor x_t_scales = scratch.allocate(fp8_block_scales_shape(Fp8Blocks::vec128, k, padded), DType::f32,
                                         "FP8 linear input block scales (transposed)");
    ops_.fp8_cast_columns(x_t, x_t_scales, x, DType::e4m3);
    ops_.fp8_gemm_blocks(d_weight, g.fp8_t, g.scale_inv_t, Fp8Blocks::vec128, x_t, x_t_scales,
                         Fp8Blocks::vec128, true);
    scratch.release_to(mark);
    return;
  }
  const Tensor x_scale_inv = element(x_stats, kScaleInvAt);
  if (!x_t.data) {  // the forward kept x: its transpose under the forward's scale
    x_t = scratch.allocate(transposed_input_shape(x), DType::e4m3, "FP8 linear input (transposed)");
    ops_.fp8_cast(Tensor{}, x_t, x_scale_inv, x, element(x_stats, 0), DType::e4m3);
  }
  ops_.fp8_gemm(d_weight, g.fp8_t, g.scale_inv, x_t, x_scale_inv, true, false);
  scratch.release_to(mark);
}

}  // namespace loom
