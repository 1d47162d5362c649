// Every CPU op's backward against central finite differences of its forward, over the op
// table's shapes (op_table.h), and the forwards against direct formulas on small cases.
//
// Each check builds L = Σ out · R for a fixed random R (the case's cotangent), perturbs
// sampled input elements by ±h and compares (L(x+h) − L(x−h)) / 2h with the analytic
// gradient. In fp32 with h = 1e-2 the truncation error is ~h² and the rounding error
// ~1e-7·|L|/h, so the relative L2 error of the sampled gradient sits near 1e-3; a wrong
// backward gives errors of order 1. Sampling keeps the check cheap at Qwen3's sizes: a
// case costs two forwards per sampled entry, whatever its number of gradient entries.
//
// The table itself is checked here too: every method of class Ops (read from ops.h) has a
// case, and each case's FLOP and byte counts, which the GPU's perf mode divides by.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/lora_dropout.h"
#include "ops/op_table.h"

namespace loom {
namespace {

constexpr double kFdStep = 1e-2;
constexpr double kFdRelTolerance = 5e-3;

struct Buf {
  std::vector<float> v;
  Shape shape;
  Buf(Shape s, std::mt19937& rng, float scale = 1.0f) : v(static_cast<size_t>(s.numel())), shape(s) {
    std::normal_distribution<float> d(0.0f, scale);
    for (float& x : v) x = d(rng);
  }
  explicit Buf(Shape s) : v(static_cast<size_t>(s.numel()), 0.0f), shape(s) {}
  Tensor t() { return Tensor{v.data(), shape, DType::f32, Device::cpu}; }
};

// The gradient of `loss` with respect to `input`, by central differences over `samples`
// randomly chosen elements, compared with `analytic`.
void expect_fd_match(const std::string& name, std::vector<float>& input, const std::vector<float>& analytic,
                     const std::function<double()>& loss, std::mt19937& rng, int samples) {
  std::uniform_int_distribution<size_t> pick(0, input.size() - 1);
  double err2 = 0.0, ref2 = 0.0;
  for (int s = 0; s < samples; ++s) {
    size_t i = pick(rng);
    float saved = input[i];
    input[i] = saved + static_cast<float>(kFdStep);
    double up = loss();
    input[i] = saved - static_cast<float>(kFdStep);
    double down = loss();
    input[i] = saved;
    double fd = (up - down) / (2 * kFdStep);
    err2 += (fd - analytic[i]) * (fd - analytic[i]);
    ref2 += fd * fd;
  }
  ASSERT_GT(ref2, 0.0) << name << ": finite differences are all zero; the check would be vacuous";
  EXPECT_LT(std::sqrt(err2 / ref2), kFdRelTolerance) << name;
}

double weighted_sum(const std::vector<float>& out, const std::vector<float>& r) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * r[i];
  return s;
}

RowSpans spans(std::vector<int32_t> lengths) {
  RowSpans rows;
  rows.offsets.push_back(0);
  for (int32_t n : lengths) rows.offsets.push_back(rows.offsets.back() + n);
  return rows;
}

class CpuOpsTest : public ::testing::Test {
 protected:
  CpuOps ops;
  std::mt19937 rng{1234};
};

TEST_F(CpuOpsTest, LinearForwardIsTheDirectProduct) {
  Buf x({5, 7}, rng), w({3, 7}, rng), out({5, 3});
  ops.linear_forward(out.t(), x.t(), w.t(), Tensor{});
  for (int t = 0; t < 5; ++t)
    for (int n = 0; n < 3; ++n) {
      double ref = 0;
      for (int k = 0; k < 7; ++k)
        ref += x.v[static_cast<size_t>(t * 7 + k)] * w.v[static_cast<size_t>(n * 7 + k)];
      EXPECT_NEAR(out.v[static_cast<size_t>(t * 3 + n)], ref, 1e-5);
    }
}

TEST_F(CpuOpsTest, LinearBackwardAccumulatesWeightGradient) {
  Buf x({4, 3}, rng), w({2, 3}, rng), dy({4, 2}, rng), dx({4, 3}), dw1({2, 3}), dw2({2, 3});
  ops.linear_backward(dx.t(), dw1.t(), dy.t(), x.t(), w.t());
  ops.linear_backward(Tensor{}, dw2.t(), dy.t(), x.t(), w.t());
  ops.linear_backward(Tensor{}, dw2.t(), dy.t(), x.t(), w.t());
  for (size_t i = 0; i < dw1.v.size(); ++i) EXPECT_NEAR(dw2.v[i], 2 * dw1.v[i], 1e-5);
}

// TP's backward runs a collective between the input-gradient and the weight-gradient halves.
TEST_F(CpuOpsTest, LinearBackwardHalvesGiveTheWholeCallsBits) {
  Buf x({5, 7}, rng), w({3, 7}, rng), dy({5, 3}, rng), dx({5, 7}), dw({3, 7}, rng), dx2({5, 7});
  Buf dw2 = dw;
  ops.linear_backward(dx.t(), dw.t(), dy.t(), x.t(), w.t());
  ops.linear_backward(dx2.t(), Tensor{}, dy.t(), Tensor{}, w.t());
  ops.linear_backward(Tensor{}, dw2.t(), dy.t(), x.t(), w.t());
  EXPECT_EQ(std::memcmp(dx2.v.data(), dx.v.data(), dx.v.size() * 4), 0);
  EXPECT_EQ(std::memcmp(dw2.v.data(), dw.v.data(), dw.v.size() * 4), 0);
}

TEST_F(CpuOpsTest, EmbeddingForwardAndBackward) {
  Buf table({6, 4}, rng), out({5, 4}), d_out({5, 4}, rng), d_table({6, 4});
  std::vector<int32_t> ids = {3, 0, 3, 5, 1};
  Tensor id_t{ids.data(), {5}, DType::i32, Device::cpu};
  ops.embedding_forward(out.t(), id_t, table.t());
  for (int t = 0; t < 5; ++t)
    for (int c = 0; c < 4; ++c)
      EXPECT_EQ(out.v[static_cast<size_t>(t * 4 + c)],
                table.v[static_cast<size_t>(ids[static_cast<size_t>(t)] * 4 + c)]);
  ops.embedding_backward(d_table.t(), id_t, d_out.t());
  for (int c = 0; c < 4; ++c) {
    EXPECT_FLOAT_EQ(d_table.v[static_cast<size_t>(3 * 4 + c)],
                    d_out.v[static_cast<size_t>(c)] + d_out.v[static_cast<size_t>(8 + c)]);
    EXPECT_EQ(d_table.v[static_cast<size_t>(2 * 4 + c)], 0.0f);  // row 2 never used
  }
}

TEST_F(CpuOpsTest, GatherAndScatterRowsMoveRowsByPosition) {
  Buf x({6, 3}, rng), rows({4, 3}), out({6, 3}, rng);
  const std::vector<float> before = out.v;
  std::vector<int32_t> index = {4, 1, 5, 2};
  Tensor index_t{index.data(), {4}, DType::i32, Device::cpu};
  ops.gather_rows(rows.t(), x.t(), index_t);
  for (size_t i = 0; i < index.size(); ++i)
    for (size_t c = 0; c < 3; ++c) EXPECT_EQ(rows.v[i * 3 + c], x.v[static_cast<size_t>(index[i]) * 3 + c]);
  // Scatter the first three back: rows 4, 1 and 5 of out take them, the others keep theirs.
  Tensor first_three{index.data(), {3}, DType::i32, Device::cpu};
  ops.scatter_rows(out.t(), rows.t(), first_three);
  for (size_t r = 0; r < 6; ++r)
    for (size_t c = 0; c < 3; ++c) {
      const bool moved = r == 4 || r == 1 || r == 5;
      EXPECT_EQ(out.v[r * 3 + c], moved ? x.v[r * 3 + c] : before[r * 3 + c]) << "row " << r;
    }
}

TEST_F(CpuOpsTest, RmsnormForwardIsTheDirectFormula) {
  const int64_t t = 70, h = 9;
  Buf x({t, h}, rng), w({h}, rng), out({t, h}), rstd({t});
  for (float& v : w.v) v += 1.0f;
  ops.rmsnorm_forward(out.t(), rstd.t(), x.t(), w.t(), 1e-6f, Tensor{});
  double ms = 0;
  for (int i = 0; i < h; ++i) ms += x.v[static_cast<size_t>(i)] * x.v[static_cast<size_t>(i)];
  float ref_rstd = static_cast<float>(1.0 / std::sqrt(ms / h + 1e-6));
  EXPECT_NEAR(rstd.v[0], ref_rstd, 1e-6f * ref_rstd);
  EXPECT_NEAR(out.v[2], x.v[2] * ref_rstd * w.v[2], 1e-5);
}

TEST_F(CpuOpsTest, RmsnormBackwardAddsIntoResidualGradient) {
  Buf x({3, 4}, rng), w({4}, rng), out({3, 4}), rstd({3}), dy({3, 4}, rng), dw({4});
  ops.rmsnorm_forward(out.t(), rstd.t(), x.t(), w.t(), 1e-6f, Tensor{});
  Buf dx_zero({3, 4}), dx_base({3, 4}, rng);
  std::vector<float> base = dx_base.v;
  ops.rmsnorm_backward(dx_zero.t(), dw.t(), dy.t(), x.t(), w.t(), rstd.t(), {});
  ops.rmsnorm_backward(dx_base.t(), dw.t(), dy.t(), x.t(), w.t(), rstd.t(), {});
  for (size_t i = 0; i < base.size(); ++i) EXPECT_NEAR(dx_base.v[i], base[i] + dx_zero.v[i], 1e-6);
}

TEST_F(CpuOpsTest, ResidualRmsnormAddsThenNorms) {
  Buf a({2, 5}, rng), b({2, 5}, rng), w({5}, rng), sum({2, 5}), out1({2, 5}), out2({2, 5}), r1({2}), r2({2});
  ops.residual_rmsnorm_forward(sum.t(), out1.t(), r1.t(), a.t(), b.t(), w.t(), 1e-6f, {});
  for (size_t i = 0; i < sum.v.size(); ++i) EXPECT_EQ(sum.v[i], a.v[i] + b.v[i]);
  ops.rmsnorm_forward(out2.t(), r2.t(), sum.t(), w.t(), 1e-6f, Tensor{});
  EXPECT_EQ(out1.v, out2.v);
}

TEST_F(CpuOpsTest, QkNormRopeNormsThenRotatesAndItsBackwardRunsInPlace) {
  HeadLayout heads{4, 2, 8};
  RowSpans rows = spans({5, 3, 6});
  const int64_t t = rows.tokens(), nh = heads.total_heads(), hd = heads.head_dim;
  Buf qkv({t, nh, hd}, rng), qw({hd}, rng), kw({hd}, rng), out({t, nh, hd}), rstd({t, 6}),
      r({t, nh, hd}, rng);
  for (float& v : qw.v) v += 1.0f;
  for (float& v : kw.v) v += 1.0f;
  const float theta = 100.0f;
  ops.qk_norm_rope_forward(out.t(), rstd.t(), qkv.t(), qw.t(), kw.t(), rows, heads, 1e-6f, {theta});
  // Position 0 of each row has angle 0: the output is the normed input unrotated.
  for (int32_t row_start : {0, 5, 8}) {
    const float* x = &qkv.v[static_cast<size_t>(row_start * nh * hd)];
    double ms = 0;
    for (int i = 0; i < hd; ++i) ms += x[i] * x[i];
    float rs = static_cast<float>(1.0 / std::sqrt(ms / static_cast<double>(hd) + 1e-6));
    EXPECT_NEAR(out.v[static_cast<size_t>(row_start * nh * hd + 3)], x[3] * rs * qw.v[3], 1e-5);
  }
  // Token 2 of row 0, q head 0, pair (1, 1 + hd/2): rotated by angle 2 · theta^(-2/hd).
  {
    const float* x = &qkv.v[static_cast<size_t>(2 * nh * hd)];
    double ms = 0;
    for (int i = 0; i < hd; ++i) ms += x[i] * x[i];
    float rs = static_cast<float>(1.0 / std::sqrt(ms / static_cast<double>(hd) + 1e-6));
    double angle = 2.0 * std::pow(100.0, -2.0 / 8.0);
    double y1 = x[1] * rs * qw.v[1], y2 = x[5] * rs * qw.v[5];
    EXPECT_NEAR(out.v[static_cast<size_t>(2 * nh * hd + 1)], y1 * std::cos(angle) - y2 * std::sin(angle),
                1e-5);
    EXPECT_NEAR(out.v[static_cast<size_t>(2 * nh * hd + 5)], y2 * std::cos(angle) + y1 * std::sin(angle),
                1e-5);
  }
  // v heads are copied.
  EXPECT_EQ(out.v[static_cast<size_t>((3 * nh + 7) * hd + 2)],
            qkv.v[static_cast<size_t>((3 * nh + 7) * hd + 2)]);
  Buf dqkv({t, nh, hd}), dqw({hd}), dkw({hd});
  ops.qk_norm_rope_backward(dqkv.t(), dqw.t(), dkw.t(), r.t(), qkv.t(), qw.t(), kw.t(), rstd.t(), rows, heads,
                            {theta}, Tensor{});
  // In place (d_qkv is d_qkv_out), as the model calls it: the same bits, v heads included.
  Buf in_place = r, dqw2({hd}), dkw2({hd});
  ops.qk_norm_rope_backward(in_place.t(), dqw2.t(), dkw2.t(), in_place.t(), qkv.t(), qw.t(), kw.t(), rstd.t(),
                            rows, heads, {theta}, Tensor{});
  EXPECT_EQ(in_place.v, dqkv.v);
  EXPECT_EQ(dqw2.v, dqw.v);
  EXPECT_EQ(dkw2.v, dkw.v);
}

// RowSpans::positions (context parallelism): tokens taken out of rows, each at the position
// its row gave it, get the row op's bits, forward and backward.
TEST_F(CpuOpsTest, QkNormRopeAtGivenPositionsIsTheRowsOp) {
  HeadLayout heads{4, 2, 8};
  const RowSpans rows = spans({5, 3});
  const int64_t t = rows.tokens(), nh = heads.total_heads(), hd = heads.head_dim, width = nh * hd;
  Buf qkv({t, nh, hd}, rng), qw({hd}, rng), kw({hd}, rng), out({t, nh, hd}), rstd({t, 6}),
      r({t, nh, hd}, rng);
  ops.qk_norm_rope_forward(out.t(), rstd.t(), qkv.t(), qw.t(), kw.t(), rows, heads, 1e-6f, {100.0f});
  Buf dqkv({t, nh, hd}), dqw({hd}), dkw({hd});
  ops.qk_norm_rope_backward(dqkv.t(), dqw.t(), dkw.t(), r.t(), qkv.t(), qw.t(), kw.t(), rstd.t(), rows, heads,
                            {100.0f}, Tensor{});
  // Tokens 3, 4 and 6 (positions 3, 4 and 1) as one span of given positions.
  const std::vector<int64_t> picked{3, 4, 6};
  const auto n = static_cast<int64_t>(picked.size());
  Buf sub({n, nh, hd}), sub_r({n, nh, hd}), sub_out({n, nh, hd}), sub_rstd({n, 6}), sub_d({n, nh, hd}),
      sub_dqw({hd}), sub_dkw({hd});
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(&qkv.v[static_cast<size_t>(picked[static_cast<size_t>(i)] * width)], width,
                &sub.v[static_cast<size_t>(i * width)]);
    std::copy_n(&r.v[static_cast<size_t>(picked[static_cast<size_t>(i)] * width)], width,
                &sub_r.v[static_cast<size_t>(i * width)]);
  }
  const RowSpans given{{0, static_cast<int32_t>(n)}, {3, 4, 1}};
  ops.qk_norm_rope_forward(sub_out.t(), sub_rstd.t(), sub.t(), qw.t(), kw.t(), given, heads, 1e-6f, {100.0f});
  ops.qk_norm_rope_backward(sub_d.t(), sub_dqw.t(), sub_dkw.t(), sub_r.t(), sub.t(), qw.t(), kw.t(),
                            sub_rstd.t(), given, heads, {100.0f}, Tensor{});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < width; ++k) {
      const auto at = static_cast<size_t>(picked[static_cast<size_t>(i)] * width + k);
      EXPECT_EQ(sub_out.v[static_cast<size_t>(i * width + k)], out.v[at]);
      EXPECT_EQ(sub_d.v[static_cast<size_t>(i * width + k)], dqkv.v[at]);
    }
}

// Llama 3.2 1B's RoPE (theta 500,000, head_dim 64, llama3 scaling: factor 32, low 1, high
// 4, original context 8,192): the fp32 bits of transformers 5.25's
// ROPE_INIT_FUNCTIONS["llama3"], all three bands (high frequencies kept, 11 to 13 blended,
// low ones divided by 32).
TEST(RopeFrequencies, Llama3ScalingEqualsTransformers) {
  const uint32_t expected[] = {
      0x3f800000, 0x3f29e1c6, 0x3ee177bc, 0x3e959ee3, 0x3e4693b0, 0x3e03c6a0, 0x3daee4ad, 0x3d681e67,
      0x3d1a08c8, 0x3ccc6f49, 0x3c87a9c3, 0x3c340d6d, 0x3beef74f, 0x3b9e9402, 0x3b527720, 0x3aa9279b,
      0x39e13620, 0x38cb98f7, 0x37a3418d, 0x3758ac81, 0x370fc8f8, 0x36bed4f4, 0x367d45c3, 0x3628126b,
      0x35df10c4, 0x359406cb, 0x35447610, 0x35025f34, 0x34ad07a7, 0x3465a54d, 0x341864a7, 0x33ca41b0};
  const std::vector<float> inv_freq = rope_inv_freq({5e5f, true, 32.0f, 1.0f, 4.0f, 8192}, 64);
  ASSERT_EQ(inv_freq.size(), std::size(expected));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    float want;
    std::memcpy(&want, &expected[i], sizeof(want));
    // std::pow and torch's pow may round theta^(2i/hd) apart by an ulp.
    EXPECT_NEAR(inv_freq[i], want, 2e-7f * want) << "frequency " << i;
  }
  // Without scaling: theta^(-2i/hd) alone.
  const std::vector<float> plain = rope_inv_freq({5e5f}, 64);
  EXPECT_FLOAT_EQ(plain[16], 1.0f / std::pow(5e5f, 0.5f));
}

