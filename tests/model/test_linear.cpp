// The FP8 seam of the decoder's linear layers on the CPU backend: Ops::quantize and Ops::gemm
// are the FP8 kernels composed (same bytes), and BlockLinears decides alone where a layer's
// input lives, which slot its producer writes, and whether it keeps an FP8 transpose, with
// the weight gradient the same either way.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "model/linear.h"
#include "ops/cpu/cpu_ops.h"

namespace loom {
namespace {

struct Values {
  std::vector<float> data;
  Tensor tensor(Shape shape) { return Tensor{data.data(), shape, DType::f32, Device::cpu}; }
};

Values random_values(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  Values v;
  v.data.resize(static_cast<size_t>(n));
  for (float& x : v.data) x = normal(rng);
  return v;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

// An odd token count (not a multiple of 16 or 128) and a width over two 128-blocks.
constexpr int64_t kRows = 37, kCols = 200, kPadded = 48;

TEST(Quantize, TensorScalingIsTheAmaxPassThenOneCast) {
  CpuOps ops;
  HostArena memory;
  Values x = random_values(kRows * kCols, 1);
  const Tensor input = x.tensor({kRows, kCols});
  QuantizedLayout layout;
  layout.padded_rows = kPadded;
  QuantizedTensor q = quantized_allocate(memory, kRows, kCols, layout, "x");
  ops.quantize(q, input, false);

  Tensor amax = memory.allocate({1}, DType::f32, "amax");
  Tensor data = memory.allocate({kRows, kCols}, DType::e4m3, "data");
  Tensor data_t = memory.allocate({kCols, kPadded}, DType::e4m3, "data_t");
  Tensor scale_inv = memory.allocate({1}, DType::f32, "scale_inv");
  ops.amax(amax, input);
  ops.fp8_cast(data, data_t, scale_inv, input, amax, DType::e4m3);
  EXPECT_TRUE(same_bytes(q.amax, amax));
  EXPECT_TRUE(same_bytes(q.data, data));
  EXPECT_TRUE(same_bytes(q.data_t, data_t));
  EXPECT_TRUE(same_bytes(q.scale_inv, scale_inv));
  EXPECT_EQ(q.scale_inv_t.data, q.scale_inv.data) << "one scale for both orientations";
  EXPECT_FALSE(q.operand().blocks.has_value());

  // A written amax is used as it is: a larger one gives a smaller scale.
  q.amax.as<float>()[0] *= 4;
  ops.quantize(q, input, true);
  EXPECT_GT(q.scale_inv.as<float>()[0], scale_inv.as<float>()[0]);
}

TEST(Quantize, BlockScalingCastsEachOrientationInItsBlocks) {
  CpuOps ops;
  HostArena memory;
  Values x = random_values(kRows * kCols, 2);
  const Tensor input = x.tensor({kRows, kCols});
  QuantizedLayout layout;
  layout.scaling = Fp8Scaling::block;
  layout.format = DType::e5m2;
  layout.padded_rows = kPadded;
  QuantizedTensor q = quantized_allocate(memory, kRows, kCols, layout, "d_out");
  ops.quantize(q, input, false);
  Tensor rows = memory.allocate({kRows, kCols}, DType::e5m2, "rows");
  Tensor rows_scales =
      memory.allocate(fp8_block_scales_shape(Fp8Blocks::vec128, kRows, kCols), DType::f32, "s");
  Tensor columns = memory.allocate({kCols, kPadded}, DType::e5m2, "columns");
  Tensor columns_scales =
      memory.allocate(fp8_block_scales_shape(Fp8Blocks::vec128, kCols, kPadded), DType::f32, "s_t");
  ops.fp8_cast_rows(rows, rows_scales, input, DType::e5m2);
  ops.fp8_cast_columns(columns, columns_scales, input, DType::e5m2);
  EXPECT_TRUE(same_bytes(q.data, rows));
  EXPECT_TRUE(same_bytes(q.scale_inv, rows_scales));
  EXPECT_TRUE(same_bytes(q.data_t, columns));
  EXPECT_TRUE(same_bytes(q.scale_inv_t, columns_scales));
  EXPECT_EQ(q.operand().blocks, Fp8Blocks::vec128);

  layout.format = DType::e4m3;
  layout.padded_rows = 0;
  layout.weight_blocks = true;
  QuantizedTensor w = quantized_allocate(memory, kRows, kCols, layout, "weight");
  ops.quantize(w, input, false);
  Tensor blocks = memory.allocate({kRows, kCols}, DType::e4m3, "blocks");
  Tensor blocks_t = memory.allocate({kCols, kRows}, DType::e4m3, "blocks_t");
  Tensor scales =
      memory.allocate(fp8_block_scales_shape(Fp8Blocks::block128x128, kRows, kCols), DType::f32, "s");
  Tensor scales_t =
      memory.allocate(fp8_block_scales_shape(Fp8Blocks::block128x128, kCols, kRows), DType::f32, "s_t");
  ops.fp8_cast_blocks(blocks, blocks_t, scales, scales_t, input, DType::e4m3);
  EXPECT_TRUE(same_bytes(w.data, blocks));
  EXPECT_TRUE(same_bytes(w.data_t, blocks_t));
  EXPECT_TRUE(same_bytes(w.scale_inv, scales));
  EXPECT_TRUE(same_bytes(w.scale_inv_t, scales_t));
  EXPECT_EQ(w.transposed().blocks, Fp8Blocks::block128x128);
}

TEST(Gemm, TakesPlainOrQuantizedOperandsAsTheirKernelsDo) {
  CpuOps ops;
  HostArena memory;
  constexpr int64_t n = 24;
  Values a = random_values(kRows * kCols, 3), b = random_values(n * kCols, 4, 0.05f);
  const Tensor ta = a.tensor({kRows, kCols}), tb = b.tensor({n, kCols});

  Tensor plain = memory.allocate({kRows, n}, DType::f32, "plain");
  Tensor expected = memory.allocate({kRows, n}, DType::f32, "expected");
  ops.gemm(plain, {ta, {}, {}}, {tb, {}, {}}, false, false);
  ops.linear_forward(expected, ta, tb, Tensor{});
  EXPECT_TRUE(same_bytes(plain, expected));

  for (Fp8Scaling scaling : {Fp8Scaling::tensor, Fp8Scaling::block}) {
    SCOPED_TRACE(scaling == Fp8Scaling::tensor ? "tensor" : "block");
    QuantizedLayout layout;
    layout.scaling = scaling;
    layout.transposed = false;
    QuantizedTensor qa = quantized_allocate(memory, kRows, kCols, layout, "a");
    // A weight's 128 × 128 blocks are cast in both orientations at once.
    layout.weight_blocks = layout.transposed = scaling == Fp8Scaling::block;
    QuantizedTensor qb = quantized_allocate(memory, n, kCols, layout, "b");
    ops.quantize(qa, ta, false);
    ops.quantize(qb, tb, false);
    // Into an f32 out that already holds values: accumulate adds to them.
    Tensor out = memory.allocate({kRows, n}, DType::f32, "out");
    Tensor direct = memory.allocate({kRows, n}, DType::f32, "direct");
    for (Tensor t : {out, direct}) std::fill_n(t.as<float>(), t.numel(), 1.0f);
    ops.gemm(out, qa.operand(), qb.operand(), true, false);
    if (scaling == Fp8Scaling::tensor)
      ops.fp8_gemm(direct, qa.data, qa.scale_inv, qb.data, qb.scale_inv, true, false);
    else
      ops.fp8_gemm_blocks(direct, qa.data, qa.scale_inv, Fp8Blocks::vec128, qb.data, qb.scale_inv,
                          Fp8Blocks::block128x128, true);
    EXPECT_TRUE(same_bytes(out, direct));
    EXPECT_NE(out.as<float>()[0], 1.0f) << "the product was added";
  }
}

// One linear layer (gate_up's shape class: column-parallel, a norm output's input) of a
// one-layer model, its weight and grad.
struct Layer {
  Values weight = random_values(kCols * 64, 5, 0.05f);
  std::vector<float> grad = std::vector<float>(kCols * 64, 0.0f);
  LinearParams params() {
    LinearParams p;
    p.weight = weight.tensor({kCols, 64});
    p.grad = Tensor{grad.data(), {kCols, 64}, DType::f32, Device::cpu};
    return p;
  }
};

LinearPrecision fp8_precision(Fp8Scaling scaling) {
  LinearPrecision p;
  p.fp8 = true;
  p.scaling = scaling;
  return p;
}

TEST(BlockLinears, DecidesWhereAnInputLivesAndWhatItsProducerWrites) {
  CpuOps ops;
  HostArena scratch, weights;
  struct Case {
    const char* name;
    LinearPrecision precision;
    bool sequence_parallel;
    bool shared, slot;
  };
  LinearPrecision bf16;
  LinearPrecision first_bf16 = fp8_precision(Fp8Scaling::tensor);
  first_bf16.bf16_first_layers = 1;
  const Case cases[] = {
      {"bf16", bf16, false, false, false},
      {"fp8 tensor", fp8_precision(Fp8Scaling::tensor), false, true, true},
      {"fp8 tensor under SP: the GEMM reads the all-gather", fp8_precision(Fp8Scaling::tensor), true, false,
       true},
      {"fp8 block: no amax, x kept for its own blocks", fp8_precision(Fp8Scaling::block), false, false,
       false},
      {"a first layer kept in bf16", first_bf16, false, false, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    BlockLinears linears(ops, {}, 2, nullptr, 1, 0, c.sequence_parallel);
    linears.set_precision(c.precision, &weights);
    const LinearSharedInputs shared = linears.shared_inputs(0, 1, kRows, 64, kCols, scratch);
    EXPECT_EQ(shared.hidden.data != nullptr, c.shared);
    const LinearInput in = linears.input(0, ParamKind::gate_up, kRows, 64, shared, scratch, "norm output");
    EXPECT_EQ(in.x.data == shared.hidden.data, c.shared);
    EXPECT_EQ(in.amax.data != nullptr, c.slot);
    // o_proj's input is the attention output, made without a slot: never shared.
    const LinearInput o = linears.input_of(0, ParamKind::o_proj, in.x, scratch);
    EXPECT_EQ(o.amax.data, nullptr);
    EXPECT_EQ(o.kept.data_t.data, nullptr);
  }
}

TEST(BlockLinears, AKeptFp8TransposeGivesTheWeightGradientOfTheKeptInput) {
  // Without SP a tensor-scaled layer keeps xᵀ from its forward's cast; under SP the backward
  // casts xᵀ again from x under the forward's scale. The weight gradients must be the same bits.
  CpuOps ops;
  Values x = random_values(kRows * 64, 6), d_out = random_values(kRows * kCols, 7, 0.01f);
  std::vector<float> grads[2];
  for (bool sequence_parallel : {false, true}) {
    HostArena scratch, weights;
    Layer layer;
    BlockLinears linears(ops, {}, 1, nullptr, 1, 0, sequence_parallel);
    linears.set_precision(fp8_precision(Fp8Scaling::tensor), &weights);
    const LinearSharedInputs shared = linears.shared_inputs(0, 1, kRows, 64, kCols, scratch);
    LinearInput in = linears.input(0, ParamKind::gate_up, kRows, 64, shared, scratch, "norm output");
    std::memcpy(in.x.data, x.data.data(), in.x.nbytes());
    ops.amax(in.amax, in.x);  // as the norm writes it
    Tensor out = scratch.allocate({kRows, kCols}, DType::f32, "out");
    linears.forward(out, in, in.x, layer.params(), LoraDropoutBatch{}, scratch);
    EXPECT_EQ(in.kept.data_t.data != nullptr, !sequence_parallel);
    if (!sequence_parallel) std::fill_n(in.x.as<float>(), in.x.numel(), 0.0f);  // the next layer's, now
    const LinearOutputGrad d =
        linears.output_gradient(0, ParamKind::gate_up, d_out.tensor({kRows, kCols}), LinearGradientSlots{});
    const LinearParams params = layer.params();
    const BlockLinears::Gradient g = linears.gradient(d, params, in, scratch);
    linears.backward_weight(g, in, in.x, params, scratch);
    linears.release_gradient(g, scratch);
    grads[sequence_parallel ? 1 : 0] = layer.grad;
  }
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_NE(grads[0], std::vector<float>(grads[0].size(), 0.0f));
}

}  // namespace
}  // namespace loom
