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

// A tensor-scaled input's amax and 1/scale, kept with the layer's activations for the
// backward: one allocation of 8 f32, the 1/scale 16 bytes past the amax, since cuBLASLt reads
// the scales through pointers it wants 16-byte aligned.
constexpr int64_t kInputStats = 8, kScaleInvAt = 4;

// Element i of an f32 tensor, as an f32[1].
Tensor element(const Tensor& t, int64_t i) {
  return Tensor{static_cast<float*>(t.data) + i, {1}, DType::f32, t.device};
}

// Adapter j's rows of a layer's stacked A [J·r, K] (or of its grad), J = `adapters`.
Tensor lora_rows(const Tensor& a, size_t j, size_t adapters) {
  const int64_t r = a.shape[0] / static_cast<int64_t>(adapters);
  return a.rows(static_cast<int64_t>(j) * r, r);
}

// Under dropout a layer keeps each adapter's down-projection [T, r] as a block of its own,
// J blocks [J, S] with S = T·r rounded up to 128 values: cuBLASLt's packed GEMMs assume
// 256-byte aligned operands, which a block at j·T·r would not be for every T and r.
constexpr int64_t kLoraBlockAlign = 128;
Shape lora_blocks_shape(size_t adapters, int64_t tokens, int64_t r) {
  return {static_cast<int64_t>(adapters),
          (tokens * r + kLoraBlockAlign - 1) / kLoraBlockAlign * kLoraBlockAlign};
}

// Adapter j's block [T, r] of `blocks` [J, S] (its down-projection or their gradient).
Tensor lora_block(const Tensor& blocks, size_t j, int64_t tokens, int64_t r) {
  return Tensor{blocks.rows(static_cast<int64_t>(j), 1).data, {tokens, r}, blocks.dtype, blocks.device};
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

BlockLinears::BlockLinears(Ops& ops, LinearPrecision precision, int64_t layers, TpCollectives* tp,
                           int64_t tp_size, int64_t tp_rank, bool sequence_parallel)
    : ops_(ops),
      precision_(precision),
      layers_(layers),
      tp_(tp),
      tp_size_(tp_size),
      tp_rank_(tp_rank),
      sequence_parallel_(sequence_parallel) {
  LOOM_ASSERT(!precision.fp8, "FP8 linear layers need memory for their FP8 weights (set_precision)");
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

bool BlockLinears::keeps_fp8_input(int64_t layer, ParamKind kind) const {
  // Under SP the GEMM reads the all-gathered input, which the backward gathers again anyway;
  // o_proj's input is the attention output, which the attention's backward reads. LoRA's A
  // gradients read the bf16 input.
  return tensor_scaled(layer) && !sequence_parallel_ && kind != ParamKind::o_proj && !adapted_;
}

bool BlockLinears::input_is_rank_part(ParamKind kind) const {
  return tp_size_ > 1 && (linear_split(kind) == LinearSplit::row || sequence_parallel_);
}

bool BlockLinears::output_grad_is_rank_part(ParamKind kind) const {
  return tp_size_ > 1 && (linear_split(kind) == LinearSplit::column || sequence_parallel_);
}

void BlockLinears::reduce_amax(Tensor amax, TensorAllocator& scratch) {
  if (tp_size_ == 1) return;
  Tensor every = scratch.allocate({tp_size_}, DType::f32, "amax (every TP rank's)");
  tp_->all_gather(every, amax);
  ops_.amax(amax, every);
}

void BlockLinears::sharded_amax(Tensor amax, Tensor x, TensorAllocator& scratch) {
  ops_.amax(amax, x);
  reduce_amax(amax, scratch);
}

const QuantizedTensor& BlockLinears::fp8_weight(const LinearParams& p, ParamKind kind,
                                                TensorAllocator& scratch) {
  const size_t index = static_cast<size_t>(p.index);
  if (weights_.size() <= index) weights_.resize(index + 1);
  Fp8Weight& cached = weights_[index];
  QuantizedTensor& q = cached.q;
  if (cached.generation == generation_) return q;
  const Tensor& weight = p.weight;
  if (!q.data.data) {
    QuantizedLayout layout;
    layout.scaling = precision_.scaling;
    layout.weight_blocks = block_scaled();
    q = quantized_allocate(*weight_cache_, weight.shape[0], weight.shape[1], layout, "FP8 weight");
  }
  // Tensor scaling: a weight is sharded over TP, its amax the max over the group.
  const bool amax_written = !block_scaled() && tp_size_ > 1;
  if (amax_written) {
    const size_t mark = scratch.mark();
    sharded_amax(q.amax, weight, scratch);
    scratch.release_to(mark);
  }
  ops_.quantize(q, weight, amax_written);
  census(Fp8Stats::kind_of(kind, Fp8Stats::weight), false, weight, q.data, q.scale_inv, q.operand().blocks);
  cached.generation = generation_;
  return q;
}

LinearSharedInputs BlockLinears::shared_inputs(int64_t layer_begin, int64_t layer_end, int64_t tokens,
                                               int64_t hidden, int64_t ffn, TensorAllocator& scratch) {
  bool keeps = false;
  for (int64_t l = layer_begin; l < layer_end; ++l) keeps = keeps || keeps_fp8_input(l, ParamKind::qkv);
  if (!keeps) return {};
  const DType act = ops_.activation_dtype();
  return {scratch.allocate({tokens, hidden}, act, "norm output (FP8 layers: every layer's in turn)"),
          scratch.allocate({tokens, ffn}, act, "swiglu output (FP8 layers: every layer's in turn)")};
}

LinearInput BlockLinears::input(int64_t layer, ParamKind kind, int64_t rows, int64_t cols,
                                const LinearSharedInputs& shared, TensorAllocator& scratch,
                                const char* what) {
  LinearInput in = input_of(layer, kind, Tensor{}, scratch);
  in.amax = in.kept.amax;  // the producer writes it
  if (keeps_fp8_input(layer, kind)) {
    in.x = kind == ParamKind::down ? shared.ffn : shared.hidden;
    LOOM_ASSERT(in.x.shape[0] == rows && in.x.shape[1] == cols, "a shared linear input of another shape");
  } else {
    in.x = scratch.allocate({rows, cols}, ops_.activation_dtype(), what);
  }
  return in;
}

LinearInput BlockLinears::input_of(int64_t layer, ParamKind kind, Tensor x, TensorAllocator& scratch) {
  LinearInput in;
  in.x = x;
  in.layer = layer;
  in.kind = kind;
  if (tensor_scaled(layer)) {
    const Tensor stats = scratch.allocate({kInputStats}, DType::f32, "FP8 linear input amax and scale");
    in.kept.amax = element(stats, 0);
    in.kept.scale_inv = in.kept.scale_inv_t = element(stats, kScaleInvAt);
  }
  return in;
}

Tensor BlockLinears::lora_dropped_input(const LoraDropoutBatch& dropout, int64_t layer, ParamKind kind,
                                        const LinearParams& p, size_t j, Tensor x, TensorAllocator& scratch) {
  const Tensor dropped = scratch.allocate(x.shape, x.dtype, "LoRA dropout's input (one adapter's)");
  ops_.lora_dropout(dropped, x, lora_mask(dropout, layer, kind, p, j, x.shape[1]), false);
  return dropped;
}

LoraDropoutMask BlockLinears::lora_mask(const LoraDropoutBatch& dropout, int64_t layer, ParamKind kind,
                                        const LinearParams& p, size_t j, int64_t columns) const {
  // A row-parallel layer's rank holds columns [rank · K/tp, ...) of its input (shard_spec.h).
  const int64_t first = linear_split(kind) == LinearSplit::row ? tp_rank_ * columns : 0;
  return lora_dropout_mask(dropout, layer, p.lora_targets[j], first);
}

void BlockLinears::forward(Tensor out, LinearInput& in, Tensor gemm_x, const LinearParams& p,
                           const LoraDropoutBatch& dropout, TensorAllocator& scratch) {
  in.lora_dropout = p.adapted() ? dropout : LoraDropoutBatch{};
  const bool dropped = in.lora_dropout.active();
  const size_t adapters = p.lora_up.size();
  const int64_t tokens = gemm_x.shape[0];
  const int64_t r = p.adapted() ? p.lora_a.shape[0] / static_cast<int64_t>(adapters) : 0;
  if (p.adapted()) {
    // Kept for the backward (allocated before the temporaries released below).
    const DType act = ops_.activation_dtype();
    in.lora_t =
        dropped ? scratch.allocate(lora_blocks_shape(adapters, tokens, r), act, "LoRA dropout_j(x) · A_jᵀ")
                : scratch.allocate({tokens, p.lora_a.shape[0]}, act, "LoRA x · Aᵀ");
  }
  base_forward(out, in, gemm_x, p, scratch);
  if (!p.adapted()) return;
  if (!dropped) {
    ops_.linear_forward(in.lora_t, gemm_x, p.lora_a, Tensor{});
  } else {
    for (size_t j = 0; j < adapters; ++j) {
      const size_t mark = scratch.mark();
      const Tensor x_j = lora_dropped_input(in.lora_dropout, in.layer, in.kind, p, j, gemm_x, scratch);
      ops_.linear_forward(lora_block(in.lora_t, j, tokens, r), x_j, lora_rows(p.lora_a, j, adapters),
                          Tensor{});
      scratch.release_to(mark);
    }
  }
  // Row-parallel under TP (model/shard_spec.cpp): each rank's x · Aᵀ is a partial sum over its
  // columns, and `out` a partial sum the model reduces over TP next, so the whole x · Aᵀ is
  // formed on every rank (the backward's d_t and B grad read it) and B's term added on rank 0.
  if (tp_size_ > 1 && linear_split(in.kind) == LinearSplit::row) {
    tp_->all_reduce(in.lora_t);
    if (tp_rank_ != 0) return;
  }
  if (!dropped) {
    ops_.lora_up_forward(out, in.lora_t, p.lora_up, p.lora_scale);
    return;
  }
  for (size_t j = 0; j < adapters; ++j)
    ops_.lora_up_forward(out, lora_block(in.lora_t, j, tokens, r), {p.lora_up[j]}, p.lora_scale);
}

void BlockLinears::base_forward(Tensor out, LinearInput& in, Tensor gemm_x, const LinearParams& p,
                                TensorAllocator& scratch) {
  if (!fp8(in.layer)) {
    ops_.linear_forward(out, gemm_x, p.weight, p.bias);
    return;
  }
  const ParamKind kind = in.kind;
  const bool replicated = linear_split(kind) == LinearSplit::column;  // every TP rank casts it whole
  const QuantizedTensor& w = fp8_weight(p, kind, scratch);
  const int64_t tokens = gemm_x.shape[0], k = gemm_x.shape[1];
  QuantizedLayout layout;
  layout.scaling = precision_.scaling;
  layout.transposed = false;
  if (!block_scaled()) {
    // Where the layer keeps xᵀ for its weight gradient, the forward's cast writes it too.
    if (keeps_fp8_input(in.layer, kind)) {
      in.kept.data_t =
          scratch.allocate({k, padded_tokens(tokens)}, DType::e4m3, "linear input (FP8, transposed)");
    }
    layout.amax = in.kept.amax;
    layout.scale_inv = in.kept.scale_inv;
  }
  const size_t mark = scratch.mark();
  bool amax_written = false;
  if (!block_scaled()) {
    if (in.amax.data) {  // the producer wrote the amax of its part, or of the whole
      if (input_is_rank_part(kind)) reduce_amax(in.kept.amax, scratch);
      amax_written = true;
    } else if (linear_split(kind) == LinearSplit::row && tp_size_ > 1) {  // x is sharded along K
      sharded_amax(in.kept.amax, gemm_x, scratch);
      amax_written = true;
    }
  }
  QuantizedTensor xq = quantized_allocate(scratch, tokens, k, layout, "FP8 linear input");
  xq.data_t = in.kept.data_t;
  ops_.quantize(xq, gemm_x, amax_written);
  census(Fp8Stats::kind_of(kind, Fp8Stats::input), replicated, gemm_x, xq.data, xq.scale_inv,
         xq.operand().blocks);
  ops_.gemm(out, xq.operand(), w.operand(), false, true);
  if (p.bias.data) ops_.bias_add_forward(out, p.bias);
  scratch.release_to(mark);
}

LinearGradientSlots BlockLinears::gradient_slots(int64_t layer_begin, int64_t layer_end,
                                                 TensorAllocator& scratch) {
  bool tensor = false;
  for (int64_t l = layer_begin; l < layer_end; ++l) tensor = tensor || tensor_scaled(l);
  if (!tensor) return {};
  const Tensor slots = scratch.allocate({3}, DType::f32, "FP8 output gradient amax (of their producers)");
  return {element(slots, 0), element(slots, 1), element(slots, 2)};
}

LinearOutputGrad BlockLinears::output_gradient(int64_t layer, ParamKind kind, Tensor d_out,
                                               const LinearGradientSlots& slots) const {
  LinearOutputGrad d{d_out, Tensor{}, layer, kind};
  if (tensor_scaled(layer))
    d.amax = kind == ParamKind::gate_up ? slots.gate_up : kind == ParamKind::qkv ? slots.qkv : slots.residual;
  return d;
}

BlockLinears::Gradient BlockLinears::gradient(const LinearOutputGrad& d, const LinearParams& p,
                                              const LinearInput& in, TensorAllocator& scratch) {
  Gradient g;
  g.d_out = d.d_out;
  g.layer = d.layer;
  g.kind = d.kind;
  g.mark = scratch.mark();
  if (p.adapted()) {
    g.lora_dropout = in.lora_dropout;
    g.lora_d_t = scratch.allocate(in.lora_t.shape, ops_.activation_dtype(), "LoRA d_t");
    if (!g.lora_dropout.active()) {
      ops_.lora_up_backward(g.lora_d_t, d.d_out, in.lora_t, p.lora_up, p.lora_scale);
    } else {
      const int64_t tokens = d.d_out.shape[0], r = p.lora_a.shape[0] / static_cast<int64_t>(p.lora_up.size());
      for (size_t j = 0; j < p.lora_up.size(); ++j)
        ops_.lora_up_backward(lora_block(g.lora_d_t, j, tokens, r), d.d_out,
                              lora_block(in.lora_t, j, tokens, r), {p.lora_up[j]}, p.lora_scale);
    }
  }
  if (!fp8(d.layer)) return g;
  const int64_t t = d.d_out.shape[0], n = d.d_out.shape[1];
  QuantizedLayout layout;
  layout.scaling = precision_.scaling;
  layout.format = precision_.gradient_format;
  bool amax_written = false;
  if (block_scaled()) {
    layout.padded_rows = block_padded_tokens(t, ops_.device());
  } else {
    layout.padded_rows = padded_tokens(t);
    if (d.amax.data) {
      if (output_grad_is_rank_part(d.kind)) reduce_amax(d.amax, scratch);
      layout.amax = d.amax;
      amax_written = true;
    } else if (linear_split(d.kind) == LinearSplit::column && tp_size_ > 1) {  // d_out sharded along N
      layout.amax = scratch.allocate({1}, DType::f32, "FP8 output gradient amax");
      sharded_amax(layout.amax, d.d_out, scratch);
      amax_written = true;
    }
  }
  g.q = quantized_allocate(scratch, t, n, layout, "FP8 output gradient");
  ops_.quantize(g.q, d.d_out, amax_written);
  census(Fp8Stats::kind_of(d.kind, Fp8Stats::output_grad), linear_split(d.kind) == LinearSplit::row, d.d_out,
         g.q.data, g.q.scale_inv, g.q.operand().blocks);
  return g;
}

void BlockLinears::backward_input(Tensor d_x, const Gradient& g, const LinearParams& p,
                                  TensorAllocator& scratch) {
  if (!fp8(g.layer))
    ops_.linear_backward(d_x, Tensor{}, g.d_out, Tensor{}, p.weight);
  else
    ops_.gemm(d_x, g.q.operand(), fp8_weight(p, g.kind, scratch).transposed(), false, false);
  if (!p.adapted()) return;
  const size_t mark = scratch.mark();
  Tensor lora_d_x = scratch.allocate(d_x.shape, d_x.dtype, "LoRA d_x");
  if (!g.lora_dropout.active()) {
    ops_.linear_backward(lora_d_x, Tensor{}, g.lora_d_t, Tensor{}, p.lora_a);
    ops_.add(d_x, d_x, lora_d_x);
  } else {
    const size_t adapters = p.lora_up.size();
    const int64_t tokens = d_x.shape[0], r = p.lora_a.shape[0] / static_cast<int64_t>(adapters);
    for (size_t j = 0; j < adapters; ++j) {
      ops_.linear_backward(lora_d_x, Tensor{}, lora_block(g.lora_d_t, j, tokens, r), Tensor{},
                           lora_rows(p.lora_a, j, adapters));
      ops_.lora_dropout(d_x, lora_d_x, lora_mask(g.lora_dropout, g.layer, g.kind, p, j, d_x.shape[1]), true);
    }
  }
  scratch.release_to(mark);
}

void BlockLinears::backward_weight(const Gradient& g, const LinearInput& in, Tensor gemm_x,
                                   const LinearParams& p, TensorAllocator& scratch) {
  if (p.adapted() && !g.lora_dropout.active()) {
    ops_.linear_backward(Tensor{}, p.lora_a_grad, g.lora_d_t, gemm_x, p.lora_a);
  } else if (p.adapted()) {
    const size_t adapters = p.lora_up.size();
    const int64_t tokens = gemm_x.shape[0], r = p.lora_a.shape[0] / static_cast<int64_t>(adapters);
    for (size_t j = 0; j < adapters; ++j) {
      const size_t mark = scratch.mark();
      const Tensor x_j = lora_dropped_input(g.lora_dropout, g.layer, g.kind, p, j, gemm_x, scratch);
      ops_.linear_backward(Tensor{}, lora_rows(p.lora_a_grad, j, adapters),
                           lora_block(g.lora_d_t, j, tokens, r), x_j, lora_rows(p.lora_a, j, adapters));
      scratch.release_to(mark);
    }
  }
  if (!p.grad.data) return;  // frozen
  if (!fp8(g.layer)) {
    ops_.linear_backward(Tensor{}, p.grad, g.d_out, gemm_x, p.weight);
    return;
  }
  const size_t mark = scratch.mark();
  QuantizedTensor x = in.kept;
  if (!x.data_t.data) {  // xᵀ cast from the x the layer kept (under the forward's scale)
    const int64_t tokens = gemm_x.shape[0];
    QuantizedLayout layout;
    layout.scaling = precision_.scaling;
    layout.rows = false;
    layout.padded_rows = block_scaled() ? block_padded_tokens(tokens, ops_.device()) : padded_tokens(tokens);
    layout.amax = in.kept.amax;
    layout.scale_inv = in.kept.scale_inv;
    x = quantized_allocate(scratch, tokens, gemm_x.shape[1], layout,
                           "FP8 linear input (for the weight gradient)");
    ops_.quantize(x, gemm_x, true);
  }
  ops_.gemm(p.grad, g.q.transposed(), x.transposed(), true, false);
  scratch.release_to(mark);
}

}  // namespace loom