TEST_F(CpuOpsTest, AttentionIsCausalWithinRowsAndMatchesDirectSoftmax) {
  HeadLayout heads{4, 2, 4};
  RowSpans rows = spans({4, 3});
  const int64_t t = rows.tokens(), nh = heads.total_heads(), hd = heads.head_dim;
  Buf qkv({t, nh, hd}, rng), out({t, 4, hd}), lse({4, t});
  ops.attention_forward(out.t(), lse.t(), qkv.t(), rows, heads);
  auto at = [&](int64_t tok, int64_t h, int64_t i) {
    return qkv.v[static_cast<size_t>((tok * nh + h) * hd + i)];
  };
  // Query 2 of row 1 (token 6), q head 3 → kv head 1 (heads 2, 3 share it): keys 4..6 only.
  std::vector<double> s;
  for (int64_t j = 4; j <= 6; ++j) {
    double d = 0;
    for (int i = 0; i < hd; ++i) d += at(6, 3, i) * at(j, 4 + 1, i);
    s.push_back(d / 2.0);  // 1/sqrt(hd = 4)
  }
  double m = std::max({s[0], s[1], s[2]}), z = 0;
  for (double v : s) z += std::exp(v - m);
  // lse is ordered row by row (ops.h): row 1 starts at token 4, so its [4 heads, 3] block
  // starts at 4·4; head 3, position 2 within it: 16 + 3·3 + 2.
  EXPECT_NEAR(lse.v[static_cast<size_t>(16 + 3 * 3 + 2)], m + std::log(z), 1e-5);
  for (int i = 0; i < hd; ++i) {
    double o = 0;
    for (int j = 0; j < 3; ++j) o += std::exp(s[static_cast<size_t>(j)] - m) / z * at(4 + j, 6 + 1, i);
    EXPECT_NEAR(out.v[static_cast<size_t>((6 * 4 + 3) * hd + i)], o, 1e-5);
  }
  // The first token of a row attends only to itself: its output is its own v.
  for (int i = 0; i < hd; ++i)
    EXPECT_NEAR(out.v[static_cast<size_t>((4 * 4 + 0) * hd + i)], at(4, 6, i), 1e-6);
}

TEST_F(CpuOpsTest, SwigluForwardIsSiluOfGateTimesUp) {
  Buf gu({6, 10}, rng), out({6, 5});
  ops.swiglu_forward(out.t(), gu.t(), {});
  float g = gu.v[1], u = gu.v[6];
  EXPECT_NEAR(out.v[1], g / (1 + std::exp(-g)) * u, 1e-6);
}

TEST_F(CpuOpsTest, LmHeadLossIsTheLogSoftmaxsNll) {
  const int64_t t = 300, h = 6, vocab = 11;  // 300 tokens: more than one 256-token chunk
  Buf x({t, h}, rng), w({vocab, h}, rng), nll({t}), dx({t, h}), dw({vocab, h});
  std::vector<int32_t> targets(static_cast<size_t>(t));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = i % 5 == 0 ? -1 : tok(rng);
  Tensor tt{targets.data(), {t}, DType::i32, Device::cpu};
  const float scale = 0.5f;
  ops.lm_head_loss(nll.t(), dx.t(), dw.t(), x.t(), w.t(), tt, scale);
  // Token 1 by the direct formula; masked tokens have nll 0 and no gradient.
  {
    std::vector<double> z(vocab);
    double m = -1e30, s = 0;
    for (int v = 0; v < vocab; ++v) {
      for (int i = 0; i < h; ++i)
        z[static_cast<size_t>(v)] += x.v[static_cast<size_t>(h + i)] * w.v[static_cast<size_t>(v * h + i)];
      m = std::max(m, z[static_cast<size_t>(v)]);
    }
    for (double v : z) s += std::exp(v - m);
    EXPECT_NEAR(nll.v[1], m + std::log(s) - z[static_cast<size_t>(targets[1])], 1e-5);
    EXPECT_EQ(nll.v[0], 0.0f);
    for (int i = 0; i < h; ++i) EXPECT_EQ(dx.v[static_cast<size_t>(i)], 0.0f);
  }
}

// The vocab-parallel pieces over two shards of the vocabulary equal the unsharded ops:
// the embedding's shards sum to the lookup, and the lm_head's halves put together give
// lm_head_loss's nll, and the shards' d_hidden sum to its (each shard's d_weight its rows).
TEST_F(CpuOpsTest, VocabShardsEqualTheWholeVocabulary) {
  const int64_t t = 300, h = 6, vocab = 12, half = vocab / 2;
  Buf x({t, h}, rng), w({vocab, h}, rng), nll({t}), dx({t, h}), dw({vocab, h});
  std::vector<int32_t> targets(static_cast<size_t>(t));
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(vocab - 1));
  for (size_t i = 0; i < targets.size(); ++i) targets[i] = i % 5 == 0 ? -1 : tok(rng);
  Tensor tt{targets.data(), {t}, DType::i32, Device::cpu};
  const float scale = 0.5f;
  ops.lm_head_loss(nll.t(), dx.t(), dw.t(), x.t(), w.t(), tt, scale);

  Buf lse_parts({2, t}), target_logit({t}), part_logit({t}), lse({t}), shard_nll({t}), dx_sum({t, h});
  std::vector<Buf> dw_shard{Buf({half, h}), Buf({half, h})};
  auto shard = [&](int r) { return w.t().rows(r * half, half); };
  for (int r = 0; r < 2; ++r) {
    ops.lm_head_shard_forward(lse_parts.t().rows(r, 1).reshaped({t}), part_logit.t(), x.t(), shard(r), tt,
                              r * half);
    for (int64_t i = 0; i < t; ++i)
      target_logit.v[static_cast<size_t>(i)] += part_logit.v[static_cast<size_t>(i)];
  }
  ops.lm_head_shard_combine(shard_nll.t(), lse.t(), lse_parts.t(), target_logit.t(), tt);
  for (int64_t i = 0; i < t; ++i)
    EXPECT_NEAR(shard_nll.v[static_cast<size_t>(i)], nll.v[static_cast<size_t>(i)], 1e-5);
  for (int r = 0; r < 2; ++r) {
    Buf d_part({t, h});
    ops.lm_head_shard_backward(d_part.t(), dw_shard[static_cast<size_t>(r)].t(), x.t(), shard(r), tt, lse.t(),
                               r * half, scale);
    for (size_t i = 0; i < d_part.v.size(); ++i) dx_sum.v[i] += d_part.v[i];
    for (int64_t i = 0; i < half * h; ++i)
      EXPECT_NEAR(dw_shard[static_cast<size_t>(r)].v[static_cast<size_t>(i)],
                  dw.v[static_cast<size_t>(r * half * h + i)], 1e-5);
  }
  for (size_t i = 0; i < dx.v.size(); ++i) EXPECT_NEAR(dx_sum.v[i], dx.v[i], 1e-5);

  std::vector<int32_t> ids = {3, 0, 11, 6, 5};
  Tensor id_t{ids.data(), {5}, DType::i32, Device::cpu};
  Buf out({5, h}), sum({5, h}), d_out({5, h}, rng), d_whole({vocab, h});
  ops.embedding_forward(out.t(), id_t, w.t());
  ops.embedding_backward(d_whole.t(), id_t, d_out.t());
  for (int r = 0; r < 2; ++r) {
    Buf part({5, h}), d_part({half, h});
    ops.embedding_forward_shard(part.t(), id_t, shard(r), r * half);
    for (size_t i = 0; i < part.v.size(); ++i) sum.v[i] += part.v[i];
    ops.embedding_backward_shard(d_part.t(), id_t, d_out.t(), r * half);
    for (int64_t i = 0; i < half * h; ++i)
      EXPECT_EQ(d_part.v[static_cast<size_t>(i)], d_whole.v[static_cast<size_t>(r * half * h + i)]);
  }
  EXPECT_EQ(sum.v, out.v);
}

// LoRA dropout's mask (ops/lora_dropout.h) over 512 tokens × 256 columns of ones at p = 0.1: the
// fraction dropped within 4σ of p (σ = √(p(1 − p)/n) ≈ 8.3e-4), each kept value exactly
// 1 / (1 − p); another stream (step, layer or target), another token row or index gives a mask
// that agrees with it as independent draws do (both drop ≈ p² of the values, within 4σ); the
// columns [64, 256) of the whole input are the mask of a shard starting at column 64.
TEST_F(CpuOpsTest, LoraDropoutDropsAboutPWithMasksIndependentByAddress) {
  constexpr int64_t kT = 512, kK = 256;
  constexpr double kP = 0.1;
  const double n = static_cast<double>(kT * kK);
  std::vector<int32_t> pairs;
  for (int64_t t = 0; t < kT; ++t) {
    pairs.push_back(static_cast<int32_t>(t / 128));  // four rows of 128 tokens
    pairs.push_back(static_cast<int32_t>(t % 128));
  }
  Buf ones({kT, kK});
  std::fill(ones.v.begin(), ones.v.end(), 1.0f);
  const auto mask = [&](uint64_t stream, const std::vector<int32_t>& tokens, int64_t feature_begin, Buf& x) {
    LoraDropoutMask m;
    m.stream = stream;
    m.threshold = lora_dropout_threshold(kP);
    m.scale = static_cast<float>(1.0 / (1.0 - kP));
    m.tokens = Tensor{const_cast<int32_t*>(tokens.data()), {x.shape[0], 2}, DType::i32, Device::cpu};
    m.feature_begin = feature_begin;
    Buf out(x.shape);
    ops.lora_dropout(out.t(), x.t(), m, false);
    return out.v;
  };
  const uint64_t base = lora_dropout_stream(1234, 5, 2, 0);
  const std::vector<float> a = mask(base, pairs, 0, ones);
  double dropped = 0;
  for (float v : a) {
    if (v == 0.0f)
      ++dropped;
    else
      EXPECT_EQ(v, static_cast<float>(1.0 / (1.0 - kP)));
  }
  const double sigma = std::sqrt(kP * (1 - kP) / n);
  EXPECT_NEAR(dropped / n, kP, 4 * sigma);

  const auto both_dropped = [&](const std::vector<float>& b) {
    double both = 0;
    for (size_t i = 0; i < a.size(); ++i) both += a[i] == 0.0f && b[i] == 0.0f ? 1 : 0;
    return both / n;
  };
  const double p2 = kP * kP, sigma2 = std::sqrt(p2 * (1 - p2) / n);
  std::vector<int32_t> next_row = pairs, next_index = pairs;
  for (size_t t = 0; t < next_row.size(); t += 2) next_row[t] += 4;
  for (size_t t = 1; t < next_index.size(); t += 2) next_index[t] = (next_index[t] + 1) % 128;
  const std::vector<std::pair<const char*, std::vector<float>>> others{
      {"step", mask(lora_dropout_stream(1234, 6, 2, 0), pairs, 0, ones)},
      {"layer", mask(lora_dropout_stream(1234, 5, 3, 0), pairs, 0, ones)},
      {"target", mask(lora_dropout_stream(1234, 5, 2, 1), pairs, 0, ones)},
      {"seed", mask(lora_dropout_stream(1235, 5, 2, 0), pairs, 0, ones)},
      {"row", mask(base, next_row, 0, ones)},
      {"index", mask(base, next_index, 0, ones)}};
  for (const auto& [what, b] : others) EXPECT_NEAR(both_dropped(b), p2, 4 * sigma2) << what;

  Buf shard({kT, kK - 64});
  std::fill(shard.v.begin(), shard.v.end(), 1.0f);
  const std::vector<float> part = mask(base, pairs, 64, shard);
  for (int64_t t = 0; t < kT; ++t)
    for (int64_t c = 64; c < kK; ++c)
      ASSERT_EQ(part[static_cast<size_t>(t * (kK - 64) + c - 64)], a[static_cast<size_t>(t * kK + c)])
          << t << ", " << c;
}

TEST_F(CpuOpsTest, ShapeMismatchNamesOpAndTensor) {
  Buf x({5, 7}, rng), w({3, 6}, rng), out({5, 3});
  try {
    ops.linear_forward(out.t(), x.t(), w.t(), Tensor{});
    FAIL() << "expected a shape error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("linear_forward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("weight"), std::string::npos) << e.what();
  }
}

// The op table's cases on the CPU backend: forward, backward, then finite differences of
// the forward over `samples` entries of each gradient (what the backward added to it).
class OpTableFiniteDifferences : public ::testing::TestWithParam<test::OpCase> {};

TEST_P(OpTableFiniteDifferences, BackwardMatchesCentralDifferencesOfTheForward) {
  const test::OpCase& c = GetParam();
  CpuOps ops;
  test::HostArgs values = test::op_case_values(c, 1234);
  const test::HostArgs start = values;
  const test::Args args = test::host_tensors(c, values);
  if (c.setup) c.setup(ops, args);
  c.forward(ops, args);
  c.backward(ops, args);
  const auto loss = [&] {
    c.forward(ops, args);
    double sum = 0;
    for (const auto& [out, cotangent] : c.loss)
      sum += weighted_sum(values.at(out).values, values.at(cotangent).values);
    return sum;
  };
  std::mt19937 rng(5678);
  for (const auto& [input, grad] : c.gradients) {
    std::vector<float> added = values.at(grad).values;
    for (size_t i = 0; i < added.size(); ++i) added[i] -= start.at(grad).values[i];
    expect_fd_match(input, values.at(input).values, added, loss, rng, c.samples);
  }
}

std::vector<test::OpCase> finite_difference_cases() {
  std::vector<test::OpCase> cases;
  for (test::OpCase& c : test::op_table())
    if (c.finite_differences && c.backward) cases.push_back(std::move(c));
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTableFiniteDifferences, ::testing::ValuesIn(finite_difference_cases()),
                         test::OpCaseName());

// The names of the member functions declared in `class Ops` of ops.h, read as text: comments
// dropped, then at the class body's own brace depth each declaration's name, the identifier
// before its first "(" (inline bodies, at a deeper depth, are passed over). Its destructor and
// the two that say what a backend is (device, activation_dtype) are not ops.
std::set<std::string> ops_methods(const std::string& header_path) {
  std::ifstream file(header_path);
  if (!file) throw std::runtime_error("cannot read " + header_path);
  std::string code, line;
  while (std::getline(file, line)) code += line.substr(0, line.find("//")) + "\n";
  const size_t begin = code.find("class Ops {");
  if (begin == std::string::npos) throw std::runtime_error(header_path + " declares no class Ops");
  std::set<std::string> names;
  std::string declaration;
  int depth = 0;
  for (size_t i = begin + std::string("class Ops ").size(); i < code.size(); ++i) {
    const char ch = code[i];
    if (ch == '{' && ++depth > 1) continue;
    if (ch == '}' && --depth == 0) break;
    if (depth != 1 || ch == '{') continue;
    if (ch != ';' && ch != '}') {
      declaration += ch;
      continue;
    }
    const size_t paren = declaration.find('(');
    if (paren != std::string::npos) {
      size_t end = paren;
      while (end > 0 && std::isspace(static_cast<unsigned char>(declaration[end - 1]))) --end;
      size_t start = end;
      while (start > 0 && (std::isalnum(static_cast<unsigned char>(declaration[start - 1])) ||
                           declaration[start - 1] == '_' || declaration[start - 1] == '~'))
        --start;
      names.insert(declaration.substr(start, end - start));
    }
    declaration.clear();
  }
  for (const char* not_an_op : {"~Ops", "device", "activation_dtype"}) names.erase(not_an_op);
  return names;
}

// Every Ops method has a case in the op table, and every method a case names is one: a new
// op fails here until the table runs it (its case's `ops` lists it).
TEST(OpTableCoverage, EveryOpsMethodHasACase) {
  const std::set<std::string> methods = ops_methods(LOOM_SOURCE_DIR "/src/ops/ops.h");
  // The reading of ops.h found the ops it must: a reading that found none would pass below.
  for (const char* known : {"embedding_forward", "linear_backward", "fp8_gemm_blocks", "copy_to_host"})
    ASSERT_TRUE(methods.count(known)) << "ops.h's reading missed " << known;
  std::set<std::string> covered;
  for (const test::OpCase& c : test::op_table()) {
    EXPECT_FALSE(c.ops.empty()) << c.name << " names no Ops method";
    for (const std::string& op : c.ops) {
      EXPECT_TRUE(methods.count(op)) << c.name << " names " << op << ", which class Ops does not declare";
      covered.insert(op);
    }
  }
  for (const std::string& method : methods)
    EXPECT_TRUE(covered.count(method)) << "Ops::" << method << " has no case in tests/ops/op_table.cpp";
}

int64_t arg_dim(const test::OpCase& c, const std::string& name, int dim) {
  for (const test::Arg& arg : c.args)
    if (arg.name == name) return arg.shape[dim];
  throw std::logic_error(c.name + " has no argument " + name);
}

bool calls(const test::OpCase& c, const std::string& op) {
  return std::find(c.ops.begin(), c.ops.end(), op) != c.ops.end();
}

// The perf mode's counts: every case moves bytes; a case of GEMMs or attention counts FLOPs,
// an FP8 GEMM or Ops::gemm 2·M·N·K from its arguments' shapes (out [M, N], a_q [M, K], b_q [N, K]), a
// linear layer three GEMMs of 2·T·N·K (out, d_x, d_weight), the experts' grouped linear layers
// three of 2·R·N·K (x [R, K], weight [E, N, K]); the other ops count none.
TEST(OpTableCounts, EachCaseCountsItsBytesAndItsGemmsFlops) {
  for (const test::OpCase& c : test::op_table()) {
    SCOPED_TRACE(c.name);
    EXPECT_GT(test::op_case_bytes(c), 0.0);
    const auto product = [](int64_t m, int64_t n, int64_t k) {
      return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    };
    if (calls(c, "gemm") && calls(c, "quantize")) {  // Ops::gemm of quantized operands
      const int64_t m = arg_dim(c, "out", 0), n = arg_dim(c, "out", 1), k = arg_dim(c, "a_q", 1);
      EXPECT_EQ(c.flops, product(m, n, k));
    } else if (calls(c, "gemm")) {  // of plain ones
      const int64_t m = arg_dim(c, "a", 0), k = arg_dim(c, "a", 1), n = arg_dim(c, "b", 0);
      EXPECT_EQ(c.flops, product(m, n, k));
    } else if (calls(c, "fp8_gemm") || calls(c, "fp8_gemm_blocks")) {
      const int64_t m = arg_dim(c, "out", 0), n = arg_dim(c, "out", 1), k = arg_dim(c, "a_q", 1);
      ASSERT_EQ(arg_dim(c, "a_q", 0), m);
      ASSERT_EQ(arg_dim(c, "b_q", 0), n);
      ASSERT_EQ(arg_dim(c, "b_q", 1), k);
      EXPECT_EQ(c.flops, product(m, n, k));
    } else if (calls(c, "grouped_linear_forward")) {  // three GEMMs of 2·R·N·K over every row
      const int64_t r = arg_dim(c, "x", 0), k = arg_dim(c, "x", 1), n = arg_dim(c, "weight", 1);
      ASSERT_EQ(arg_dim(c, "weight", 2), k);
      EXPECT_EQ(c.flops, 3 * product(r, n, k));
    } else if (calls(c, "lora_up_forward")) {  // each adapter's three GEMMs of 2·T·N_j·r
      const int64_t t = arg_dim(c, "t", 0), width = arg_dim(c, "t", 1);
      std::vector<int64_t> rows;  // each adapter's B [N_j, r], arguments b0, b1, ...
      for (const test::Arg& a : c.args)
        if (a.name == "b" + std::to_string(rows.size())) rows.push_back(a.shape[0]);
      ASSERT_FALSE(rows.empty());
      double flops = 0;
      for (int64_t n : rows) flops += 3 * product(t, n, width / static_cast<int64_t>(rows.size()));
      EXPECT_EQ(c.flops, flops);
    } else if (calls(c, "linear_forward")) {
      const int64_t t = arg_dim(c, "x", 0), k = arg_dim(c, "x", 1), n = arg_dim(c, "weight", 0);
      EXPECT_EQ(c.flops, 3 * product(t, n, k));
    } else if (calls(c, "lm_head_loss") || calls(c, "lm_head_shard_forward") ||
               calls(c, "attention_forward") || calls(c, "attention_context_forward")) {
      EXPECT_GT(c.flops, 0.0);
    } else {
      EXPECT_EQ(c.flops, 0.0) << "an op without a GEMM counts bytes";
    }
  }
}

}  // namespace
}  // namespace loom
