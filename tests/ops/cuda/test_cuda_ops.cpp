// Every CUDA op against its fp32 CPU twin on fresh random data (label gpu; skipped with a
// message where no GPU is visible).
//
// Both backends get the same inputs: random values rounded to bf16, which the CPU twin
// reads as fp32. The judge is the relative L2 error of each output against the CPU's,
// bounded by the output's tolerance class (ops/op_table.h: bf16 outputs 8e-3, fp32 outputs
// reduced from bf16 inputs 1e-4, GEMM outputs twice the error of a plain bf16
// implementation, FP8 GEMM outputs a bound from their operands; moves, FP8 casts, counts
// and maxima bit for bit). The op table's cases run first, every op over Qwen3's shapes; the
// tests after it check what a table row cannot say: bits (in place, halves, determinism,
// shards adding up), attention against its plain bf16 implementation, and the other kernels.
//
// The plain bf16 implementation (FlashAttention's judge) rounds where a straightforward
// bf16 kernel rounds: each GEMM's output, and for attention the scores, the probabilities,
// dP and dS, computed here on the CPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/op_table_cuda.h"
#include "ops/op_table.h"
#include "optim/adamw.h"
#include "optim/cuda_adamw.h"
#include "optim/precision_master.h"
#include "support/compare.h"

namespace loom {
namespace {

using test::relative_l2;

const double kBf16Tolerance = test::tolerance(test::Tolerance::bf16, {});
const double kReducedF32Tolerance = test::tolerance(test::Tolerance::reduced_f32, {});

float round_bf16(float x) {
  return bf16_to_float(float_to_bf16(x));
}

std::vector<float> random_bf16_values(int64_t n, std::mt19937& rng, float scale = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = round_bf16(dist(rng));
  return v;
}

std::vector<float> rounded(std::vector<float> v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: the GPU op tests did not run";
    ops_ = std::make_unique<CudaOps>(/*loss_chunk_tokens=*/48);  // small chunks: several per test
    arena_ = std::make_unique<DeviceArena>("test tensors");
  }

  Tensor upload(const std::vector<float>& values, Shape shape, DType dtype) {
    Tensor t = arena_->allocate(shape, dtype, "test tensor");
    if (dtype == DType::bf16) {
      std::vector<uint16_t> bits(values.size());
      for (size_t i = 0; i < values.size(); ++i) bits[i] = float_to_bf16(values[i]).bits;
      LOOM_CUDA_CHECK(cudaMemcpy(t.data, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    } else {
      LOOM_CUDA_CHECK(cudaMemcpy(t.data, values.data(), values.size() * 4, cudaMemcpyHostToDevice));
    }
    landed();
    return t;
  }
  // A host-to-device cudaMemcpy runs on the legacy stream, which the ops' non-blocking stream
  // does not wait for, and may return before its data lands: wait for it before any op.
  static void landed() { LOOM_CUDA_CHECK(cudaDeviceSynchronize()); }
  Tensor upload_ids(const std::vector<int32_t>& ids) {
    Tensor t = arena_->allocate({static_cast<int64_t>(ids.size())}, DType::i32, "test ids");
    LOOM_CUDA_CHECK(cudaMemcpy(t.data, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    landed();
    return t;
  }
  std::vector<float> download(const Tensor& t) {
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_->stream()));
    std::vector<float> out(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::bf16) {
      std::vector<uint16_t> bits(out.size());
      LOOM_CUDA_CHECK(cudaMemcpy(bits.data(), t.data, bits.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < out.size(); ++i) out[i] = bf16_to_float(bf16{bits[i]});
    } else {
      LOOM_CUDA_CHECK(cudaMemcpy(out.data(), t.data, out.size() * 4, cudaMemcpyDeviceToHost));
    }
    return out;
  }
  static Tensor host(std::vector<float>& v, Shape shape) {
    return Tensor{v.data(), shape, DType::f32, Device::cpu};
  }
  static Tensor host_ids(std::vector<int32_t>& v) {
    return Tensor{v.data(), {static_cast<int64_t>(v.size())}, DType::i32, Device::cpu};
  }

  std::mt19937 rng_{1234};
  CpuOps cpu_;
  std::unique_ptr<CudaOps> ops_;
  std::unique_ptr<DeviceArena> arena_;
};

RowSpans two_rows(int64_t row_tokens) {
  return RowSpans{{0, static_cast<int32_t>(row_tokens), static_cast<int32_t>(2 * row_tokens)}};
}

// The op table's cases: the same inputs on both backends, setup, forward then backward, and
// every output of the GPU's within its tolerance class of the CPU twin's (exact: bit for bit).
class OpTableCudaVsCpu : public CudaOpsTest, public ::testing::WithParamInterface<test::OpCase> {};

TEST_P(OpTableCudaVsCpu, OutputsWithinTheirToleranceOfTheCpuTwins) {
  const test::OpCase& c = GetParam();
  const test::HostArgs start = test::op_case_values(c, 1234);
  test::HostArgs cpu_values = start, gpu_host;
  const test::Args cpu_args = test::host_tensors(c, cpu_values);
  const test::Args gpu_args = test::device_tensors(c, start, *arena_, gpu_host);
  for (auto [ops, args] : {std::pair<Ops*, const test::Args*>{&cpu_, &cpu_args}, {ops_.get(), &gpu_args}}) {
    if (c.setup) c.setup(*ops, *args);
    c.forward(*ops, *args);
    if (c.backward) c.backward(*ops, *args);
  }
  for (const test::Arg& arg : c.args) {
    if (!arg.output) continue;
    const test::HostArg got = test::download(arg, gpu_args.at(arg.name));
    const test::HostArg& want = cpu_values.at(arg.name);
    if (arg.tolerance == test::Tolerance::exact) {
      EXPECT_EQ(test::bits_differ(got, want), 0) << arg.name << ": values whose bits differ";
      continue;
    }
    EXPECT_LE(relative_l2(got.values, want.values), test::tolerance(arg, start, want.values))
        << arg.name << ", tolerance class " << test::tolerance_name(arg.tolerance);
  }
}

std::vector<test::OpCase> cuda_cases() {
  std::vector<test::OpCase> cases;
  for (test::OpCase& c : test::op_table())
    if (c.cuda && c.compared) cases.push_back(std::move(c));
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTableCudaVsCpu, ::testing::ValuesIn(cuda_cases()), test::OpCaseName());

// TP's backward runs a collective between the input-gradient and the weight-gradient halves:
// each half is the whole call's GEMM, bit for bit.
TEST_F(CudaOpsTest, LinearBackwardHalvesGiveTheWholeCallsBits) {
  const int64_t t = 96, k = 160, n = 224;
  std::vector<float> x = random_bf16_values(t * k, rng_), w = random_bf16_values(n * k, rng_, 0.05f),
                     dy = random_bf16_values(t * n, rng_), dw_start = random_bf16_values(n * k, rng_, 0.1f);
  Tensor gx = upload(x, {t, k}, DType::bf16), gw = upload(w, {n, k}, DType::bf16),
         gdy = upload(dy, {t, n}, DType::bf16);
  Tensor whole_dx = upload(std::vector<float>(t * k), {t, k}, DType::bf16),
         whole_dw = upload(dw_start, {n, k}, DType::f32);
  Tensor half_dx = upload(std::vector<float>(t * k), {t, k}, DType::bf16),
         half_dw = upload(dw_start, {n, k}, DType::f32);
  ops_->linear_backward(whole_dx, whole_dw, gdy, gx, gw);
  ops_->linear_backward(half_dx, Tensor{}, gdy, Tensor{}, gw);
  ops_->linear_backward(Tensor{}, half_dw, gdy, gx, gw);
  EXPECT_EQ(download(half_dx), download(whole_dx));
  EXPECT_EQ(download(half_dw), download(whole_dw));
}

// In place (d_qkv is d_qkv_out), as the model calls it: the same bits as into another
// buffer, v heads included; at the tiny layouts and Qwen3's 16/8 and 32/8 heads.
TEST_F(CudaOpsTest, QkNormRopeBackwardInPlaceGivesTheSameBits) {
  for (const HeadLayout heads :
       {HeadLayout{4, 2, 32}, HeadLayout{4, 2, 128}, HeadLayout{16, 8, 128}, HeadLayout{32, 8, 128}}) {
    const int64_t row = 40, t = 2 * row, hd = heads.head_dim, normed = heads.q_heads + heads.kv_heads;
    const int64_t nh = heads.total_heads();
    const RowSpans rows = two_rows(row);
    std::vector<float> qkv = random_bf16_values(t * nh * hd, rng_),
                       qw = random_bf16_values(hd, rng_, 0.1f, 1.0f),
                       kw = random_bf16_values(hd, rng_, 0.1f, 1.0f),
                       dy = random_bf16_values(t * nh * hd, rng_);
    Tensor gq = upload(qkv, {t, nh, hd}, DType::bf16), gqw = upload(qw, {hd}, DType::bf16),
           gkw = upload(kw, {hd}, DType::bf16), gdy = upload(dy, {t, nh, hd}, DType::bf16);
    Tensor gout = upload(std::vector<float>(t * nh * hd), {t, nh, hd}, DType::bf16);
    Tensor grstd = upload(std::vector<float>(t * normed), {t, normed}, DType::f32);
    Tensor gdx = upload(std::vector<float>(t * nh * hd), {t, nh, hd}, DType::bf16);
    Tensor gdqw = upload(std::vector<float>(hd), {hd}, DType::f32),
           gdkw = upload(std::vector<float>(hd), {hd}, DType::f32);
    ops_->qk_norm_rope_forward(gout, grstd, gq, gqw, gkw, rows, heads, 1e-6f, {1e6f});
    ops_->qk_norm_rope_backward(gdx, gdqw, gdkw, gdy, gq, gqw, gkw, grstd, rows, heads, {1e6f}, Tensor{});
    SCOPED_TRACE("heads " + std::to_string(heads.q_heads) + "/" + std::to_string(heads.kv_heads) + " of " +
                 std::to_string(hd));
    Tensor in_place = upload(dy, {t, nh, hd}, DType::bf16);
    Tensor gdqw2 = upload(std::vector<float>(hd), {hd}, DType::f32),
           gdkw2 = upload(std::vector<float>(hd), {hd}, DType::f32);
    ops_->qk_norm_rope_backward(in_place, gdqw2, gdkw2, in_place, gq, gqw, gkw, grstd, rows, heads, {1e6f},
                                Tensor{});
    EXPECT_EQ(download(in_place), download(gdx));
    EXPECT_EQ(download(gdqw2), download(gdqw));
    EXPECT_EQ(download(gdkw2), download(gdkw));
  }
}

// The table's embedding rows compare the GPU with the CPU; here, two calls give the same bits.
TEST_F(CudaOpsTest, EmbeddingBackwardIsDeterministic) {
  const int64_t t = 500, h = 96, v = 37;  // many repeated ids
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v - 1));
  std::vector<int32_t> ids(t);
  for (int32_t& id : ids) id = pick(rng_);
  Tensor gids = upload_ids(ids), gdy = upload(random_bf16_values(t * h, rng_), {t, h}, DType::bf16);
  Tensor gdt1 = upload(std::vector<float>(v * h), {v, h}, DType::f32),
         gdt2 = upload(std::vector<float>(v * h), {v, h}, DType::f32);
  ops_->embedding_backward(gdt1, gids, gdy);
  ops_->embedding_backward(gdt2, gids, gdy);
  const std::vector<float> first = download(gdt1);
  ASSERT_NE(first, std::vector<float>(v * h, 0.0f));
  EXPECT_EQ(first, download(gdt2)) << "the embedding backward is not deterministic";
}

// The plain bf16 attention of the header comment, on the CPU.
struct PlainAttention {
  std::vector<float> out, lse, dqkv;
};
PlainAttention plain_bf16_attention(const std::vector<float>& qkv, const std::vector<float>& dout,
                                    const RowSpans& rows, const HeadLayout& heads) {
  const int64_t nq = heads.q_heads, nk = heads.kv_heads, hd = heads.head_dim, nh = heads.total_heads();
  const int64_t t = rows.tokens(), group = nq / nk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  PlainAttention r{std::vector<float>(t * nq * hd), std::vector<float>(nq * t),
                   std::vector<float>(t * nh * hd, 0.0f)};
  std::vector<float> dk(t * nk * hd, 0.0f), dv(t * nk * hd, 0.0f);
  auto at = [&](int64_t tok, int64_t head, int64_t d) { return qkv[(tok * nh + head) * hd + d]; };
  for (int64_t row = 0; row < rows.rows(); ++row) {
    const int64_t b = rows.offsets[row], e = rows.offsets[row + 1];
    for (int64_t h = 0; h < nq; ++h) {
      const int64_t kh = nq + h / group, vh = nq + nk + h / group;
      for (int64_t i = b; i < e; ++i) {
        std::vector<float> p(e - b, 0.0f), dp(e - b, 0.0f);
        float m = -INFINITY;
        for (int64_t j = b; j <= i; ++j) {
          float s = 0;
          for (int64_t d = 0; d < hd; ++d) s += at(i, h, d) * at(j, kh, d);
          p[j - b] = round_bf16(s * scale);
          m = std::max(m, p[j - b]);
        }
        float sum = 0;
        for (int64_t j = b; j <= i; ++j) sum += std::exp(p[j - b] - m);
        r.lse[b * nq + h * (e - b) + (i - b)] = m + std::log(sum);
        for (int64_t j = b; j <= i; ++j) p[j - b] = round_bf16(std::exp(p[j - b] - m) / sum);
        for (int64_t d = 0; d < hd; ++d) {
          float o = 0;
          for (int64_t j = b; j <= i; ++j) o += p[j - b] * at(j, vh, d);
          r.out[(i * nq + h) * hd + d] = round_bf16(o);
        }
        // Backward of this query row.
        const float* dyi = &dout[(i * nq + h) * hd];
        float dsum = 0;
        for (int64_t j = b; j <= i; ++j) {
          float s = 0;
          for (int64_t d = 0; d < hd; ++d) s += dyi[d] * at(j, vh, d);
          dp[j - b] = round_bf16(s);
          dsum += p[j - b] * dp[j - b];
        }
        for (int64_t j = b; j <= i; ++j) {
          const float ds = round_bf16(p[j - b] * (dp[j - b] - dsum));
          for (int64_t d = 0; d < hd; ++d) {
            r.dqkv[(i * nh + h) * hd + d] += scale * ds * at(j, kh, d);
            dk[(j * nk + h / group) * hd + d] += scale * ds * at(i, h, d);
            dv[(j * nk + h / group) * hd + d] += p[j - b] * dyi[d];
          }
        }
      }
    }
  }
  for (int64_t i = 0; i < t; ++i)
    for (int64_t k = 0; k < nk; ++k)
      for (int64_t d = 0; d < hd; ++d) {
        r.dqkv[(i * nh + nq + k) * hd + d] = dk[(i * nk + k) * hd + d];
        r.dqkv[(i * nh + nq + nk + k) * hd + d] = dv[(i * nk + k) * hd + d];
      }
  r.dqkv = rounded(r.dqkv);
  return r;
}

TEST_F(CudaOpsTest, AttentionWithinTwiceThePlainBf16Error) {
  for (int64_t hd : {64, 128}) {
    const int64_t row = 72, t = 2 * row;
    const HeadLayout heads{4, 2, hd};
    const int64_t nh = heads.total_heads(), nq = heads.q_heads;
    const RowSpans rows = two_rows(row);
    std::vector<float> qkv = random_bf16_values(t * nh * hd, rng_),
                       dy = random_bf16_values(t * nq * hd, rng_);
    std::vector<float> out(t * nq * hd), lse(nq * t), dqkv(t * nh * hd);
    cpu_.attention_forward(host(out, {t, nq, hd}), host(lse, {nq, t}), host(qkv, {t, nh, hd}), rows, heads);
    cpu_.attention_backward(host(dqkv, {t, nh, hd}), host(dy, {t, nq, hd}), host(out, {t, nq, hd}),
                            host(lse, {nq, t}), host(qkv, {t, nh, hd}), rows, heads);
    const PlainAttention plain = plain_bf16_attention(qkv, dy, rows, heads);

    Tensor gq = upload(qkv, {t, nh, hd}, DType::bf16), gdy = upload(dy, {t, nq, hd}, DType::bf16);
    Tensor gout = upload(std::vector<float>(out.size()), {t, nq, hd}, DType::bf16);
    Tensor glse = upload(std::vector<float>(lse.size()), {nq, t}, DType::f32);
    Tensor gdq = upload(std::vector<float>(dqkv.size()), {t, nh, hd}, DType::bf16);
    ops_->attention_forward(gout, glse, gq, rows, heads);
    ops_->attention_backward(gdq, gdy, gout, glse, gq, rows, heads);
    SCOPED_TRACE("head_dim " + std::to_string(hd));
    const double out_err = relative_l2(download(gout), out), plain_out_err = relative_l2(plain.out, out);
    const double dq_err = relative_l2(download(gdq), dqkv), plain_dq_err = relative_l2(plain.dqkv, dqkv);
    EXPECT_LE(out_err, 2 * plain_out_err + 1e-5) << "plain bf16 error " << plain_out_err;
    EXPECT_LE(relative_l2(download(glse), lse), kReducedF32Tolerance * 10);
    EXPECT_LE(dq_err, 2 * plain_dq_err + 1e-5) << "plain bf16 error " << plain_dq_err;

    // The backward one row a call (what loom plan picks when two rows' workspace does not fit).
    CudaOps by_row;
    by_row.set_attention_backward_by_row(true);
    Tensor gdq_row = upload(std::vector<float>(dqkv.size()), {t, nh, hd}, DType::bf16);
    by_row.attention_backward(gdq_row, gdy, gout, glse, gq, rows, heads);
    LOOM_CUDA_CHECK(cudaStreamSynchronize(by_row.stream()));  // download waits on ops_'s stream only
    const double dq_row_err = relative_l2(download(gdq_row), dqkv);
    EXPECT_LE(dq_row_err, 2 * plain_dq_err + 1e-5) << "plain bf16 error " << plain_dq_err;
  }
}

// Rows of unequal lengths (sample-isolated packing: each sample and a row's padding a row
// of its own) run as THD, cuDNN's padding mask with ragged offsets; a length of 1 and more
// rows than a bucket's power of two included. Its lse is token-major within each row (ops.h).
TEST_F(CudaOpsTest, AttentionThdWithinTwiceThePlainBf16Error) {
  for (int64_t hd : {64, 128}) {
    const std::vector<int32_t> lengths{7, 70, 1, 33, 3, 12, 2, 40, 9};
    RowSpans rows;
    rows.offsets.push_back(0);
    for (int32_t n : lengths) rows.offsets.push_back(rows.offsets.back() + n);
    const int64_t t = rows.tokens();
    const HeadLayout heads{4, 2, hd};
    const int64_t nh = heads.total_heads(), nq = heads.q_heads;
    std::vector<float> qkv = random_bf16_values(t * nh * hd, rng_),
                       dy = random_bf16_values(t * nq * hd, rng_);
    std::vector<float> out(t * nq * hd), lse(nq * t), dqkv(t * nh * hd);
    cpu_.attention_forward(host(out, {t, nq, hd}), host(lse, {nq, t}), host(qkv, {t, nh, hd}), rows, heads);
    cpu_.attention_backward(host(dqkv, {t, nh, hd}), host(dy, {t, nq, hd}), host(out, {t, nq, hd}),
                            host(lse, {nq, t}), host(qkv, {t, nh, hd}), rows, heads);
    const PlainAttention plain = plain_bf16_attention(qkv, dy, rows, heads);
    Tensor gq = upload(qkv, {t, nh, hd}, DType::bf16), gdy = upload(dy, {t, nq, hd}, DType::bf16);
    Tensor gout = upload(std::vector<float>(out.size()), {t, nq, hd}, DType::bf16);
    Tensor glse = upload(std::vector<float>(lse.size()), {nq, t}, DType::f32);
    Tensor gdq = upload(std::vector<float>(dqkv.size()), {t, nh, hd}, DType::bf16);
    ops_->attention_forward(gout, glse, gq, rows, heads);
    ops_->attention_backward(gdq, gdy, gout, glse, gq, rows, heads);
    SCOPED_TRACE("head_dim " + std::to_string(hd));
    const double out_err = relative_l2(download(gout), out), plain_out_err = relative_l2(plain.out, out);
    const double dq_err = relative_l2(download(gdq), dqkv), plain_dq_err = relative_l2(plain.dqkv, dqkv);
    EXPECT_LE(out_err, 2 * plain_out_err + 1e-5) << "plain bf16 error " << plain_out_err;
    EXPECT_LE(dq_err, 2 * plain_dq_err + 1e-5) << "plain bf16 error " << plain_dq_err;
    // The CPU's row blocks are [nq, len_r], the THD ones [len_r, nq].
    std::vector<float> lse_thd(lse.size());
    for (size_t r = 0; r < lengths.size(); ++r)
      for (int64_t h = 0; h < nq; ++h)
        for (int64_t i = 0; i < lengths[r]; ++i)
          lse_thd[static_cast<size_t>(rows.offsets[r] * nq + i * nq + h)] =
              lse[static_cast<size_t>(rows.offsets[r] * nq + h * lengths[r] + i)];
    EXPECT_LE(relative_l2(download(glse), lse_thd), kReducedF32Tolerance * 10);
  }
}

// Context parallelism's attention at a size the op table's cases do not reach (pieces longer
// than a cuDNN tile, more pieces than a bucket's minimum): CP2 rank 0's share (chunks 0 and 3
// of 24 tokens) of two 96-token rows of isolated samples crossing the chunks. Its lse is
// [T, nq] token-major (the CPU's is [nq, T]); the backward twice gives the same bits (cuDNN's
// deterministic algorithm, the pieces' dK/dV summed in piece order).
TEST_F(CudaOpsTest, ContextAttentionMatchesTheCpuAndIsDeterministic) {
  const int32_t row = 96, chunk = 24;
  const std::vector<int32_t> spans = {0, 30, 50, 96, 106, 176, 192};
  std::vector<int32_t> sources;
  for (int32_t r = 0; r < 2; ++r)
    for (int32_t c : {0, 3})
      for (int32_t i = 0; i < chunk; ++i) sources.push_back(r * row + c * chunk + i);
  ContextSpans context;
  for (int32_t q : sources) {
    context.key_begin.push_back(*(std::upper_bound(spans.begin(), spans.end(), q) - 1));
    context.key_end.push_back(q + 1);
  }
  for (int64_t hd : {64, 128}) {
    SCOPED_TRACE("head_dim " + std::to_string(hd));
    const HeadLayout heads{8, 2, hd};
    const int64_t t = static_cast<int64_t>(sources.size()), t_all = 2 * row, nh = heads.total_heads(),
                  nq = heads.q_heads;
    std::vector<float> whole = random_bf16_values(t_all * nh * hd, rng_),
                       dy = random_bf16_values(t * nq * hd, rng_);
    std::vector<float> qkv(static_cast<size_t>(t * nh * hd));
    for (int64_t i = 0; i < t; ++i)
      std::copy_n(whole.begin() + sources[static_cast<size_t>(i)] * nh * hd, nh * hd,
                  qkv.begin() + i * nh * hd);
    std::vector<float> out(t * nq * hd), lse(nq * t), dqkv(t * nh * hd), dwhole(t_all * nh * hd);
    cpu_.attention_context_forward(host(out, {t, nq, hd}), host(lse, {nq, t}), host(qkv, {t, nh, hd}),
                                   host(whole, {t_all, nh, hd}), context, heads);
    cpu_.attention_context_backward(host(dqkv, {t, nh, hd}), host(dwhole, {t_all, nh, hd}),
                                    host(dy, {t, nq, hd}), host(out, {t, nq, hd}), host(lse, {nq, t}),
                                    host(qkv, {t, nh, hd}), host(whole, {t_all, nh, hd}), context, heads);

    Tensor gq = upload(qkv, {t, nh, hd}, DType::bf16), gw = upload(whole, {t_all, nh, hd}, DType::bf16),
           gdy = upload(dy, {t, nq, hd}, DType::bf16);
    Tensor gout = upload(std::vector<float>(out.size()), {t, nq, hd}, DType::bf16);
    Tensor glse = upload(std::vector<float>(lse.size()), {nq, t}, DType::f32);
    Tensor gdq = upload(std::vector<float>(dqkv.size()), {t, nh, hd}, DType::bf16);
    Tensor gdw = upload(std::vector<float>(dwhole.size()), {t_all, nh, hd}, DType::bf16);
    ops_->attention_context_forward(gout, glse, gq, gw, context, heads);
    ops_->attention_context_backward(gdq, gdw, gdy, gout, glse, gq, gw, context, heads);
    std::vector<float> lse_tokens(lse.size());
    for (int64_t h = 0; h < nq; ++h)
      for (int64_t i = 0; i < t; ++i)
        lse_tokens[static_cast<size_t>(i * nq + h)] = lse[static_cast<size_t>(h * t + i)];
    const double grads = test::tolerance(test::Tolerance::attention_grads, {});
    EXPECT_LE(relative_l2(download(gout), out), kBf16Tolerance);
    EXPECT_LE(relative_l2(download(glse), lse_tokens), kReducedF32Tolerance * 10);
    const std::vector<float> dq_first = download(gdq), dw_first = download(gdw);
    EXPECT_LE(relative_l2(dq_first, dqkv), grads);
    EXPECT_LE(relative_l2(dw_first, dwhole), grads);
    ops_->attention_context_backward(gdq, gdw, gdy, gout, glse, gq, gw, context, heads);
    EXPECT_EQ(download(gdq), dq_first) << "the context attention's backward is not deterministic";
    EXPECT_EQ(download(gdw), dw_first) << "the context attention's backward is not deterministic";
  }
}

// Σ x over an f32 tensor (what the step's Σ nll is): the CPU's sum up to the fp32 order.
TEST_F(CudaOpsTest, SumIsTheCpuSum) {
  for (const int64_t n : {130, 1000003}) {
    SCOPED_TRACE("values " + std::to_string(n));
    std::vector<float> x = random_bf16_values(n, rng_, 1.0f, 2.0f);
    double want = 0;
    for (float value : x) want += value;
    EXPECT_NEAR(ops_->sum(upload(x, {n}, DType::f32)), want, 5e-3 * std::fabs(want));
  }
}

// A tensor-parallel rank's rows [begin, begin + size) of the vocabulary.
struct VocabShard {
  int64_t begin, size;
};

std::string shard_name(const VocabShard& s) {
  return "shard [" + std::to_string(s.begin) + ", " + std::to_string(s.begin + s.size) + ")";
}

// The shard's rows of a [V, h] table.
std::vector<float> shard_rows(const std::vector<float>& table, const VocabShard& s, int64_t h) {
  return {table.begin() + s.begin * h, table.begin() + (s.begin + s.size) * h};
}

TEST_F(CudaOpsTest, EmbeddingShardsZeroOtherIdsAndAddUpToTheWholeTable) {
  const int64_t t = 500, h = 96, v = 60;  // many repeated ids, most outside any one shard
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v - 1));
  std::vector<int32_t> ids(t);
  for (int32_t& id : ids) id = pick(rng_);
  std::vector<float> table = random_bf16_values(v * h, rng_), dy = random_bf16_values(t * h, rng_);
  Tensor gids = upload_ids(ids), gdy = upload(dy, {t, h}, DType::bf16);
  Tensor gout_whole = upload(std::vector<float>(t * h), {t, h}, DType::bf16),
         gdt_whole = upload(std::vector<float>(v * h), {v, h}, DType::f32);
  ops_->embedding_forward(gout_whole, gids, upload(table, {v, h}, DType::bf16));
  ops_->embedding_backward(gdt_whole, gids, gdy);
  const std::vector<float> dt_whole = download(gdt_whole);

  std::vector<float> out_sum(t * h, 0.0f);  // what the all-reduce over TP makes of the outputs
  for (const VocabShard& s : {VocabShard{0, 20}, VocabShard{20, 25}, VocabShard{45, 15}}) {
    SCOPED_TRACE(shard_name(s));
    std::vector<float> part = shard_rows(table, s, h), out(t * h);
    std::vector<float> dtable_start = random_bf16_values(s.size * h, rng_, 0.1f), dtable = dtable_start;
    cpu_.embedding_forward_shard(host(out, {t, h}), host_ids(ids), host(part, {s.size, h}), s.begin);
    cpu_.embedding_backward_shard(host(dtable, {s.size, h}), host_ids(ids), host(dy, {t, h}), s.begin);
    // The output starts as noise: the zeros of other ids must be written.
    Tensor gout = upload(random_bf16_values(t * h, rng_), {t, h}, DType::bf16);
    Tensor gdt = upload(dtable_start, {s.size, h}, DType::f32);  // d_table accumulates
    Tensor gdt1 = upload(std::vector<float>(s.size * h), {s.size, h}, DType::f32),
           gdt2 = upload(std::vector<float>(s.size * h), {s.size, h}, DType::f32);
    ops_->embedding_forward_shard(gout, gids, upload(part, {s.size, h}, DType::bf16), s.begin);
    ops_->embedding_backward_shard(gdt, gids, gdy, s.begin);
    ops_->embedding_backward_shard(gdt1, gids, gdy, s.begin);
    ops_->embedding_backward_shard(gdt2, gids, gdy, s.begin);
    const std::vector<float> got = download(gout);
    EXPECT_EQ(got, out);  // a gather and zeros are exact
    EXPECT_LE(relative_l2(download(gdt), dtable), kReducedF32Tolerance);
    const std::vector<float> first = download(gdt1);
    EXPECT_EQ(first, download(gdt2)) << "the shard's embedding backward is not deterministic";
    // The same tokens added in the same order as the whole table's backward: the same bits.
    EXPECT_EQ(first, shard_rows(dt_whole, s, h));
    for (size_t i = 0; i < got.size(); ++i) out_sum[i] += got[i];
  }
  EXPECT_EQ(out_sum, download(gout_whole));
}

// Targets over a vocabulary of `vocab`, 30% of them masked (−1).
std::vector<int32_t> random_targets(int64_t t, int64_t vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
  std::bernoulli_distribution masked(0.3);
  std::vector<int32_t> targets(static_cast<size_t>(t));
  for (int32_t& id : targets) id = masked(rng) ? -1 : pick(rng);
  return targets;
}

TEST_F(CudaOpsTest, LmHeadShardForwardBackwardChunkedWithinTwiceThePlainBf16Error) {
  const int64_t t = 130, h = 64, v = 500;  // 3 chunks of 48 tokens
  std::vector<float> x = random_bf16_values(t * h, rng_), w = random_bf16_values(v * h, rng_, 0.2f);
  std::vector<int32_t> targets = random_targets(t, v, rng_);
  const float scale = 1.0f / 97.0f;
  // The backward takes the whole vocabulary's lse: the CPU's, over all rows as one shard.
  std::vector<float> lse_whole(t), target_logit_whole(t);
  cpu_.lm_head_shard_forward(host(lse_whole, {t}), host(target_logit_whole, {t}), host(x, {t, h}),
                             host(w, {v, h}), host_ids(targets), 0);
  Tensor gx = upload(x, {t, h}, DType::bf16), gt = upload_ids(targets),
         glse_whole = upload(lse_whole, {t}, DType::f32);
  // Shards in the middle of the vocabulary: rows of a multiple of 8 logits (the loss kernels'
  // 16-byte path) and of 100 (one logit at a time).
  for (const VocabShard& s : {VocabShard{200, 128}, VocabShard{123, 100}}) {
    SCOPED_TRACE(shard_name(s));
    int64_t inside = 0, outside = 0;
    for (int32_t id : targets) (id >= s.begin && id < s.begin + s.size ? inside : outside) += id >= 0 ? 1 : 0;
    ASSERT_GT(inside, 0);
    ASSERT_GT(outside, 0);
    std::vector<float> part = shard_rows(w, s, h);
    std::vector<float> lse(t), target_logit(t), dx(t * h), dw(s.size * h, 0.0f);
    cpu_.lm_head_shard_forward(host(lse, {t}), host(target_logit, {t}), host(x, {t, h}),
                               host(part, {s.size, h}), host_ids(targets), s.begin);
    cpu_.lm_head_shard_backward(host(dx, {t, h}), host(dw, {s.size, h}), host(x, {t, h}),
                                host(part, {s.size, h}), host_ids(targets), host(lse_whole, {t}), s.begin,
                                scale);
    Tensor gw = upload(part, {s.size, h}, DType::bf16);
    Tensor glse = upload(std::vector<float>(t, 1.0f), {t}, DType::f32),
           gtl = upload(std::vector<float>(t, 1.0f), {t}, DType::f32);
    Tensor gdx = upload(std::vector<float>(t * h), {t, h}, DType::bf16),
           gdw = upload(std::vector<float>(s.size * h), {s.size, h}, DType::f32);
    ops_->lm_head_shard_forward(glse, gtl, gx, gw, gt, s.begin);
    ops_->lm_head_shard_backward(gdx, gdw, gx, gw, gt, glse_whole, s.begin, scale);
    // As lm_head_loss: the plain bf16 implementation rounds the logits (the GEMM output), which
    // moves the lse by ~2^-9 of a logit; the target logit is one rounded GEMM output.
    EXPECT_LE(relative_l2(download(glse), lse), 5e-3);
    EXPECT_LE(relative_l2(download(gtl), target_logit),
              2 * relative_l2(rounded(target_logit), target_logit) + 1e-5);
    EXPECT_LE(relative_l2(download(gdx), dx), 2 * kBf16Tolerance);
    EXPECT_LE(relative_l2(download(gdw), dw), 2 * kBf16Tolerance);
  }
}

TEST_F(CudaOpsTest, LmHeadShardCombineIsAStableLogSumExp) {
  const int64_t t = 300, parts = 3;
  // Shard lse around 100: exp of them would overflow fp32 (past 88) without the max taken out.
  std::vector<float> lse_parts = random_bf16_values(parts * t, rng_, 3.0f, 100.0f),
                     target_logit = random_bf16_values(t, rng_, 2.0f);
  std::vector<int32_t> targets = random_targets(t, 1000, rng_);
  std::vector<float> nll(t), lse(t);
  cpu_.lm_head_shard_combine(host(nll, {t}), host(lse, {t}), host(lse_parts, {parts, t}),
                             host(target_logit, {t}), host_ids(targets));
  Tensor gnll = upload(std::vector<float>(t, 1.0f), {t}, DType::f32),
         glse = upload(std::vector<float>(t, 1.0f), {t}, DType::f32);
  ops_->lm_head_shard_combine(gnll, glse, upload(lse_parts, {parts, t}, DType::f32),
                              upload(target_logit, {t}, DType::f32), upload_ids(targets));
  const std::vector<float> got_nll = download(gnll), got_lse = download(glse);
  EXPECT_LE(relative_l2(got_nll, nll), kReducedF32Tolerance);
  EXPECT_LE(relative_l2(got_lse, lse), kReducedF32Tolerance);
  for (int64_t i = 0; i < t; ++i) {
    ASSERT_TRUE(std::isfinite(got_lse[i])) << "token " << i;
    if (targets[i] < 0) {
      EXPECT_TRUE(got_nll[i] == 0.0f && got_lse[i] == 0.0f) << "token " << i;
    }
  }
}

TEST_F(CudaOpsTest, AddIsTheFp32SumRoundedOnce) {
  // 16-byte vectors only, vectors and a tail, and a 3-d shape.
  for (const Shape& shape : {Shape{37, 72}, Shape{5, 13}, Shape{3, 4, 7}}) {
    SCOPED_TRACE("shape " + shape.str());
    const int64_t n = shape.numel();
    std::vector<float> a = random_bf16_values(n, rng_), b = random_bf16_values(n, rng_), out(n);
    cpu_.add(host(out, {1, n}), host(a, {1, n}), host(b, {1, n}));
    Tensor ga = upload(a, shape, DType::bf16), gb = upload(b, shape, DType::bf16),
           gout = upload(std::vector<float>(n), shape, DType::bf16);
    ops_->add(gout, ga, gb);
    EXPECT_EQ(download(gout), rounded(out));  // both round to nearest even
    // Views one value in: no pointer 16-byte aligned, every value one at a time.
    const auto offset = [n](const Tensor& x) {
      return Tensor{static_cast<uint16_t*>(x.data) + 1, {n - 1}, DType::bf16, Device::cuda};
    };
    Tensor gout2 = upload(std::vector<float>(n), shape, DType::bf16);
    ops_->add(offset(gout2), offset(ga), offset(gb));
    const std::vector<float> got = download(gout2), want = rounded(out);
    EXPECT_EQ(std::vector<float>(got.begin() + 1, got.end()),
              std::vector<float>(want.begin() + 1, want.end()));
  }
}

TEST_F(CudaOpsTest, LmHeadShardsAddUpToTheWholeVocabularyLoss) {
  const int64_t t = 130, h = 64, v = 500;  // 3 chunks of 48 tokens
  std::vector<float> x = random_bf16_values(t * h, rng_), w = random_bf16_values(v * h, rng_, 0.2f);
  std::vector<int32_t> targets = random_targets(t, v, rng_);
  const float scale = 1.0f / 97.0f;
  Tensor gx = upload(x, {t, h}, DType::bf16), gt = upload_ids(targets);
  Tensor gnll_whole = upload(std::vector<float>(t), {t}, DType::f32),
         gdx_whole = upload(std::vector<float>(t * h), {t, h}, DType::bf16),
         gdw_whole = upload(std::vector<float>(v * h), {v, h}, DType::f32);
  ops_->lm_head_loss(gnll_whole, gdx_whole, gdw_whole, gx, upload(w, {v, h}, DType::bf16), gt, scale);
  const std::vector<float> nll_whole = download(gnll_whole), dx_whole = download(gdx_whole),
                           dw_whole = download(gdw_whole);
  // What the engine does over TP, the collectives done here on the host: lse all-gathered,
  // target logits and input gradients summed.
  const std::vector<std::vector<VocabShard>> layouts{{{0, 248}, {248, 252}},
                                                     {{0, 128}, {128, 100}, {228, 144}, {372, 128}}};
  for (const std::vector<VocabShard>& shards : layouts) {
    const int64_t tp = static_cast<int64_t>(shards.size());
    SCOPED_TRACE("tp " + std::to_string(tp));
    Tensor glse_parts = upload(std::vector<float>(tp * t), {tp, t}, DType::f32);
    std::vector<Tensor> gw;
    std::vector<float> target_logit(t, 0.0f);
    for (int64_t r = 0; r < tp; ++r) {
      const VocabShard& s = shards[r];
      gw.push_back(upload(shard_rows(w, s, h), {s.size, h}, DType::bf16));
      Tensor glse_r{glse_parts.as<float>() + r * t, {t}, DType::f32, Device::cuda};
      Tensor gtl = upload(std::vector<float>(t), {t}, DType::f32);
      ops_->lm_head_shard_forward(glse_r, gtl, gx, gw.back(), gt, s.begin);
      const std::vector<float> part = download(gtl);
      for (int64_t i = 0; i < t; ++i) target_logit[i] += part[i];
    }
    Tensor gnll = upload(std::vector<float>(t), {t}, DType::f32),
           glse = upload(std::vector<float>(t), {t}, DType::f32);
    ops_->lm_head_shard_combine(gnll, glse, glse_parts, upload(target_logit, {t}, DType::f32), gt);
    // The shards' logits are the whole GEMM's columns and their lse the whole row's up to the
    // fp32 order, so nll and the weight gradient differ from the whole loss's only where a
    // logit rounds the other way (another cuBLASLt algorithm for the narrower GEMM): 1e-3 is
    // dozens of such roundings. d_hidden sums tp bf16 parts, each rounded.
    EXPECT_LE(relative_l2(download(gnll), nll_whole), 1e-3);
    std::vector<float> dx(t * h, 0.0f);
    for (int64_t r = 0; r < tp; ++r) {
      const VocabShard& s = shards[r];
      SCOPED_TRACE(shard_name(s));
      Tensor gdx = upload(std::vector<float>(t * h), {t, h}, DType::bf16),
             gdw = upload(std::vector<float>(s.size * h), {s.size, h}, DType::f32);
      ops_->lm_head_shard_backward(gdx, gdw, gx, gw[r], gt, glse, s.begin, scale);
      const std::vector<float> part = download(gdx);
      for (size_t i = 0; i < dx.size(); ++i) dx[i] += part[i];
      EXPECT_LE(relative_l2(download(gdw), shard_rows(dw_whole, s, h)), 1e-3);
    }
    EXPECT_LE(relative_l2(dx, dx_whole), 2 * kBf16Tolerance);
  }
}

TEST_F(CudaOpsTest, PrecisionAwareAdamIsBitwiseTheCpuReference) {
  const int64_t n = 300000;
  std::vector<float> master = random_bf16_values(n, rng_, 0.02f);
  std::normal_distribution<float> fine(0.0f, 1e-5f);
  for (float& m : master) m += fine(rng_);  // masters with non-zero remainders
  std::vector<float> grad(n);
  std::normal_distribution<float> g(0.0f, 1e-3f);
  for (float& x : grad) x = g(rng_);
  std::vector<uint16_t> bits(n);
  std::vector<int16_t> rem(n);
  master_split_array(master.data(), n, bits.data(), rem.data());
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  const std::vector<ParamRange> ranges{{0, 100000, true}, {100000, 200000, false}};
  const AdamWConfig cfg{0.9f, 0.98f, 1e-8f, 0.1f};

  uint16_t* gbits = static_cast<uint16_t*>(arena_->allocate_bytes(n * 2, "bits"));
  int16_t* grem = static_cast<int16_t*>(arena_->allocate_bytes(n * 2, "rem"));
  Tensor ggrad = upload(grad, {n}, DType::f32), gm = upload(m, {n}, DType::f32),
         gv = upload(v, {n}, DType::f32);
  LOOM_CUDA_CHECK(cudaMemcpy(gbits, bits.data(), n * 2, cudaMemcpyHostToDevice));
  LOOM_CUDA_CHECK(cudaMemcpy(grem, rem.data(), n * 2, cudaMemcpyHostToDevice));
  landed();
  std::vector<cuda::AdamChunk> chunks{{0, 65536, 1}, {65536, 34464, 1}, {100000, 200000, 0}};
  auto* gchunks =
      static_cast<cuda::AdamChunk*>(arena_->allocate_bytes(3 * sizeof(cuda::AdamChunk), "chunks"));
  LOOM_CUDA_CHECK(cudaMemcpy(gchunks, chunks.data(), 3 * sizeof(cuda::AdamChunk), cudaMemcpyHostToDevice));
  for (int64_t step = 1; step <= 3; ++step) {
    const float lr = 1e-3f * static_cast<float>(step);
    adamw_step_bf16_remainder(cfg, lr, step, ranges, bits.data(), rem.data(), grad.data(), m.data(),
                              v.data());
    const cuda::AdamScalars s = cuda_adam_scalars(cfg, lr, step);
    cuda::adamw_bf16_remainder(gbits, grem, ggrad.as<float>(), gm.as<float>(), gv.as<float>(), gchunks, 3, s,
                               1.0f, ops_->stream());
  }
  std::vector<uint16_t> got_bits(n);
  std::vector<int16_t> got_rem(n);
  LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_->stream()));
  LOOM_CUDA_CHECK(cudaMemcpy(got_bits.data(), gbits, n * 2, cudaMemcpyDeviceToHost));
  LOOM_CUDA_CHECK(cudaMemcpy(got_rem.data(), grem, n * 2, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got_bits, bits);
  EXPECT_EQ(got_rem, rem);
  EXPECT_EQ(download(gm), m);
  EXPECT_EQ(download(gv), v);
}

// GEMM tuning's check (ops/cuda/gemm.h): equal bits give equal fingerprints; one flipped bit
// or two words swapped give another.
TEST_F(CudaOpsTest, FingerprintSeesEveryBitAndPlace) {
  const int64_t n = 1000003;
  std::vector<float> x = random_bf16_values(n, rng_);
  Tensor a = upload(x, {n}, DType::bf16), b = upload(x, {n}, DType::bf16);
  unsigned long long* result = static_cast<unsigned long long*>(arena_->allocate_bytes(8, "fingerprint"));
  const auto fingerprint = [&](const Tensor& t) {
    cuda::fingerprint(result, t.data, t.numel() * 2, ops_->stream());
    unsigned long long value = 0;
    LOOM_CUDA_CHECK(cudaMemcpyAsync(&value, result, 8, cudaMemcpyDeviceToHost, ops_->stream()));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_->stream()));
    return value;
  };
  const unsigned long long same = fingerprint(a);
  EXPECT_EQ(fingerprint(b), same) << "equal bits, another buffer";
  std::vector<float> flipped = x;
  flipped[777777] = bf16_to_float(bf16{static_cast<uint16_t>(float_to_bf16(x[777777]).bits ^ 1u)});
  EXPECT_NE(fingerprint(upload(flipped, {n}, DType::bf16)), same) << "the lowest bit of one value flipped";
  std::vector<float> swapped = x;
  std::swap(swapped[10], swapped[20]);
  ASSERT_NE(x[10], x[20]);
  EXPECT_NE(fingerprint(upload(swapped, {n}, DType::bf16)), same) << "two values swapped";
}

// The tuned choice computes the heuristic first's bits: each GEMM kind of a step (forward,
// d_x, the weight gradient added into fp32 grads) on shapes whose candidates include
// split-K ones (a small output over a long k), tuned and untuned, from the same inputs and
// the same starting grads.
TEST_F(CudaOpsTest, TunedGemmsGiveTheHeuristicChoicesBits) {
  struct Case {
    GemmShape shape;
    const char* what;
  };
  const std::vector<Case> cases = {
      {{4096, 1024, 2048, false, true, DType::bf16, false}, "forward 4096 x 1024 x 2048"},
      {{2048, 512, 8192, false, false, DType::bf16, false}, "d_x 2048 x 512 x 8192"},
      {{512, 1024, 8192, true, false, DType::f32, true}, "weight gradient 512 x 1024 x 8192, added"},
  };
  for (const Case& c : cases) {
    const GemmShape& s = c.shape;
    const std::vector<float> a = random_bf16_values(s.m * s.k, rng_), b = random_bf16_values(s.k * s.n, rng_);
    const std::vector<float> start = random_bf16_values(s.m * s.n, rng_);
    Tensor da = upload(a, {s.m * s.k}, DType::bf16), db = upload(b, {s.k * s.n}, DType::bf16);
    std::vector<std::vector<float>> outs;
    for (const char* tune : {"0", "1"}) {
      setenv("LOOM_GEMM_AUTOTUNE", tune, 1);
      GemmRunner gemm(ops_->stream());
      unsetenv("LOOM_GEMM_AUTOTUNE");
      Tensor out = upload(start, {s.m * s.n}, s.out_dtype);
      gemm.run(s, da.data, db.data, out.data);
      gemm.run(s, da.data, db.data, out.data);  // the cached choice, a second time
      outs.push_back(download(out));
    }
    std::vector<uint32_t> untuned(outs[0].size()), tuned(outs[1].size());
    for (size_t i = 0; i < untuned.size(); ++i) {
      untuned[i] = std::bit_cast<uint32_t>(outs[0][i]);
      tuned[i] = std::bit_cast<uint32_t>(outs[1][i]);
    }
    EXPECT_EQ(tuned, untuned) << c.what << ": the tuned algorithm's output differs from the heuristic's";
  }
}

// The grad norm's pass with the step's 1/Σn folded in (train/cuda_param_store.cpp): bit for bit
// a scale pass and then Σ x², both the scaled values left in x and the fp64 sum. 3,000,017
// values: several per thread of the fixed grid, and an uneven tail; magnitudes over 1e-40 ..
// 1e3, so some products round into (or out of) the subnormal range and some squares underflow.
TEST_F(CudaOpsTest, ScaleAndSumSquaresInOnePassIsBitwiseTwoPasses) {
  const int64_t n = 3000017;
  std::uniform_real_distribution<float> exponent(-40.0f, 3.0f);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& value : x) value = (sign(rng_) ? -1.0f : 1.0f) * std::pow(10.0f, exponent(rng_));
  const auto bits = [](const std::vector<float>& values) {
    std::vector<uint32_t> out(values.size());
    for (size_t i = 0; i < values.size(); ++i) out[i] = std::bit_cast<uint32_t>(values[i]);
    return out;
  };
  for (const float scale : {1.0f / 16381.0f, 0.37f, 3.0f}) {
    Tensor two = upload(x, {n}, DType::f32), one = upload(x, {n}, DType::f32);
    cuda::scale_inplace(two.as<float>(), n, scale, ops_->stream());
    const double want = ops_->sum_squares(two.as<float>(), n);
    const double got = ops_->scale_sum_squares(one.as<float>(), n, scale);
    EXPECT_EQ(std::bit_cast<uint64_t>(got), std::bit_cast<uint64_t>(want))
        << "scale " << scale << ": Σ x² " << got << " vs " << want << " from two passes";
    EXPECT_EQ(bits(download(one)), bits(download(two))) << "scale " << scale << ": the scaled values differ";
  }
}

// The failure path's count of non-finite grads (count_nonfinite): per slot, the NaN and ±inf
// values over that slot's ranges, as a CPU scan counts them. Ranges of 1 to 3,000,017 values
// (grid-stride tails), several ranges to one slot and a slot with none, non-finite values at
// a range's first and last element and between ranges (counted by no range), every NaN and
// inf bit pattern class, finite neighbours (FLT_MAX, subnormals) not counted; then 70,000
// one-value ranges, past the 65,535 ranges one launch's grid holds.
TEST_F(CudaOpsTest, CountNonfiniteCountsEachRangesNanAndInfIntoItsSlot) {
  const std::vector<int64_t> sizes{1, 31, 32, 33, 4096, 100003, 3000017, 128, 777};
  constexpr int kSlots = 6;  // range i counts into slot i % 5: slot 5 has none
  constexpr int64_t kGap = 5;
  const std::vector<float> nonfinite{
      std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
      std::bit_cast<float>(0x7f800001u),  // a signalling NaN's bits
      std::bit_cast<float>(0xffffffffu),       std::numeric_limits<float>::infinity(),
      -std::numeric_limits<float>::infinity()};
  const std::vector<float> finite{std::numeric_limits<float>::max(),
                                  -std::numeric_limits<float>::max(),
                                  std::numeric_limits<float>::denorm_min(),
                                  0.0f,
                                  -0.0f,
                                  1.0f};
  std::vector<cuda::CountRange> ranges;
  int64_t n = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    ranges.push_back({n, sizes[i], static_cast<int32_t>(i % 5)});
    n += sizes[i] + kGap;
  }
  std::vector<float> x = random_bf16_values(n, rng_);
  std::uniform_int_distribution<size_t> pick(0, nonfinite.size() - 1);
  std::bernoulli_distribution sparse(0.001);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const cuda::CountRange& r = ranges[i];
    float* values = x.data() + r.offset;
    for (int64_t j = 0; j < r.numel; ++j) {
      if (sparse(rng_)) values[j] = nonfinite[pick(rng_)];
      if (j % 997 == 0) values[j] = finite[static_cast<size_t>(j / 997) % finite.size()];
    }
    if (i == 2) std::fill(values, values + r.numel, nonfinite[pick(rng_)]);  // wholly non-finite
    if (i == 3) {
      values[0] = nonfinite[pick(rng_)];
      values[r.numel - 1] = nonfinite[pick(rng_)];
    }
    if (i == 7) std::fill(values, values + r.numel, 0.0f);  // none
    std::fill(values + r.numel, values + r.numel + kGap, nonfinite[i % nonfinite.size()]);
  }
  const auto reference = [](const std::vector<float>& values, const std::vector<cuda::CountRange>& rs,
                            int slots) {
    std::vector<int64_t> counts(static_cast<size_t>(slots));
    for (const cuda::CountRange& r : rs)
      for (int64_t j = r.offset; j < r.offset + r.numel; ++j)
        counts[static_cast<size_t>(r.slot)] += std::isfinite(values[static_cast<size_t>(j)]) ? 0 : 1;
    return counts;
  };
  const std::vector<int64_t> want = reference(x, ranges, kSlots);
  ASSERT_GT(want[0], 0);
  ASSERT_EQ(want[5], 0);
  Tensor device_x = upload(x, {n}, DType::f32);
  EXPECT_EQ(ops_->count_nonfinite(device_x.as<float>(), ranges, kSlots), want);
  const std::vector<float> after = download(device_x);
  EXPECT_EQ(std::memcmp(after.data(), x.data(), x.size() * 4), 0) << "the values changed";

  std::vector<cuda::CountRange> single;
  for (int64_t j = 0; j < 70000; ++j) single.push_back({j, 1, static_cast<int32_t>(j % 3)});
  const std::vector<int64_t> want_single = reference(x, single, 3);
  ASSERT_GT(want_single[0] + want_single[1] + want_single[2], 0) << "no non-finite value among them";
  EXPECT_EQ(ops_->count_nonfinite(device_x.as<float>(), single, 3), want_single);
}

TEST_F(CudaOpsTest, OutOfMemoryNamesTheAllocationAndExitsThree) {
  DeviceArena arena("test");
  try {
    arena.allocate_bytes(int64_t{1} << 50, "a petabyte of activations");
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const LoomError& e) {
    EXPECT_EQ(e.code(), ExitCode::runtime_failure);
    EXPECT_NE(std::string(e.what()).find("a petabyte of activations"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("test arena"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom
