// The decoder block's four linear layers (qkv, o_proj, gate_up, down) at the run's
// precision (docs/numerics.md, "FP8 linear layers").
//
// In bf16 (fp32 on the CPU) a layer is ops.linear_forward / linear_backward. In FP8 each of
// its three GEMMs reads FP8 operands under tensor-wise current scaling (core/fp8.h):
//   forward        out  = x · Wᵀ        x  e4m3 [T, K],   W  e4m3 [N, K]    fast accumulation
//   input grad     d_x  = d_out · W      d_out  [T, N],    Wᵀ e4m3 [K, N]
//   weight grad    d_W += d_outᵀ · x     d_outᵀ [N, T],    xᵀ e4m3 [K, T]    into the fp32 main grad
// (Hopper's FP8 GEMMs read both operands K-contiguous, hence the transposed copies; d_out
// is e5m2 by default.) W and Wᵀ are cast once after each change of the weights (the
// optimizer step, a load), not per micro-batch. The forward keeps only x's amax: the
// backward casts xᵀ from the bf16 x the block keeps anyway, under the same scale, so the
// weight gradient sees the values the forward multiplied.
//
// Under tensor parallelism a scale is that of the whole tensor, as on one rank: the amax of
// a sharded tensor (every weight; x of the row-parallel o_proj and down, sharded along K;
// d_out of the column-parallel qkv and gate_up, sharded along N) is the max over the TP
// group. A gathered or replicated tensor has the same amax on every rank already.
//
// Block scaling (DeepSeek-V3's; ops.h fp8_cast_rows and the rest) quantizes each block of 128
// values (1 × 128 for x and d_out, 128 × 128 for W) under its own power-of-two scale, found by
// the cast; no amax pass, full accumulation in every GEMM:
//   forward        x 1 × 128 along K,   W 128 × 128
//   input grad     d_out 1 × 128 along N,   Wᵀ 128 × 128 (W's blocks, transposed)
//   weight grad    d_outᵀ [N, T'] and xᵀ [K, T'], 1 × 128 along the tokens: cast from the bf16
//                  d_out and x along their columns, T' the tokens padded with zeros to 128
//                  on the GPU (the CPU twin takes a partial last block: the same values)
// The wgrad's operands are another quantization of x than the forward's, so the layer keeps
// the bf16 x (no FP8 transposes from the forward). Under TP the blocks are counted within each
// rank's shard and no amax crosses ranks: where every shard's sharded dimension is a multiple
// of 128 (what `loom train` requires of block scaling under TP, and the CUDA backend of every
// dim), a rank's blocks are exactly one rank's blocks of the whole tensor, so TP ranks quantize
// what one rank does. (Shards of other widths, as the CPU's tiny models have, put their blocks
// elsewhere than one rank does: a valid quantization, not one rank's. And where TP > the KV
// heads, the ranks sharing a KV head each quantize their share of its output gradient, as
// under tensor scaling.)
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "model/param_table.h"
#include "ops/ops.h"
#include "parallel/tp_collectives.h"

namespace loom {

// How FP8 tensors are scaled (workload.fp8.scaling): one current scale per tensor, or one
// power-of-two scale per block of 128 values (above).
enum class Fp8Scaling : uint8_t { tensor, block };

struct LinearPrecision {
  bool fp8 = false;
  DType gradient_format = DType::e5m2;  // d_out's FP8 format; e4m3 is the other choice
  // The first and last decoder layers of the model that stay in bf16.
  int64_t bf16_first_layers = 0, bf16_last_layers = 0;
  Fp8Scaling scaling = Fp8Scaling::tensor;
};

// A GEMM operand's amax that the op producing the operand wrote beside it (ops.h out_amax),
// which spares the layer a pass over the operand. `rank_part`: over this rank's part of the
// operand only (TP shards it, or SP gathers it from the ranks' parts), so the layer takes the
// max over the TP group. An empty amax: the layer computes it (reducing where its split says).
struct ProducedAmax {
  Tensor amax;
  bool rank_part = false;
};

// How a layer is split under TP: column-parallel (qkv, gate_up: x whole, W's rows and d_out's
// columns sharded) or row-parallel (o_proj, down: x and W sharded along K).
enum class LinearSplit : uint8_t { column, row };
// The split of linear layer `kind` (qkv, o_proj, gate_up or down).
LinearSplit linear_split(ParamKind kind);

// FP8 statistics of a step (docs/numerics.md, "FP8 statistics"; train.fp8_stats_every): for
// each tensor kind, i.e. the input, the weight and the output gradient of each of the four
// linear layers, over every FP8 cast of the step: the largest magnitude, the values cast, and
// how many the cast flushed to zero or clamped (Ops::fp8_census). A value counts once over a
// layout: a tensor every TP rank casts whole (the input of qkv and gate_up, the output
// gradient of o_proj and down) is counted by TP rank 0, a weight by DP rank 0 (the engine's
// reduction), a recomputed forward not again.
struct Fp8TensorStats {
  float amax = 0;
  int64_t values = 0, flushed = 0, clamped = 0;
};
struct Fp8Stats {
  static constexpr int kLayers = 4;  // qkv, o_proj, gate_up, down
  static constexpr int kKinds = 3 * kLayers;
  enum Role : int { input = 0, weight = 1, output_grad = 2 };
  std::array<Fp8TensorStats, kKinds> kinds;
  // "qkv.input", "down.output_grad", ...: kind = 3 · layer + role.
  static std::string kind_name(int kind);
  // Every kind and role of linear layer `kind` (qkv, o_proj, gate_up or down).
  static int kind_of(ParamKind layer, Role role);
};

class BlockLinears {
 public:
  // `layers`: the model's decoder layers; `tp` is required when tp_size > 1, tp_rank being
  // this rank's place in it. `weight_cache`
  // holds the FP8 weights (2 bytes a weight), allocated on first use and kept.
  BlockLinears(Ops& ops, LinearPrecision precision, int64_t layers, TensorAllocator* weight_cache,
               TpCollectives* tp, int64_t tp_size, int64_t tp_rank);

  // FP8 keeps its FP8 weights in `weight_cache` (required with precision.fp8).
  void set_precision(const LinearPrecision& precision, TensorAllocator* weight_cache);
  bool fp8(int64_t layer) const;
  // FP8 layer `layer` under tensor scaling: its forward can write x's FP8 transpose for the
  // weight gradient (keep_t), and the ops producing its operands can give their amax
  // (ProducedAmax); block scaling quantizes otherwise (above).
  bool tensor_scaled(int64_t layer) const { return fp8(layer) && precision_.scaling == Fp8Scaling::tensor; }
  // The weights changed: their FP8 forms are cast again where next used.
  void weights_changed() { ++generation_; }

  // FP8 statistics (Fp8Stats): from census_begin every FP8 cast is counted, until census_end
  // returns this rank's counts. census_begin casts the weights again where next used (the
  // same bits) so that the step counts them. While paused (a recomputed forward), nothing is
  // counted.
  void census_begin();
  Fp8Stats census_end();
  void census_pause(bool paused) { census_paused_ = paused; }

  // out = x · Wᵀ (+ bias: may be empty) for linear layer `kind` (qkv, o_proj, gate_up or
  // down); a bf16 layer adds the bias in its GEMM's epilogue, an FP8 one after its GEMM. In FP8 under tensor
  // scaling, x_stats f32[kInputStats] (16-byte aligned) receives amax(x) (TP-reduced for a row split) and x's
  // 1/scale: the layer's activations keep them for the backward (block scaling leaves it unused). `param` is
  // the weight's index in the model's table (the FP8 weights' key). Temporaries come from scratch and are
  // released. `keep_t` (FP8 under tensor scaling only; may be null): x's FP8 transpose [K, T padded to 16] is
  // written there too, for the weight gradient to read instead of x. `produced` (FP8 under tensor scaling
  // only): x's amax, already in x_stats[0] (produced.amax is that element).
  void forward(Tensor out, Tensor x, Tensor weight, Tensor bias, int param, int64_t layer, ParamKind kind,
               Tensor x_stats, TensorAllocator& scratch, Tensor keep_t = {}, ProducedAmax produced = {});
  static constexpr int64_t kInputStats = 8;
  // x_stats' amax element, f32[1]: where an op producing x writes its amax (ProducedAmax).
  static Tensor input_amax(const Tensor& x_stats);
  // The shape keep_t must have for x [T, K].
  static Shape transposed_input_shape(const Tensor& x);

  // The backward's d_out as both of its GEMMs read it (in FP8: d_out and d_outᵀ, with their
  // inverse scales: one tensor's under tensor scaling, each one's blocks under block
  // scaling), made once for the two halves, which TP runs with collectives between them.
  // Allocated in scratch at `mark`: release_gradient frees it (nothing allocated after it may
  // be kept).
  struct Gradient {
    Tensor d_out, fp8, fp8_t, scale_inv, scale_inv_t;
    int64_t layer = 0;
    ParamKind kind = ParamKind::qkv;
    size_t mark = 0;
  };
  // `produced` (FP8 only): d_out's amax, written by the op that made d_out.
  Gradient gradient(Tensor d_out, int64_t layer, ParamKind kind, TensorAllocator& scratch,
                    ProducedAmax produced = {});
  // d_x = d_out · W.
  void backward_input(Tensor d_x, const Gradient& g, Tensor weight, int param, TensorAllocator& scratch);
  // d_weight += d_outᵀ · x; x and x_stats as the forward had them, or (FP8) x_t, the
  // forward's keep_t, with x unused.
  void backward_weight(Tensor d_weight, const Gradient& g, Tensor x, Tensor x_stats, Tensor weight,
                       TensorAllocator& scratch, Tensor x_t = {});
  void release_gradient(const Gradient& g, TensorAllocator& scratch) { scratch.release_to(g.mark); }

 private:
  // scale_inv: W's (and, under tensor scaling, Wᵀ's); scale_inv_t: Wᵀ's blocks.
  struct Fp8Weight {
    Tensor w, w_t, scale_inv, scale_inv_t, amax;
    uint64_t generation = 0;
  };
  const Fp8Weight& fp8_weight(Tensor weight, int param, ParamKind kind, TensorAllocator& scratch);
  // Counts one cast into kind `kind` of the census when it is on (Ops::fp8_census's
  // arguments); `replicated`: every TP rank casts the whole tensor, so rank 0 alone counts it.
  void census(int kind, bool replicated, Tensor x, Tensor q, Tensor scale_inv,
              std::optional<Fp8Blocks> blocks);
  // amax over the TP group, in place.
  void reduce_amax(Tensor amax, TensorAllocator& scratch);
  bool block_scaled() const { return precision_.scaling == Fp8Scaling::block; }

  Ops& ops_;
  LinearPrecision precision_;
  int64_t layers_;
  TensorAllocator* weight_cache_;
  TpCollectives* tp_;
  int64_t tp_size_, tp_rank_;
  uint64_t generation_ = 1;
  // The census (census_begin): on, paused, its device counters (amax f32[kKinds], counts
  // i64[kKinds, 2]: flushed, clamped) and the values counted on the host.
  bool census_on_ = false, census_paused_ = false;
  Tensor census_amax_, census_counts_;
  std::array<int64_t, Fp8Stats::kKinds> census_values_{};
  std::vector<Fp8Weight> weights_;  // by param index
};

}  // namespace loom
