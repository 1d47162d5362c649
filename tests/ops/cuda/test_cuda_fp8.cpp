// The CUDA backend's FP8 ops against their CPU twins (label gpu; skipped with a message where
// no GPU is visible): amax and the casts give the same bits as the CPU's emulation on
// bf16 inputs (core/fp8.h: one fp32 multiply, then round to nearest even with saturation),
// the amax the producing kernels write equals amax's,
// and the three GEMM forms of the FP8 linear layers (forward with fast accumulation, input
// and weight gradient, the latter adding into fp32) stay within their operands' own
// quantization error of fp32. The same for block scaling: the three block casts equal the
// CPU's bytes and scales, the three block-scaled GEMM forms within their operands' block
// quantization error.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "support/compare.h"
#include "support/fp8.h"

namespace loom {
namespace {

std::vector<float> random_bf16_values(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = bf16_to_float(float_to_bf16(dist(rng)));
  return v;
}

// A block-scaled GEMM of the tests below: a [m, k] 1 × 128 in a_format, b [n, k] e4m3 in
// b_blocks, into fp32 (accumulate) or bf16.
struct BlockGemmCase {
  int64_t m, n, k;
  DType a_format;
  Fp8Blocks b_blocks;
  bool accumulate;
  bool b_transposed = false;  // b is the out_t of a [k, n] weight's 128 × 128 cast (Wᵀ)
};

class CudaFp8Test : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: the GPU FP8 op tests did not run";
    ops_ = std::make_unique<CudaOps>();
    arena_ = std::make_unique<DeviceArena>("test tensors");
  }
  Tensor bf16_tensor(const std::vector<float>& v, Shape s) {
    Tensor t = arena_->allocate(s, DType::bf16, "test tensor");
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = float_to_bf16(v[i]).bits;
    upload(t, bits.data());
    return t;
  }
  // Uploads and fills go on the ops' stream: cudaMemcpy and cudaMemset run on the legacy
  // stream, which the ops' non-blocking stream does not wait for (a host-to-device cudaMemcpy
  // may return before its data lands), so they could land after the op that reads or writes
  // the tensor (a fill once zeroed a cast's scales under a GEMM test).
  void upload(const Tensor& t, const void* host) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(t.data, host, t.nbytes(), cudaMemcpyHostToDevice, ops_->stream()));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_->stream()));
  }
  void fill(const Tensor& t, int byte) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(t.data, byte, t.nbytes(), ops_->stream()));
  }
  Tensor f32_tensor(Shape s) {
    Tensor t = arena_->allocate(s, DType::f32, "test tensor");
    fill(t, 0);
    return t;
  }
  Tensor fp8_tensor(Shape s, DType d) { return arena_->allocate(s, d, "test FP8 tensor"); }
  template <typename T>
  std::vector<T> download(const Tensor& t) {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_->stream()));
    std::vector<T> out(t.nbytes() / sizeof(T));
    LOOM_CUDA_CHECK(cudaMemcpy(out.data(), t.data, t.nbytes(), cudaMemcpyDeviceToHost));
    return out;
  }
  std::vector<float> download_bf16(const Tensor& t) {
    const std::vector<uint16_t> bits = download<uint16_t>(t);
    std::vector<float> out(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(bf16{bits[i]});
    return out;
  }

  // One block-scaled GEMM form through cuBLASLt: a [m, k] 1 × 128, b [n, k] in b_blocks, both
  // cast on the GPU, against fp32 within their operands' block quantization error, and close to
  // the CPU twin's GEMM on the same bytes (which a scale read from the wrong block would not be:
  // the operands' magnitudes change block to block).
  void run_block_gemm(const BlockGemmCase& c);

  CpuOps cpu_;
  std::unique_ptr<CudaOps> ops_;
  std::unique_ptr<DeviceArena> arena_;
};

// Shapes with partial 64 × 64 tiles, and a Qwen3-like one.
TEST_F(CudaFp8Test, AmaxAndCastsAreTheCpuTwinsBits) {
  struct Case {
    int64_t rows, cols;
    DType format;
  };
  for (const Case& c : {Case{40, 24, DType::e4m3}, Case{136, 200, DType::e5m2}, Case{20, 48, DType::e5m2},
                        Case{512, 2048, DType::e4m3}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " + dtype_name(c.format));
    std::vector<float> x = random_bf16_values(c.rows * c.cols, 7, 0.5f);
    x[17] = -3.75f;  // the amax
    x[33] = 1e-30f;  // underflows to 0 after scaling
    const Tensor xg = bf16_tensor(x, {c.rows, c.cols});
    Tensor amax = f32_tensor({1}), scale_inv = f32_tensor({1});
    // out_t padded to a multiple of 16 rows, as the weight gradient's operands are.
    const int64_t ld = (c.rows + 15) / 16 * 16;
    Tensor out = fp8_tensor({c.rows, c.cols}, c.format), out_t = fp8_tensor({c.cols, ld}, c.format);
    fill(out_t, 0xff);  // the pad must be written
    ops_->amax(amax, xg);
    ops_->fp8_cast(out, out_t, scale_inv, xg, amax, c.format);

    std::vector<float> cpu_amax(1), cpu_scale_inv(1);
    std::vector<uint8_t> cpu_out(x.size()), cpu_out_t(static_cast<size_t>(c.cols * ld));
    Tensor xc{x.data(), {c.rows, c.cols}, DType::f32, Device::cpu};
    Tensor ac{cpu_amax.data(), {1}, DType::f32, Device::cpu};
    cpu_.amax(ac, xc);
    cpu_.fp8_cast(Tensor{cpu_out.data(), {c.rows, c.cols}, c.format, Device::cpu},
                  Tensor{cpu_out_t.data(), {c.cols, ld}, c.format, Device::cpu},
                  Tensor{cpu_scale_inv.data(), {1}, DType::f32, Device::cpu}, xc, ac, c.format);
    EXPECT_EQ(download<float>(amax), cpu_amax);
    EXPECT_EQ(cpu_amax[0], 3.75f);
    EXPECT_EQ(download<float>(scale_inv), cpu_scale_inv);
    EXPECT_EQ(download<uint8_t>(out), cpu_out);
    EXPECT_EQ(download<uint8_t>(out_t), cpu_out_t);
  }
}

TEST_F(CudaFp8Test, ZeroAndNonfiniteTensorsGetFiniteScales) {
  for (float special : {0.0f, INFINITY, NAN}) {
    std::vector<float> x(64 * 64, 0.0f);
    x[100] = special;
    const Tensor xg = bf16_tensor(x, {64, 64});
    Tensor amax = f32_tensor({1}), scale_inv = f32_tensor({1});
    Tensor out = fp8_tensor({64, 64}, DType::e4m3);
    ops_->amax(amax, xg);
    ops_->fp8_cast(out, Tensor{}, scale_inv, xg, amax, DType::e4m3);
    const float s = download<float>(scale_inv)[0];
    EXPECT_TRUE(std::isfinite(s) && s > 0) << special;
    EXPECT_EQ(download<uint8_t>(out)[0], 0x00) << special;
  }
}

// The ops that produce an FP8 GEMM's operand write its amax beside it (ops.h out_amax): the
// same bits as ops.amax over what they wrote, at Qwen3-1.7B widths over 4,100 tokens (a
// block a token in the norm's forward, grid-stride loops elsewhere), with one outlier token.
TEST_F(CudaFp8Test, ProducersWriteTheAmaxOfTheirOutput) {
  const int64_t t = 4100, h = 2048, f = 6144;
  const auto check = [&](const char* op, const Tensor& produced, const Tensor& output) {
    Tensor reference = f32_tensor({1});
    ops_->amax(reference, output);
    const float got = download<float>(produced)[0], want = download<float>(reference)[0];
    EXPECT_EQ(got, want) << op;
    EXPECT_GT(want, 0.0f) << op;
  };
  std::vector<float> residual = random_bf16_values(t * h, 21, 1.0f),
                     delta = random_bf16_values(t * h, 22, 0.5f);
  residual[static_cast<size_t>(3001 * h + 5)] = 40.0f;  // an outlier token
  const Tensor weight = bf16_tensor(random_bf16_values(h, 23, 1.0f), {h});
  const Tensor rg = bf16_tensor(residual, {t, h}), dg = bf16_tensor(delta, {t, h});
  Tensor residual_out = arena_->allocate({t, h}, DType::bf16, "residual out"),
         norm = arena_->allocate({t, h}, DType::bf16, "norm"), rstd = f32_tensor({t}), amax = f32_tensor({1});
  ops_->residual_rmsnorm_forward(residual_out, norm, rstd, rg, dg, weight, 1e-6f, amax);
  check("residual_rmsnorm_forward", amax, norm);
  ops_->rmsnorm_forward(norm, rstd, rg, weight, 1e-6f, amax);
  check("rmsnorm_forward", amax, norm);

  Tensor d_x = bf16_tensor(random_bf16_values(t * h, 24, 0.01f), {t, h}), d_weight = f32_tensor({h});
  ops_->rmsnorm_backward(d_x, d_weight, dg, residual_out, weight, rstd, amax);
  check("rmsnorm_backward", amax, d_x);

  const Tensor gate_up = bf16_tensor(random_bf16_values(t * 2 * f, 25, 2.0f), {t, 2 * f});
  Tensor act = arena_->allocate({t, f}, DType::bf16, "act");
  ops_->swiglu_forward(act, gate_up, amax);
  check("swiglu_forward", amax, act);
  const Tensor d_act = bf16_tensor(random_bf16_values(t * f, 26, 0.01f), {t, f});
  Tensor d_gate_up = arena_->allocate({t, 2 * f}, DType::bf16, "d_gate_up");
  ops_->swiglu_backward(d_gate_up, d_act, gate_up, amax);
  check("swiglu_backward", amax, d_gate_up);

  // The q/k norm + RoPE backward at Qwen3-1.7B's heads, with q/k norm and without (Llama's),
  // into another buffer and in place (as the model calls it, where the v heads are only read
  // for the amax); the outlier sits in a v head.
  const HeadLayout heads{16, 8, 128};
  const int64_t nh = heads.total_heads(), hd = heads.head_dim, normed = heads.q_heads + heads.kv_heads;
  const RowSpans rows{{0, 2048, 4100}};
  std::vector<float> d_rot = random_bf16_values(t * nh * hd, 27, 0.01f);
  d_rot[static_cast<size_t>((1234 * nh + normed + 3) * hd + 77)] = -0.75f;
  const Tensor qkv = bf16_tensor(random_bf16_values(t * nh * hd, 28, 1.0f), {t, nh, hd}),
               q_weight = bf16_tensor(random_bf16_values(hd, 29, 1.0f), {hd}),
               k_weight = bf16_tensor(random_bf16_values(hd, 30, 1.0f), {hd}),
               d_rot_g = bf16_tensor(d_rot, {t, nh, hd});
  Tensor qkv_rot = arena_->allocate({t, nh, hd}, DType::bf16, "qkv after rope"),
         qk_rstd = f32_tensor({t, normed}), d_q_weight = f32_tensor({hd}), d_k_weight = f32_tensor({hd});
  ops_->qk_norm_rope_forward(qkv_rot, qk_rstd, qkv, q_weight, k_weight, rows, heads, 1e-6f, {1e6f});
  for (const bool qk_norm : {true, false}) {
    for (const bool in_place : {false, true}) {
      Tensor d_qkv =
          in_place ? bf16_tensor(d_rot, {t, nh, hd}) : arena_->allocate({t, nh, hd}, DType::bf16, "d_qkv");
      ops_->qk_norm_rope_backward(d_qkv, qk_norm ? d_q_weight : Tensor{}, qk_norm ? d_k_weight : Tensor{},
                                  in_place ? d_qkv : d_rot_g, qkv, qk_norm ? q_weight : Tensor{},
                                  qk_norm ? k_weight : Tensor{}, qk_norm ? qk_rstd : Tensor{}, rows, heads,
                                  {1e6f}, amax);
      check(qk_norm ? (in_place ? "qk_norm_rope_backward in place" : "qk_norm_rope_backward")
                    : (in_place ? "rope_backward in place" : "rope_backward"),
            amax, d_qkv);
      EXPECT_EQ(download<float>(amax)[0], 0.75f);
    }
  }
}

// The linear layer's three GEMM forms: forward (e4m3 × e4m3, fast accumulation, bf16 out),
// input gradient (e5m2 × e4m3, bf16 out), weight gradient (e5m2 × e4m3 added into fp32), at
// K up to 4,096 where fast accumulation's coarser sums would show.
TEST_F(CudaFp8Test, GemmsStayWithinTheirOperandsQuantizationError) {
  struct Case {
    int64_t m, n, k;
    DType a_format;
    bool accumulate, fast;
  };
  for (const Case& c :
       {Case{256, 384, 4096, DType::e4m3, false, true}, Case{256, 384, 1024, DType::e5m2, false, false},
        Case{128, 256, 4096, DType::e5m2, true, false}}) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k));
    const std::vector<float> a = random_bf16_values(c.m * c.k, 11, 1.0f),
                             b = random_bf16_values(c.n * c.k, 12, 0.02f);
    const Tensor ag = bf16_tensor(a, {c.m, c.k}), bg = bf16_tensor(b, {c.n, c.k});
    Tensor a_amax = f32_tensor({1}), b_amax = f32_tensor({1}), a_inv = f32_tensor({1}),
           b_inv = f32_tensor({1});
    Tensor a8 = fp8_tensor({c.m, c.k}, c.a_format), b8 = fp8_tensor({c.n, c.k}, DType::e4m3);
    ops_->amax(a_amax, ag);
    ops_->amax(b_amax, bg);
    ops_->fp8_cast(a8, Tensor{}, a_inv, ag, a_amax, c.a_format);
    ops_->fp8_cast(b8, Tensor{}, b_inv, bg, b_amax, DType::e4m3);
    const std::vector<float> reference = test::reference_product(a, b, c.m, c.n, c.k);
    const double bound = test::fp8_qdq_error(a, c.a_format) + test::fp8_qdq_error(b, DType::e4m3);
    std::vector<float> got;
    if (c.accumulate) {
      Tensor out = f32_tensor({c.m, c.n});
      ops_->fp8_gemm(out, a8, a_inv, b8, b_inv, true, c.fast);
      ops_->fp8_gemm(out, a8, a_inv, b8, b_inv, true, c.fast);
      got = download<float>(out);
      for (float& v : got) v /= 2;  // added twice into zeros
    } else {
      Tensor out = arena_->allocate({c.m, c.n}, DType::bf16, "test out");
      ops_->fp8_gemm(out, a8, a_inv, b8, b_inv, false, c.fast);
      got = download_bf16(out);
    }
    const double error = test::relative_l2(got, reference);
    EXPECT_LE(error, 1.5 * bound) << "error " << error << ", operands' quantization " << bound;
    EXPECT_GT(error, 0.1 * bound) << "the GEMM did not read the FP8 operands";
  }
}

// Block scaling (ops.h fp8_cast_rows / _columns / _blocks, fp8_gemm_blocks) at 128-multiple
// shapes, as the CUDA backend takes them.

// Values whose magnitude changes from row to row and from column block to column block (2⁰
// to 2⁶), so that a scale read from the wrong block shows; with a zero block, an infinity, a
// NaN and a value that underflows.
std::vector<float> blocky_bf16_values(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> v = random_bf16_values(rows * cols, seed, 1.0f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      v[static_cast<size_t>(i * cols + j)] *= std::ldexp(1.0f, static_cast<int>((i + 3 * (j / 128)) % 7));
  return v;
}

void add_special_values(std::vector<float>& v, int64_t cols) {
  for (int64_t j = 0; j < 128; ++j) v[static_cast<size_t>(cols + j)] = 0.0f;  // row 1, block 0
  v[static_cast<size_t>(2 * cols + 5)] = INFINITY;
  v[static_cast<size_t>(3 * cols + 130)] = NAN;
  v[static_cast<size_t>(4 * cols + 7)] = 1e-30f;
}

TEST_F(CudaFp8Test, BlockCastsAreTheCpuTwinsBits) {
  struct Case {
    int64_t rows, cols;
    DType format;
  };
  for (const Case& c :
       {Case{256, 512, DType::e4m3}, Case{200, 384, DType::e5m2}, Case{384, 640, DType::e4m3}}) {
    SCOPED_TRACE(std::to_string(c.rows) + "x" + std::to_string(c.cols) + " " + dtype_name(c.format));
    std::vector<float> x = blocky_bf16_values(c.rows, c.cols, 21);
    add_special_values(x, c.cols);
    const Tensor xg = bf16_tensor(x, {c.rows, c.cols});
    Tensor xc{x.data(), {c.rows, c.cols}, DType::f32, Device::cpu};
    const auto cpu_f32 = [](std::vector<float>& v, Shape s) {
      return Tensor{v.data(), s, DType::f32, Device::cpu};
    };
    const auto cpu_fp8 = [](std::vector<uint8_t>& v, Shape s, DType d) {
      return Tensor{v.data(), s, d, Device::cpu};
    };
    const auto filled = [&](Shape s, DType d) {
      Tensor t = arena_->allocate(s, d, "test tensor");
      fill(t, 0xff);  // every byte, padding included, must be written
      return t;
    };

    {  // rows: 1 × 128 along the columns
      const Shape scales = fp8_block_scales_shape(Fp8Blocks::vec128, c.rows, c.cols);
      Tensor out = filled({c.rows, c.cols}, c.format), inv = filled(scales, DType::f32);
      ops_->fp8_cast_rows(out, inv, xg, c.format);
      std::vector<uint8_t> cpu_out(x.size());
      std::vector<float> cpu_inv(static_cast<size_t>(scales.numel()));
      cpu_.fp8_cast_rows(cpu_fp8(cpu_out, {c.rows, c.cols}, c.format), cpu_f32(cpu_inv, scales), xc,
                         c.format);
      EXPECT_EQ(download<uint8_t>(out), cpu_out) << "rows";
      EXPECT_EQ(download<float>(inv), cpu_inv) << "rows";
    }
    {  // columns: xᵀ [cols, tokens padded to 128], 1 × 128 along the tokens
      const int64_t ld = (c.rows + 127) / 128 * 128;
      const Shape scales = fp8_block_scales_shape(Fp8Blocks::vec128, c.cols, ld);
      Tensor out_t = filled({c.cols, ld}, c.format), inv = filled(scales, DType::f32);
      ops_->fp8_cast_columns(out_t, inv, xg, c.format);
      std::vector<uint8_t> cpu_out(static_cast<size_t>(c.cols * ld));
      std::vector<float> cpu_inv(static_cast<size_t>(scales.numel()));
      cpu_.fp8_cast_columns(cpu_fp8(cpu_out, {c.cols, ld}, c.format), cpu_f32(cpu_inv, scales), xc, c.format);
      EXPECT_EQ(download<uint8_t>(out_t), cpu_out) << "columns";
      EXPECT_EQ(download<float>(inv), cpu_inv) << "columns";
    }
    if (c.rows % 128 == 0) {  // blocks: 128 × 128, both orientations
      const Shape scales = fp8_block_scales_shape(Fp8Blocks::block128x128, c.rows, c.cols),
                  scales_t = fp8_block_scales_shape(Fp8Blocks::block128x128, c.cols, c.rows);
      Tensor out = filled({c.rows, c.cols}, DType::e4m3), out_t = filled({c.cols, c.rows}, DType::e4m3),
             inv = filled(scales, DType::f32), inv_t = filled(scales_t, DType::f32);
      ops_->fp8_cast_blocks(out, out_t, inv, inv_t, xg, DType::e4m3);
      std::vector<uint8_t> cpu_out(x.size()), cpu_out_t(x.size());
      std::vector<float> cpu_inv(static_cast<size_t>(scales.numel())),
          cpu_inv_t(static_cast<size_t>(scales_t.numel()));
      cpu_.fp8_cast_blocks(cpu_fp8(cpu_out, {c.rows, c.cols}, DType::e4m3),
                           cpu_fp8(cpu_out_t, {c.cols, c.rows}, DType::e4m3), cpu_f32(cpu_inv, scales),
                           cpu_f32(cpu_inv_t, scales_t), xc, DType::e4m3);
      EXPECT_EQ(download<uint8_t>(out), cpu_out) << "blocks";
      EXPECT_EQ(download<uint8_t>(out_t), cpu_out_t) << "blocks";
      EXPECT_EQ(download<float>(inv), cpu_inv) << "blocks";
      EXPECT_EQ(download<float>(inv_t), cpu_inv_t) << "blocks";
    }
  }
}

// The census of each cast (tensor, 1 × 128 rows, 128 × 128 blocks) on the GPU equals the
// CPU twin's on the same input: values across 2^0..2^6 by block, tiny ones that flush under a
// tensor-wide scale, an infinity (clamped), a NaN and zeros; counts added to what the counters
// held, the amax maxed into it.
TEST_F(CudaFp8Test, CensusIsTheCpuTwins) {
  const int64_t r = 384, c = 640;
  std::vector<float> x = blocky_bf16_values(r, c, 23);
  add_special_values(x, c);
  for (int64_t j = 0; j < 64; ++j)
    x[static_cast<size_t>(5 * c + j)] = bf16_to_float(float_to_bf16(1e-6f * static_cast<float>(j)));
  const Tensor xg = bf16_tensor(x, {r, c});
  Tensor xc{x.data(), {r, c}, DType::f32, Device::cpu};
  const auto cpu = [](auto& v, Shape s, DType d) { return Tensor{v.data(), s, d, Device::cpu}; };
  struct Layout {
    const char* name;
    std::optional<Fp8Blocks> blocks;
    DType format;
  };
  for (const Layout& l :
       {Layout{"tensor", std::nullopt, DType::e5m2}, Layout{"rows", Fp8Blocks::vec128, DType::e4m3},
        Layout{"blocks", Fp8Blocks::block128x128, DType::e4m3}}) {
    SCOPED_TRACE(l.name);
    const Shape scales = l.blocks ? fp8_block_scales_shape(*l.blocks, r, c) : Shape{1};
    Tensor q = fp8_tensor({r, c}, l.format), inv = f32_tensor(scales), amax = f32_tensor({1});
    std::vector<uint8_t> cpu_q(x.size()), cpu_q_t(x.size());
    std::vector<float> cpu_inv(static_cast<size_t>(scales.numel())), cpu_amax(1);
    if (!l.blocks) {
      ops_->amax(amax, xg);
      ops_->fp8_cast(q, Tensor{}, inv, xg, amax, l.format);
      cpu_.amax(cpu(cpu_amax, {1}, DType::f32), xc);
      cpu_.fp8_cast(cpu(cpu_q, {r, c}, l.format), Tensor{}, cpu(cpu_inv, scales, DType::f32), xc,
                    cpu(cpu_amax, {1}, DType::f32), l.format);
    } else if (*l.blocks == Fp8Blocks::vec128) {
      ops_->fp8_cast_rows(q, inv, xg, l.format);
      cpu_.fp8_cast_rows(cpu(cpu_q, {r, c}, l.format), cpu(cpu_inv, scales, DType::f32), xc, l.format);
    } else {
      const Shape scales_t = fp8_block_scales_shape(Fp8Blocks::block128x128, c, r);
      std::vector<float> cpu_inv_t(static_cast<size_t>(scales_t.numel()));
      ops_->fp8_cast_blocks(q, fp8_tensor({c, r}, l.format), inv, f32_tensor(scales_t), xg, l.format);
      cpu_.fp8_cast_blocks(cpu(cpu_q, {r, c}, l.format), cpu(cpu_q_t, {c, r}, l.format),
                           cpu(cpu_inv, scales, DType::f32), cpu(cpu_inv_t, scales_t, DType::f32), xc,
                           l.format);
    }
    Tensor counts = arena_->allocate({2}, DType::i64, "census counts"), most = f32_tensor({1});
    const std::vector<int64_t> start = {3, 4};
    upload(counts, start.data());
    const float held = 2.0f;
    upload(most, &held);
    ops_->fp8_census(counts, most, xg, q, inv, l.blocks);
    std::vector<int64_t> cpu_counts = start;
    std::vector<float> cpu_most = {held};
    cpu_.fp8_census(cpu(cpu_counts, {2}, DType::i64), cpu(cpu_most, {1}, DType::f32), xc,
                    cpu(cpu_q, {r, c}, l.format), cpu(cpu_inv, scales, DType::f32), l.blocks);
    EXPECT_EQ(download<uint8_t>(q), cpu_q);
    EXPECT_EQ(download<int64_t>(counts), cpu_counts);
    EXPECT_EQ(download<float>(most), cpu_most);
    EXPECT_GT(cpu_counts[0], start[0]) << "some values flush";
    EXPECT_GT(cpu_counts[1], start[1]) << "the infinity clamps";
    EXPECT_EQ(cpu_most[0], INFINITY);
  }
}

void CudaFp8Test::run_block_gemm(const BlockGemmCase& c) {
  SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k));
  std::vector<float> a = blocky_bf16_values(c.m, c.k, 31);
  // b [n, k], or the weight [k, n] whose transpose it is.
  std::vector<float> source =
      c.b_transposed ? blocky_bf16_values(c.k, c.n, 32) : blocky_bf16_values(c.n, c.k, 32);
  for (float& v : source) v *= 0.01f;
  std::vector<float> b = source;
  if (c.b_transposed)
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t j = 0; j < c.k; ++j)
        b[static_cast<size_t>(i * c.k + j)] = source[static_cast<size_t>(j * c.n + i)];
  const Tensor ag = bf16_tensor(a, {c.m, c.k});
  const Shape a_scales = fp8_block_scales_shape(Fp8Blocks::vec128, c.m, c.k),
              b_scales = fp8_block_scales_shape(c.b_blocks, c.n, c.k);
  Tensor a8 = fp8_tensor({c.m, c.k}, c.a_format), b8 = fp8_tensor({c.n, c.k}, DType::e4m3);
  Tensor a_inv = f32_tensor(a_scales), b_inv = f32_tensor(b_scales);
  ops_->fp8_cast_rows(a8, a_inv, ag, c.a_format);
  if (c.b_blocks == Fp8Blocks::vec128) {
    ops_->fp8_cast_rows(b8, b_inv, bf16_tensor(b, {c.n, c.k}), DType::e4m3);
  } else if (c.b_transposed) {  // the input gradient's Wᵀ with its transposed block scales
    Tensor w8 = fp8_tensor({c.k, c.n}, DType::e4m3);
    Tensor w_inv = f32_tensor(fp8_block_scales_shape(Fp8Blocks::block128x128, c.k, c.n));
    ops_->fp8_cast_blocks(w8, b8, w_inv, b_inv, bf16_tensor(source, {c.k, c.n}), DType::e4m3);
  } else {
    Tensor b8_t = fp8_tensor({c.k, c.n}, DType::e4m3);
    Tensor b_inv_t = f32_tensor(fp8_block_scales_shape(Fp8Blocks::block128x128, c.k, c.n));
    ops_->fp8_cast_blocks(b8, b8_t, b_inv, b_inv_t, bf16_tensor(b, {c.n, c.k}), DType::e4m3);
  }
  std::vector<float> got;
  if (c.accumulate) {
    Tensor out = f32_tensor({c.m, c.n});
    ops_->fp8_gemm_blocks(out, a8, a_inv, Fp8Blocks::vec128, b8, b_inv, c.b_blocks, true);
    ops_->fp8_gemm_blocks(out, a8, a_inv, Fp8Blocks::vec128, b8, b_inv, c.b_blocks, true);
    got = download<float>(out);
    for (float& v : got) v /= 2;  // added twice into zeros
  } else {
    Tensor out = arena_->allocate({c.m, c.n}, DType::bf16, "test out");
    ops_->fp8_gemm_blocks(out, a8, a_inv, Fp8Blocks::vec128, b8, b_inv, c.b_blocks, false);
    got = download_bf16(out);
  }
  const std::vector<float> reference = test::reference_product(a, b, c.m, c.n, c.k);
  const double bound =
      test::fp8_block_qdq_error(a, c.m, c.k, 1, c.a_format) +
      test::fp8_block_qdq_error(b, c.n, c.k, c.b_blocks == Fp8Blocks::vec128 ? 1 : 128, DType::e4m3);
  const double error = test::relative_l2(got, reference);
  EXPECT_LE(error, 1.5 * bound) << "error " << error << ", operands' quantization " << bound;
  EXPECT_GT(error, 0.1 * bound) << "the GEMM did not read the FP8 operands";

  // The CPU twin's GEMM of the same bytes and scales: apart by the bf16 rounding of the GPU's
  // out, or for an fp32 out by Hopper's FP8 MMA, which keeps fewer bits than fp32 while it sums
  // a 128-block before the scales and the fp32 accumulation (DeepSeek-V3's report measures
  // ~14): 1.04e-4 for the weight-gradient form on an H100 (2026-12-06), against 1e-6 for fp32
  // sums in another order.
  std::vector<uint8_t> a_bytes = download<uint8_t>(a8), b_bytes = download<uint8_t>(b8);
  std::vector<float> a_inv_host = download<float>(a_inv), b_inv_host = download<float>(b_inv);
  std::vector<float> cpu_out(static_cast<size_t>(c.m * c.n));
  cpu_.fp8_gemm_blocks(Tensor{cpu_out.data(), {c.m, c.n}, DType::f32, Device::cpu},
                       Tensor{a_bytes.data(), {c.m, c.k}, c.a_format, Device::cpu},
                       Tensor{a_inv_host.data(), a_scales, DType::f32, Device::cpu}, Fp8Blocks::vec128,
                       Tensor{b_bytes.data(), {c.n, c.k}, DType::e4m3, Device::cpu},
                       Tensor{b_inv_host.data(), b_scales, DType::f32, Device::cpu}, c.b_blocks, false);
  EXPECT_LE(test::relative_l2(got, cpu_out), c.accumulate ? 5e-4 : 1e-2) << "against the CPU twin";
}

// The block-scaled linear layer's three GEMM forms: forward (x e4m3 1 × 128 · W 128 × 128,
// bf16 out), input gradient (d_out e5m2 1 × 128 · Wᵀ 128 × 128), weight gradient (e5m2 1 × 128 ·
// e4m3 1 × 128 along the tokens, added into fp32), at shapes whose 128 × 128 scale rows need no
// padding (ceil(K/128) a multiple of 4), as every Qwen3 size's on one GPU.
TEST_F(CudaFp8Test, BlockGemmsStayWithinTheirOperandsQuantizationError) {
  for (const BlockGemmCase& c :
       {BlockGemmCase{256, 384, 1024, DType::e4m3, Fp8Blocks::block128x128, false},
        BlockGemmCase{256, 384, 512, DType::e5m2, Fp8Blocks::block128x128, false, true},
        BlockGemmCase{384, 256, 512, DType::e5m2, Fp8Blocks::vec128, true}})
    run_block_gemm(c);
}

// ceil(K/128) = 3: the 128 × 128 scales' rows padded to 4 (16 bytes), the layout ops.h states
// from cuBLASLt's alignment rule (passed on an H100, 2026-12-06); TP shards such as Qwen3-32B's
// FFN at TP4 (6,400 = 50 blocks) need it.
TEST_F(CudaFp8Test, BlockGemmReadsPaddedScaleRows) {
  run_block_gemm(BlockGemmCase{256, 256, 384, DType::e4m3, Fp8Blocks::block128x128, false});
}

TEST_F(CudaFp8Test, BlockGemmRefusesShapesOutsideWholeBlocksNamingThem) {
  Tensor a8 = fp8_tensor({100, 256}, DType::e4m3), b8 = fp8_tensor({128, 256}, DType::e4m3);
  Tensor a_inv = f32_tensor(fp8_block_scales_shape(Fp8Blocks::vec128, 100, 256)),
         b_inv = f32_tensor(fp8_block_scales_shape(Fp8Blocks::block128x128, 128, 256));
  Tensor out = arena_->allocate({100, 128}, DType::bf16, "test out");
  try {
    ops_->fp8_gemm_blocks(out, a8, a_inv, Fp8Blocks::vec128, b8, b_inv, Fp8Blocks::block128x128, false);
    FAIL() << "a block-scaled GEMM with m = 100 ran";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(std::string(e.what()).find("m=100 n=128 k=256"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom
