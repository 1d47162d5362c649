#include "ops/op_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <stdexcept>

#include "core/dtype.h"
#include "core/fp8.h"
#include "ops/lora_dropout.h"

namespace loom::test {
namespace {

constexpr float kEps = 1e-6f;
constexpr float kRopeTheta = 1e6f;  // Qwen3's rope_theta
constexpr float kLossScale = 1.0f / 97.0f;

// Qwen3's hidden sizes, 0.6B to 32B.
constexpr int64_t kQwen3Hidden[] = {1024, 2048, 2560, 4096, 5120};

// Arguments: an input, a cotangent (an input the backward reads as d_out), an output.
Arg input(std::string name, Shape shape, float scale = 1.0f, float mean = 0.0f) {
  return {std::move(name), shape, Kind::activation, {Fill::How::normal, mean, scale}};
}
Arg output(std::string name, Shape shape, Tolerance tolerance, Kind kind = Kind::activation, Fill fill = {}) {
  return {std::move(name), shape, kind, fill, true, tolerance};
}
Fill normal(float scale) {
  return {Fill::How::normal, 0.0f, scale};
}
Arg ids(std::string name, int64_t tokens, int64_t vocab, double masked) {
  return {std::move(name), {tokens}, Kind::ids, {Fill::How::ids, 0, 1, vocab, masked}};
}

// A GEMM's FLOPs: out [m, n] = a [m, k] · b [n, k]ᵀ.
double gemm_flops(int64_t m, int64_t n, int64_t k) {
  return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
}

std::string shape_name(std::initializer_list<std::pair<const char*, int64_t>> dims) {
  std::string s;
  for (const auto& [label, size] : dims) s += std::string("_") + label + std::to_string(size);
  return s;
}

RowSpans row_spans(const std::vector<int32_t>& lengths) {
  RowSpans rows{{0}};
  for (int32_t n : lengths) rows.offsets.push_back(rows.offsets.back() + n);
  return rows;
}

std::string rows_name(const std::vector<int32_t>& lengths) {
  std::string s = "_rows";
  for (size_t i = 0; i < lengths.size(); ++i) s += (i ? "x" : "") + std::to_string(lengths[i]);
  return s;
}

std::string heads_name(const HeadLayout& h) {
  return "_heads" + std::to_string(h.q_heads) + "x" + std::to_string(h.kv_heads) + "x" +
         std::to_string(h.head_dim);
}

OpCase rmsnorm(int64_t t, int64_t h) {
  OpCase c;
  c.name = "rmsnorm" + shape_name({{"t", t}, {"h", h}});
  c.ops = {"rmsnorm_forward", "rmsnorm_backward"};
  c.args = {input("x", {t, h}), input("weight", {h}, 0.1f, 1.0f), input("d_out", {t, h}),
            output("out", {t, h}, Tolerance::bf16), output("rstd", {t}, Tolerance::reduced_f32, Kind::f32),
            // The amaxes of out and d_x (ops.h out_amax); test_cuda_fp8 checks their bits
            // against ops.amax.
            output("out_amax", {1}, Tolerance::bf16, Kind::f32),
            // d_x holds the residual stream's gradient, which the backward adds to.
            output("d_x", {t, h}, Tolerance::bf16, Kind::activation, normal(1.0f)),
            output("d_weight", {h}, Tolerance::reduced_f32, Kind::f32),
            output("d_x_amax", {1}, Tolerance::bf16, Kind::f32)};
  c.forward = [](Ops& o, const Args& a) {
    o.rmsnorm_forward(a.at("out"), a.at("rstd"), a.at("x"), a.at("weight"), kEps, a.at("out_amax"));
  };
  c.backward = [](Ops& o, const Args& a) {
    o.rmsnorm_backward(a.at("d_x"), a.at("d_weight"), a.at("d_out"), a.at("x"), a.at("weight"), a.at("rstd"),
                       a.at("d_x_amax"));
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"x", "d_x"}, {"weight", "d_weight"}};
  return c;
}

// Forward only: its backward is rmsnorm_backward on residual_out. The GPU normalises the
// bf16-rounded sum and the CPU the fp32 one, so even rstd is judged at bf16's tolerance.
OpCase residual_rmsnorm(int64_t t, int64_t h) {
  OpCase c;
  c.name = "residual_rmsnorm" + shape_name({{"t", t}, {"h", h}});
  c.ops = {"residual_rmsnorm_forward"};
  c.args = {input("residual", {t, h}),
            input("delta", {t, h}),
            input("weight", {h}, 0.1f, 1.0f),
            output("residual_out", {t, h}, Tolerance::bf16),
            output("out", {t, h}, Tolerance::bf16),
            output("rstd", {t}, Tolerance::bf16, Kind::f32),
            output("out_amax", {1}, Tolerance::bf16, Kind::f32)};
  c.forward = [](Ops& o, const Args& a) {
    o.residual_rmsnorm_forward(a.at("residual_out"), a.at("out"), a.at("rstd"), a.at("residual"),
                               a.at("delta"), a.at("weight"), kEps, a.at("out_amax"));
  };
  c.finite_differences = false;
  return c;
}

// Llama 3.1's RoPE scaling (factor 8, low 1, high 4) with an original context of 16 rather
// than 8,192, so that positions of a few rows reach all three frequency bands.
RopeSpec llama3_rope(float theta) {
  return {theta, true, 8.0f, 1.0f, 4.0f, 16};
}

std::string rope_name(const RopeSpec& rope) {
  return rope.llama3 ? "_llama3" : "";
}

OpCase qk_norm_rope(const std::vector<int32_t>& lengths, HeadLayout heads, RopeSpec rope = {kRopeTheta}) {
  const RowSpans rows = row_spans(lengths);
  const int64_t t = rows.tokens(), nh = heads.total_heads(), hd = heads.head_dim;
  OpCase c;
  c.name = "qk_norm_rope" + rows_name(lengths) + heads_name(heads) + rope_name(rope);
  c.ops = {"qk_norm_rope_forward", "qk_norm_rope_backward"};
  c.args = {input("qkv", {t, nh, hd}),
            input("q_weight", {hd}, 0.1f, 1.0f),
            input("k_weight", {hd}, 0.1f, 1.0f),
            input("d_out", {t, nh, hd}),
            output("out", {t, nh, hd}, Tolerance::bf16),
            output("rstd", {t, heads.q_heads + heads.kv_heads}, Tolerance::reduced_f32, Kind::f32),
            output("d_qkv", {t, nh, hd}, Tolerance::bf16),
            output("d_q_weight", {hd}, Tolerance::rotated_f32, Kind::f32),
            output("d_k_weight", {hd}, Tolerance::rotated_f32, Kind::f32),
            output("d_qkv_amax", {1}, Tolerance::bf16, Kind::f32)};
  c.forward = [=](Ops& o, const Args& a) {
    o.qk_norm_rope_forward(a.at("out"), a.at("rstd"), a.at("qkv"), a.at("q_weight"), a.at("k_weight"), rows,
                           heads, kEps, rope);
  };
  c.backward = [=](Ops& o, const Args& a) {
    o.qk_norm_rope_backward(a.at("d_qkv"), a.at("d_q_weight"), a.at("d_k_weight"), a.at("d_out"), a.at("qkv"),
                            a.at("q_weight"), a.at("k_weight"), a.at("rstd"), rows, heads, rope,
                            a.at("d_qkv_amax"));
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"qkv", "d_qkv"}, {"q_weight", "d_q_weight"}, {"k_weight", "d_k_weight"}};
  c.samples = 64;
  return c;
}

// The same op without q/k norm (Llama, Qwen2, Mistral): RoPE alone, no norm tensors.
OpCase rope_only(const std::vector<int32_t>& lengths, HeadLayout heads, RopeSpec rope) {
  const RowSpans rows = row_spans(lengths);
  const int64_t t = rows.tokens(), nh = heads.total_heads(), hd = heads.head_dim;
  OpCase c;
  c.name = "rope" + rows_name(lengths) + heads_name(heads) + rope_name(rope);
  c.ops = {"qk_norm_rope_forward", "qk_norm_rope_backward"};
  c.args = {input("qkv", {t, nh, hd}), input("d_out", {t, nh, hd}),
            output("out", {t, nh, hd}, Tolerance::bf16), output("d_qkv", {t, nh, hd}, Tolerance::bf16),
            output("d_qkv_amax", {1}, Tolerance::bf16, Kind::f32)};
  c.forward = [=](Ops& o, const Args& a) {
    o.qk_norm_rope_forward(a.at("out"), Tensor{}, a.at("qkv"), Tensor{}, Tensor{}, rows, heads, kEps, rope);
  };
  c.backward = [=](Ops& o, const Args& a) {
    o.qk_norm_rope_backward(a.at("d_qkv"), Tensor{}, Tensor{}, a.at("d_out"), a.at("qkv"), Tensor{}, Tensor{},
                            Tensor{}, rows, heads, rope, a.at("d_qkv_amax"));
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"qkv", "d_qkv"}};
  c.samples = 64;
  return c;
}

// A linear layer's bias (Qwen2's q/k/v) on a projection's output x: out = x + bias.
OpCase bias_add(int64_t t, int64_t n) {
  OpCase c;
  c.name = "bias_add" + shape_name({{"t", t}, {"n", n}});
  c.ops = {"add", "bias_add_forward", "bias_backward"};
  c.args = {input("x", {t, n}),
            {"zeros", {t, n}, Kind::activation, Fill{}},
            input("bias", {n}, 0.1f),
            input("d_out", {t, n}),
            output("out", {t, n}, Tolerance::bf16),
            output("d_bias", {n}, Tolerance::reduced_f32, Kind::f32)};
  // out is rewritten from x on each call: finite differences run the forward many times.
  c.forward = [](Ops& o, const Args& a) {
    o.add(a.at("out"), a.at("x"), a.at("zeros"));
    o.bias_add_forward(a.at("out"), a.at("bias"));
  };
  c.backward = [](Ops& o, const Args& a) { o.bias_backward(a.at("d_bias"), a.at("d_out")); };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"bias", "d_bias"}};
  return c;
}

// On the CPU only: the GPU's attention is judged against a plain bf16 implementation by
// test_cuda_ops' AttentionWithinTwiceThePlainBf16Error, not against the CPU's alone.
OpCase attention(const std::vector<int32_t>& lengths, HeadLayout heads) {
  const RowSpans rows = row_spans(lengths);
  const int64_t t = rows.tokens(), nh = heads.total_heads(), nq = heads.q_heads, hd = heads.head_dim;
  OpCase c;
  c.name = "attention" + rows_name(lengths) + heads_name(heads);
  c.ops = {"attention_forward", "attention_backward"};
  // Causal: a row of L tokens has L(L+1)/2 query-key pairs a query head, each 4·hd FLOPs in
  // the forward (scores and P·V) and 10·hd in the backward (the scores again, dV, dP, dQ, dK).
  double pairs = 0;
  for (int32_t l : lengths) pairs += 0.5 * l * (l + 1.0);
  c.flops = 14.0 * static_cast<double>(hd * nq) * pairs;
  c.args = {input("qkv", {t, nh, hd}), input("d_out", {t, nq, hd}),
            output("out", {t, nq, hd}, Tolerance::bf16),
            output("lse", {nq, t}, Tolerance::reduced_f32, Kind::f32),
            output("d_qkv", {t, nh, hd}, Tolerance::bf16)};
  c.forward = [=](Ops& o, const Args& a) {
    o.attention_forward(a.at("out"), a.at("lse"), a.at("qkv"), rows, heads);
  };
  c.backward = [=](Ops& o, const Args& a) {
    o.attention_backward(a.at("d_qkv"), a.at("d_out"), a.at("out"), a.at("lse"), a.at("qkv"), rows, heads);
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"qkv", "d_qkv"}};
  c.samples = 128;
  c.cuda = false;
  return c;
}

// Context parallelism's attention (ops.h ContextSpans): a CP rank's queries `sources` (their
// indices among the whole micro-batch's `whole_tokens`), each against its span's keys up to
// itself, `spans` being the micro-batch's span offsets. lse is in each backend's own layout
// (ops.h), so it is passed between the forward and backward but not compared; the GPU's
// gradients are judged as attention's (Tolerance::attention_grads).
OpCase attention_context(const std::string& name, int64_t whole_tokens, const std::vector<int32_t>& spans,
                         const std::vector<int32_t>& sources, HeadLayout heads) {
  ContextSpans context;
  for (int32_t q : sources) {
    const auto span = std::upper_bound(spans.begin(), spans.end(), q) - 1;
    context.key_begin.push_back(*span);
    context.key_end.push_back(q + 1);
  }
  const auto t = static_cast<int64_t>(sources.size());
  const int64_t nh = heads.total_heads(), nq = heads.q_heads, hd = heads.head_dim;
  OpCase c;
  c.name = "attention_context_" + name + heads_name(heads);
  c.ops = {"attention_context_forward", "attention_context_backward"};
  double pairs = 0;
  for (size_t i = 0; i < sources.size(); ++i) pairs += context.key_end[i] - context.key_begin[i];
  c.flops = 14.0 * static_cast<double>(hd * nq) * pairs;  // as attention's
  c.args = {input("qkv", {t, nh, hd}),
            input("whole", {whole_tokens, nh, hd}),
            input("d_out", {t, nq, hd}),
            output("out", {t, nq, hd}, Tolerance::bf16),
            {"lse", {nq, t}, Kind::f32, {}},
            output("d_qkv", {t, nh, hd}, Tolerance::attention_grads),
            output("d_whole", {whole_tokens, nh, hd}, Tolerance::attention_grads)};
  c.forward = [=](Ops& o, const Args& a) {
    o.attention_context_forward(a.at("out"), a.at("lse"), a.at("qkv"), a.at("whole"), context, heads);
  };
  c.backward = [=](Ops& o, const Args& a) {
    o.attention_context_backward(a.at("d_qkv"), a.at("d_whole"), a.at("d_out"), a.at("out"), a.at("lse"),
                                 a.at("qkv"), a.at("whole"), context, heads);
  };
  c.loss = {{"out", "d_out"}};
  // Only qkv's q heads and whole's k and v heads are read: the other heads' gradients are 0.
  c.gradients = {{"qkv", "d_qkv"}, {"whole", "d_whole"}};
  c.samples = 128;
  c.cuda = hd % 8 == 0 && hd >= 64;  // cuDNN's SDPA: the head sizes loom's models have
  return c;
}

// Context parallelism's ring form (ops.h attention_block_*): the same queries as
// attention_context against the whole micro-batch's keys in two blocks, `keys` a shuffle of
// [0, whole_tokens) cut after `first_block` keys: each block's attention, merged, then each
// block's backward. A query whose span has no key in a block gets lse −inf from it (the
// shuffle puts some single-key spans' keys all in one block).
OpCase attention_blocks(const std::string& name, int64_t whole_tokens, const std::vector<int32_t>& spans,
                        const std::vector<int32_t>& sources, int64_t first_block, HeadLayout heads) {
  ContextSpans context;
  for (int32_t q : sources) {
    const auto span = std::upper_bound(spans.begin(), spans.end(), q) - 1;
    context.key_begin.push_back(*span);
    context.key_end.push_back(q + 1);
  }
  const auto t = static_cast<int64_t>(sources.size());
  const int64_t nh = heads.total_heads(), nq = heads.q_heads, hd = heads.head_dim, kv = 2 * heads.kv_heads;
  const int64_t second_block = whole_tokens - first_block;
  OpCase c;
  c.name = "attention_blocks_" + name + heads_name(heads);
  c.ops = {"attention_block_forward", "attention_block_merge", "attention_block_backward"};
  c.args = {input("qkv", {t, nh, hd}),
            input("kv0", {first_block, kv, hd}),
            input("kv1", {second_block, kv, hd}),
            {"keys", {whole_tokens}, Kind::ids, {Fill::How::positions, 0, 1, whole_tokens}},
            input("d_out", {t, nq, hd}),
            output("out", {t, nq, hd}, Tolerance::bf16),
            output("lse", {nq, t}, Tolerance::reduced_f32, Kind::f32),
            output("part", {t, nq, hd}, Tolerance::bf16),
            output("part_lse", {nq, t}, Tolerance::reduced_f32, Kind::f32),
            output("d_qkv", {t, nh, hd}, Tolerance::bf16),
            output("d_kv0", {first_block, kv, hd}, Tolerance::bf16),
            output("d_kv1", {second_block, kv, hd}, Tolerance::bf16)};
  c.forward = [=](Ops& o, const Args& a) {
    const Tensor keys = a.at("keys");
    o.attention_block_forward(a.at("out"), a.at("lse"), a.at("qkv"), a.at("kv0"), keys.rows(0, first_block),
                              context, heads);
    o.attention_block_forward(a.at("part"), a.at("part_lse"), a.at("qkv"), a.at("kv1"),
                              keys.rows(first_block, second_block), context, heads);
    o.attention_block_merge(a.at("out"), a.at("lse"), a.at("part"), a.at("part_lse"));
  };
  c.backward = [=](Ops& o, const Args& a) {
    const Tensor keys = a.at("keys");
    o.attention_block_backward(a.at("d_qkv"), a.at("d_kv0"), a.at("d_out"), a.at("out"), a.at("lse"),
                               a.at("qkv"), a.at("kv0"), keys.rows(0, first_block), context, heads);
    o.attention_block_backward(a.at("d_qkv"), a.at("d_kv1"), a.at("d_out"), a.at("out"), a.at("lse"),
                               a.at("qkv"), a.at("kv1"), keys.rows(first_block, second_block), context,
                               heads);
  };
  c.loss = {{"out", "d_out"}};
  // Only qkv's q heads are read: its k and v heads' gradients stay 0.
  c.gradients = {{"qkv", "d_qkv"}, {"kv0", "d_kv0"}, {"kv1", "d_kv1"}};
  c.samples = 128;
  c.cuda = false;
  return c;
}

OpCase swiglu(int64_t t, int64_t f) {
  OpCase c;
  c.name = "swiglu" + shape_name({{"t", t}, {"f", f}});
  c.ops = {"swiglu_forward", "swiglu_backward"};
  c.args = {input("gate_up", {t, 2 * f}, 2.0f),
            input("d_out", {t, f}),
            output("out", {t, f}, Tolerance::bf16),
            output("d_gate_up", {t, 2 * f}, Tolerance::bf16),
            output("out_amax", {1}, Tolerance::bf16, Kind::f32),
            output("d_gate_up_amax", {1}, Tolerance::bf16, Kind::f32)};
  c.forward = [](Ops& o, const Args& a) { o.swiglu_forward(a.at("out"), a.at("gate_up"), a.at("out_amax")); };
  c.backward = [](Ops& o, const Args& a) {
    o.swiglu_backward(a.at("d_gate_up"), a.at("d_out"), a.at("gate_up"), a.at("d_gate_up_amax"));
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"gate_up", "d_gate_up"}};
  return c;
}

// With `bias` (Qwen2's q/k/v): out = x · Wᵀ + bias, the bias in the GEMM's epilogue on CUDA,
// its gradient by bias_backward.
OpCase linear(int64_t t, int64_t k, int64_t n, bool bias = false) {
  OpCase c;
  c.name = (bias ? "linear_bias" : "linear") + shape_name({{"t", t}, {"k", k}, {"n", n}});
  c.ops = {"linear_forward", "linear_backward"};
  if (bias) c.ops.push_back("bias_backward");
  c.flops = 3 * gemm_flops(t, n, k);  // out, d_x and d_weight
  c.args = {input("x", {t, k}), input("weight", {n, k}, 0.05f), input("d_out", {t, n}),
            output("out", {t, n}, Tolerance::gemm_bf16), output("d_x", {t, k}, Tolerance::gemm_bf16),
            // d_weight accumulates: it starts from earlier micro-batches' grads.
            output("d_weight", {n, k}, Tolerance::accumulated_f32, Kind::f32, normal(0.1f))};
  if (bias) {
    c.args.push_back(input("bias", {n}, 0.1f));
    c.args.push_back(output("d_bias", {n}, Tolerance::reduced_f32, Kind::f32));
    c.forward = [](Ops& o, const Args& a) {
      o.linear_forward(a.at("out"), a.at("x"), a.at("weight"), a.at("bias"));
    };
    c.backward = [](Ops& o, const Args& a) {
      o.linear_backward(a.at("d_x"), a.at("d_weight"), a.at("d_out"), a.at("x"), a.at("weight"));
      o.bias_backward(a.at("d_bias"), a.at("d_out"));
    };
    c.gradients = {{"x", "d_x"}, {"weight", "d_weight"}, {"bias", "d_bias"}};
  } else {
    c.forward = [](Ops& o, const Args& a) {
      o.linear_forward(a.at("out"), a.at("x"), a.at("weight"), Tensor{});
    };
    c.backward = [](Ops& o, const Args& a) {
      o.linear_backward(a.at("d_x"), a.at("d_weight"), a.at("d_out"), a.at("x"), a.at("weight"));
    };
    c.gradients = {{"x", "d_x"}, {"weight", "d_weight"}};
  }
  c.loss = {{"out", "d_out"}};
  return c;
}

OpCase embedding(int64_t t, int64_t h, int64_t v) {
  OpCase c;
  c.name = "embedding" + shape_name({{"t", t}, {"h", h}, {"v", v}});
  c.ops = {"embedding_forward", "embedding_backward"};
  c.args = {ids("ids", t, v, 0.0), input("table", {v, h}), input("d_out", {t, h}),
            output("out", {t, h}, Tolerance::exact),
            output("d_table", {v, h}, Tolerance::reduced_f32, Kind::f32, normal(0.1f))};
  c.forward = [](Ops& o, const Args& a) { o.embedding_forward(a.at("out"), a.at("ids"), a.at("table")); };
  c.backward = [](Ops& o, const Args& a) {
    o.embedding_backward(a.at("d_table"), a.at("ids"), a.at("d_out"));
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"table", "d_table"}};
  return c;
}

// The loss of the lm_head: L = grad_scale · Σ nll, so the cotangent of nll is grad_scale
// (d_nll, read by no call: lm_head_loss computes its gradients in the same pass). Weights of
// scale 1.6 / sqrt(h) give logits of scale 1.6 at every hidden size, as a trained model's
// are: bf16 logits of scale 14 would move the softmax's probabilities by several percent.
OpCase lm_head_loss(int64_t t, int64_t h, int64_t v) {
  OpCase c;
  c.name = "lm_head_loss" + shape_name({{"t", t}, {"h", h}, {"v", v}});
  c.ops = {"lm_head_loss"};
  // The forward's logits; the backward's call computes them again, then d_hidden and d_weight.
  c.flops = 4 * gemm_flops(t, v, h);
  const float weight_scale = 1.6f / std::sqrt(static_cast<float>(h));
  c.args = {input("hidden", {t, h}),
            input("weight", {v, h}, weight_scale),
            ids("targets", t, v, 0.3),
            {"d_nll", {t}, Kind::f32, {Fill::How::constant, kLossScale}},
            output("nll", {t}, Tolerance::bf16_logits, Kind::f32),
            output("d_hidden", {t, h}, Tolerance::bf16_logit_grads),
            output("d_weight", {v, h}, Tolerance::bf16_logit_grads, Kind::f32)};
  c.forward = [](Ops& o, const Args& a) {
    o.lm_head_loss(a.at("nll"), Tensor{}, Tensor{}, a.at("hidden"), a.at("weight"), a.at("targets"),
                   kLossScale);
  };
  c.backward = [](Ops& o, const Args& a) {
    o.lm_head_loss(a.at("nll"), a.at("d_hidden"), a.at("d_weight"), a.at("hidden"), a.at("weight"),
                   a.at("targets"), kLossScale);
  };
  c.loss = {{"nll", "d_nll"}};
  c.gradients = {{"hidden", "d_hidden"}, {"weight", "d_weight"}};
  return c;
}

// The vocab-parallel embedding (TP): this rank's rows [begin, begin + shard) of a vocabulary of
// `vocab`; ids outside the shard look up zeros and add no gradient.
OpCase embedding_shard(int64_t t, int64_t h, int64_t vocab, int64_t begin, int64_t shard) {
  OpCase c;
  c.name =
      "embedding_shard" + shape_name({{"t", t}, {"h", h}, {"v", vocab}, {"begin", begin}, {"shard", shard}});
  c.ops = {"embedding_forward_shard", "embedding_backward_shard"};
  c.args = {ids("ids", t, vocab, 0.0), input("table", {shard, h}), input("d_out", {t, h}),
            output("out", {t, h}, Tolerance::exact),
            output("d_table", {shard, h}, Tolerance::reduced_f32, Kind::f32, normal(0.1f))};
  c.forward = [=](Ops& o, const Args& a) {
    o.embedding_forward_shard(a.at("out"), a.at("ids"), a.at("table"), begin);
  };
  c.backward = [=](Ops& o, const Args& a) {
    o.embedding_backward_shard(a.at("d_table"), a.at("ids"), a.at("d_out"), begin);
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"table", "d_table"}};
  return c;
}

// The vocab-parallel loss (TP) over two shards of the vocabulary, [0, split) and [split, v),
// run one after the other as two ranks would, the collectives done by the case: each
// shard's lse into a row of lse_parts (the all-gather), the input gradient's halves added.
// The shards' target logits are combined one at a time, so that no fp32 add is needed:
// nll_r = lse − target_logit_r, and L = grad_scale · Σ (nll_0 + nll_1 − lse) is the loss over
// the whole vocabulary, grad_scale · Σ (lse − target logit), whose gradient the backward gives.
OpCase lm_head_shards(int64_t t, int64_t h, int64_t v, int64_t split) {
  OpCase c;
  c.name = "lm_head_shards" + shape_name({{"t", t}, {"h", h}, {"v", v}, {"split", split}});
  c.ops = {"lm_head_shard_forward", "lm_head_shard_combine", "lm_head_shard_backward", "add"};
  const float weight_scale = 1.6f / std::sqrt(static_cast<float>(h));  // as lm_head_loss's
  c.args = {input("hidden", {t, h}),
            input("weight", {v, h}, weight_scale),
            ids("targets", t, v, 0.3),
            {"d_nll", {t}, Kind::f32, {Fill::How::constant, kLossScale}},
            {"d_lse", {t}, Kind::f32, {Fill::How::constant, -kLossScale}},
            output("lse_parts", {2, t}, Tolerance::bf16_logits, Kind::f32),
            output("target_logit_0", {t}, Tolerance::bf16_logits, Kind::f32),
            output("target_logit_1", {t}, Tolerance::bf16_logits, Kind::f32),
            output("lse", {t}, Tolerance::bf16_logits, Kind::f32),
            output("nll_0", {t}, Tolerance::bf16_logits, Kind::f32),
            output("nll_1", {t}, Tolerance::bf16_logits, Kind::f32),
            output("d_hidden_0", {t, h}, Tolerance::bf16_logit_grads),
            output("d_hidden_1", {t, h}, Tolerance::bf16_logit_grads),
            output("d_hidden", {t, h}, Tolerance::bf16_logit_grads),
            output("d_weight", {v, h}, Tolerance::bf16_logit_grads, Kind::f32)};
  const int64_t begins[] = {0, split}, sizes[] = {split, v - split};
  c.forward = [=](Ops& o, const Args& a) {
    for (int r = 0; r < 2; ++r)
      o.lm_head_shard_forward(a.at("lse_parts").rows(r, 1).reshaped({t}),
                              a.at("target_logit_" + std::to_string(r)), a.at("hidden"),
                              a.at("weight").rows(begins[r], sizes[r]), a.at("targets"), begins[r]);
    for (int r = 0; r < 2; ++r)
      o.lm_head_shard_combine(a.at("nll_" + std::to_string(r)), a.at("lse"), a.at("lse_parts"),
                              a.at("target_logit_" + std::to_string(r)), a.at("targets"));
  };
  c.backward = [=](Ops& o, const Args& a) {
    for (int r = 0; r < 2; ++r)
      o.lm_head_shard_backward(
          a.at("d_hidden_" + std::to_string(r)), a.at("d_weight").rows(begins[r], sizes[r]), a.at("hidden"),
          a.at("weight").rows(begins[r], sizes[r]), a.at("targets"), a.at("lse"), begins[r], kLossScale);
    o.add(a.at("d_hidden"), a.at("d_hidden_0"), a.at("d_hidden_1"));
  };
  c.loss = {{"nll_0", "d_nll"}, {"nll_1", "d_nll"}, {"lse", "d_lse"}};
  c.gradients = {{"hidden", "d_hidden"}, {"weight", "d_weight"}};
  // The forward's logits; the backward's again, then d_hidden and d_weight.
  c.flops = 4 * gemm_flops(t, v, h);
  return c;
}

// An exactly compared output: moves, casts, counts and maxima.
Arg exact(std::string name, Shape shape, Kind kind, Fill fill = {}) {
  return output(std::move(name), shape, Tolerance::exact, kind, fill);
}
Fill constant(float value) {
  return {Fill::How::constant, value};
}
// Values across 24 binades (some flush under an FP8 scale), with or without +inf and NaN.
Fill spread(float scale, bool specials = false) {
  return {Fill::How::spread, 0.0f, scale, 0, 0.0, specials};
}
// What FP8 bytes and inverse scales start as: an op that leaves one unwritten shows (0xff is
// NaN in both formats, and no scale is negative).
const Fill kUnwrittenByte = constant(255);
const Fill kUnwrittenScale = constant(-1);

int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}
Kind fp8_kind(DType format) {
  return format == DType::e5m2 ? Kind::e5m2 : Kind::e4m3;
}
std::string format_name(DType format) {
  return format == DType::e5m2 ? "_e5m2" : "_e4m3";
}

// Gather rows by position, then scatter them back into another tensor (the lm_head's rows
// with a target, decoder.cpp): distinct positions, the other rows of `out` kept.
OpCase gather_scatter_rows(int64_t t, int64_t n, int64_t h) {
  OpCase c;
  c.name = "gather_scatter_rows" + shape_name({{"t", t}, {"n", n}, {"h", h}});
  c.ops = {"gather_rows", "scatter_rows"};
  c.args = {input("x", {t, h}),
            {"index", {n}, Kind::ids, {Fill::How::positions, 0, 1, t}},
            exact("rows", {n, h}, Kind::activation),
            exact("out", {t, h}, Kind::activation, normal(1.0f))};
  c.forward = [](Ops& o, const Args& a) {
    o.gather_rows(a.at("rows"), a.at("x"), a.at("index"));
    o.scatter_rows(a.at("out"), a.at("rows"), a.at("index"));
  };
  // Each moves n rows of bf16 in and out, reading the index.
  c.bytes = 2 * (2.0 * 2 * static_cast<double>(n * h) + 4.0 * static_cast<double>(n));
  return c;
}

// Zeros over an activation, fp32 grads, int64 counters and FP8 bytes (ops.h: any dtype).
OpCase fill_zero(int64_t t, int64_t h) {
  OpCase c;
  c.name = "fill_zero" + shape_name({{"t", t}, {"h", h}});
  c.ops = {"fill_zero"};
  c.args = {exact("x", {t, h}, Kind::activation, normal(1.0f)),
            exact("grads", {t, h}, Kind::f32, normal(1.0f)), exact("counts", {2}, Kind::i64, constant(3)),
            exact("fp8", {t, h}, Kind::e4m3, kUnwrittenByte)};
  c.forward = [](Ops& o, const Args& a) {
    for (const char* name : {"x", "grads", "counts", "fp8"}) o.fill_zero(a.at(name));
  };
  return c;
}

// Σ x of fp32 values of mean 1 (a sum far from zero, judged relatively), handed to the host.
OpCase sum(int64_t n) {
  OpCase c;
  c.name = "sum" + shape_name({{"n", n}});
  c.ops = {"sum"};
  c.args = {{"x", {n}, Kind::f32, {Fill::How::normal, 1.0f, 1.0f}},
            output("total", {1}, Tolerance::reduced_f32, Kind::host)};
  c.forward = [](Ops& o, const Args& a) {
    a.at("total").as<float>()[0] = static_cast<float>(o.sum(a.at("x")));
  };
  return c;
}

OpCase copy_to_host(int64_t t, int64_t h) {
  OpCase c;
  c.name = "copy_to_host" + shape_name({{"t", t}, {"h", h}});
  c.ops = {"copy_to_host"};
  c.args = {{"x", {t, h}, Kind::f32, normal(1.0f)}, exact("host", {t, h}, Kind::host)};
  c.forward = [](Ops& o, const Args& a) { o.copy_to_host(a.at("host").data, a.at("x")); };
  return c;
}

// A host array in, as a load-balancing loss's gradient arrives: the host values land exactly.
OpCase copy_from_host(int64_t n) {
  OpCase c;
  c.name = "copy_from_host" + shape_name({{"n", n}});
  c.ops = {"copy_from_host"};
  c.args = {{"host", {n}, Kind::host, normal(1.0f)}, exact("x", {n}, Kind::f32)};
  c.forward = [](Ops& o, const Args& a) { o.copy_from_host(a.at("x"), a.at("host").data); };
  return c;
}

// Mixture of experts (ops.h): the router, the dispatch order, the permutation of token rows
// into it and back, the weighted combine, and the experts' grouped GEMMs.

// The rows of the sorted (dispatched) tensors: the T·k pairs' and three past them, which the
// ops leave as they were (the sorted tensors may be larger than the dispatch).
int64_t dispatch_rows(int64_t t, int64_t k) {
  return t * k + 3;
}
// Distinct places among the dispatch's rows, one a (token, slot) pair: what moe_sort makes,
// in any order.
Arg dispatch_positions(int64_t t, int64_t k) {
  return {"positions", {t, k}, Kind::ids, {Fill::How::positions, 0, 1, dispatch_rows(t, k)}};
}

// The router over T tokens and E experts, top-k: probs and weights fp32 from the bf16 logits
// (an fp32 softmax on both backends), the ids bit for bit. `balance`: the backward also gets a
// load-balancing loss's d_probs_per_expert, whose finite-difference cotangent of probs is that
// row for every token (d_probs). `ties`: each row's top values tied, which both backends give
// to the lower id; no finite differences there (a tie is where the choice jumps).
OpCase moe_route(int64_t t, int64_t e, int64_t k, bool normalize, bool balance, bool ties = false) {
  OpCase c;
  c.name = std::string("moe_route") + (normalize ? "_normalized" : "") + (balance ? "_balance" : "") +
           (ties ? "_ties" : "") + shape_name({{"t", t}, {"e", e}, {"k", k}});
  c.ops = {"moe_route_forward", "moe_route_backward"};
  c.args = {{"logits", {t, e}, Kind::activation, {Fill::How::logits, 0, 1.0f / 64, 0, 0, ties}},
            {"d_weights", {t, k}, Kind::f32, normal(1.0f)},
            output("probs", {t, e}, Tolerance::reduced_f32, Kind::f32),
            exact("expert_ids", {t, k}, Kind::ids, constant(-1)),
            output("weights", {t, k}, Tolerance::reduced_f32, Kind::f32),
            output("d_logits", {t, e}, Tolerance::bf16)};
  c.loss = {{"weights", "d_weights"}};
  if (balance) {
    c.args.push_back({"d_probs_per_expert", {e}, Kind::f32, normal(1.0f)});
    Fill tiled{Fill::How::tiled};
    tiled.of = "d_probs_per_expert";
    c.args.push_back({"d_probs", {t, e}, Kind::f32, tiled});
    c.loss.push_back({"probs", "d_probs"});
  }
  c.forward = [=](Ops& o, const Args& a) {
    o.moe_route_forward(a.at("expert_ids"), a.at("weights"), a.at("probs"), a.at("logits"), normalize);
  };
  c.backward = [=](Ops& o, const Args& a) {
    o.moe_route_backward(a.at("d_logits"), a.at("d_weights"), balance ? a.at("d_probs_per_expert") : Tensor{},
                         a.at("probs"), a.at("expert_ids"), a.at("weights"), normalize);
  };
  c.gradients = {{"logits", "d_logits"}};
  // As the plan counts them: forward bf16 logits in, fp32 probs, ids and weights out; backward
  // fp32 probs, ids, weights and their gradient in, bf16 d_logits out.
  c.bytes = static_cast<double>(t * (6 * e + 8 * k) + t * (6 * e + 12 * k));
  if (ties) c.finite_differences = false;
  return c;
}

// The dispatch order of T·k pairs over E experts, skewed (some experts take many pairs, some
// none): positions and offsets bit for bit (both start at −1, so a place left unwritten shows).
OpCase moe_sort(int64_t t, int64_t e, int64_t k) {
  OpCase c;
  c.name = "moe_sort" + shape_name({{"t", t}, {"e", e}, {"k", k}});
  c.ops = {"moe_sort"};
  c.args = {{"expert_ids", {t, k}, Kind::ids, {Fill::How::experts, 0, 1, e}},
            exact("positions", {t, k}, Kind::ids, constant(-1)),
            exact("offsets", {e + 1}, Kind::ids, constant(-1))};
  c.forward = [](Ops& o, const Args& a) {
    o.moe_sort(a.at("positions"), a.at("offsets"), a.at("expert_ids"));
  };
  return c;
}

// Token rows [T, H] into the dispatch order and the gradient back, summed over the k slots
// (`accumulate`: onto d_x's value, the residual stream's gradient).
OpCase moe_permute(int64_t t, int64_t h, int64_t k, bool accumulate) {
  const int64_t rows = dispatch_rows(t, k);
  OpCase c;
  c.name = std::string("moe_permute") + (accumulate ? "_accumulate" : "") +
           shape_name({{"t", t}, {"h", h}, {"k", k}});
  c.ops = {"moe_permute", "moe_permute_backward"};
  c.args = {input("x", {t, h}), dispatch_positions(t, k), input("d_sorted", {rows, h}),
            exact("sorted", {rows, h}, Kind::activation, normal(1.0f)),
            output("d_x", {t, h}, Tolerance::bf16, Kind::activation, accumulate ? normal(1.0f) : Fill{})};
  c.forward = [](Ops& o, const Args& a) { o.moe_permute(a.at("sorted"), a.at("x"), a.at("positions")); };
  c.backward = [=](Ops& o, const Args& a) {
    o.moe_permute_backward(a.at("d_x"), a.at("d_sorted"), a.at("positions"), accumulate);
  };
  c.loss = {{"sorted", "d_sorted"}};
  c.gradients = {{"x", "d_x"}};
  // Forward: x and the positions read, T·k rows written; backward: the positions and T·k rows
  // read (d_x too when accumulating), T rows written.
  const double row = 2.0 * static_cast<double>(h), places = 4.0 * static_cast<double>(t * k);
  c.bytes = places + static_cast<double>(t + t * k) * row + places +
            static_cast<double>(t * k + (accumulate ? 2 : 1) * t) * row;
  return c;
}

// The experts' output rows [≥ T·k, H] summed per token by the router's weights, and its
// backward: d_y rows and the weights' gradient (fp32 dot products of bf16 rows).
OpCase moe_combine(int64_t t, int64_t h, int64_t k) {
  const int64_t rows = dispatch_rows(t, k);
  OpCase c;
  c.name = "moe_combine" + shape_name({{"t", t}, {"h", h}, {"k", k}});
  c.ops = {"moe_combine_forward", "moe_combine_backward"};
  c.args = {input("y", {rows, h}),
            dispatch_positions(t, k),
            {"weights", {t, k}, Kind::f32, {Fill::How::normal, 0.3f, 0.2f}},
            input("d_out", {t, h}),
            output("out", {t, h}, Tolerance::bf16),
            output("d_y", {rows, h}, Tolerance::bf16),
            output("d_weights", {t, k}, Tolerance::reduced_f32, Kind::f32)};
  c.forward = [](Ops& o, const Args& a) {
    o.moe_combine_forward(a.at("out"), a.at("y"), a.at("positions"), a.at("weights"));
  };
  c.backward = [](Ops& o, const Args& a) {
    o.moe_combine_backward(a.at("d_y"), a.at("d_weights"), a.at("d_out"), a.at("y"), a.at("positions"),
                           a.at("weights"));
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"y", "d_y"}, {"weights", "d_weights"}};
  // Forward: T·k rows of y read, T rows written; backward: T rows of d_out and T·k of y read,
  // T·k of d_y written; the positions and weights (and d_weights) besides.
  const double row = 2.0 * static_cast<double>(h), pair = static_cast<double>(t * k);
  c.bytes = (pair + static_cast<double>(t)) * row + 8.0 * pair + (2 * pair + static_cast<double>(t)) * row +
            12.0 * pair;
  return c;
}

// The experts' linear layers over R rows grouped by expert (E experts, weight [E, N, K]),
// skewed, the first and last experts and some others without rows, `unrouted` of the rows
// past offsets[E] (neither read nor written). d_weight accumulates onto earlier grads.
OpCase grouped_linear(int64_t r, int64_t e, int64_t n, int64_t k, double unrouted = 0.0) {
  OpCase c;
  c.name = "grouped_linear" + shape_name({{"r", r}, {"e", e}, {"n", n}, {"k", k}}) +
           (unrouted > 0 ? "_unrouted" : "");
  c.ops = {"grouped_linear_forward", "grouped_linear_backward"};
  c.args = {input("x", {r, k}),
            input("weight", {e, n, k}, 0.05f),
            {"offsets", {e + 1}, Kind::ids, {Fill::How::offsets, 0, 1, r, unrouted}},
            input("d_out", {r, n}),
            output("out", {r, n}, Tolerance::gemm_bf16),
            output("d_x", {r, k}, Tolerance::gemm_bf16),
            output("d_weight", {e, n, k}, Tolerance::accumulated_f32, Kind::f32, normal(0.1f))};
  c.forward = [](Ops& o, const Args& a) {
    o.grouped_linear_forward(a.at("out"), a.at("x"), a.at("weight"), a.at("offsets"));
  };
  c.backward = [](Ops& o, const Args& a) {
    o.grouped_linear_backward(a.at("d_x"), a.at("d_weight"), a.at("d_out"), a.at("x"), a.at("weight"),
                              a.at("offsets"));
  };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"x", "d_x"}, {"weight", "d_weight"}};
  c.flops = 3 * gemm_flops(r, n, k);  // out, d_x and d_weight, every row counted as the plan counts
  return c;
}

// LoRA's up-projections into a fused layer's output [t, n] from t's J adapters of rank r (the
// down-projections side by side), adapter j's B [rows_j, r] adding into columns [column_j,
// column_j + rows_j) of out, which starts as the frozen layer's output `base` (copied in by
// the forward: the finite differences run it again and again); d_B accumulates.
OpCase lora_up(int64_t t, int64_t n, int64_t r, const std::vector<std::pair<int64_t, int64_t>>& windows) {
  OpCase c;
  c.name =
      "lora_up" + shape_name({{"t", t}, {"n", n}, {"r", r}, {"j", static_cast<int64_t>(windows.size())}});
  c.ops = {"fill_zero", "add", "lora_up_forward", "lora_up_backward"};
  const auto width = static_cast<int64_t>(windows.size()) * r;
  c.args = {input("t", {t, width}), input("base", {t, n}), input("d_out", {t, n}),
            output("out", {t, n}, Tolerance::gemm_bf16), output("d_t", {t, width}, Tolerance::gemm_bf16)};
  for (size_t j = 0; j < windows.size(); ++j) {
    const std::string id = std::to_string(j);
    c.args.push_back(input("b" + id, {windows[j].second, r}, 0.05f));
    c.args.push_back(
        output("d_b" + id, {windows[j].second, r}, Tolerance::accumulated_f32, Kind::f32, normal(0.1f)));
    c.gradients.emplace_back("b" + id, "d_b" + id);
    c.flops += 3 * gemm_flops(t, windows[j].second, r);
  }
  const auto adapters = [windows](const Args& a, bool grads) {
    std::vector<LoraUp> out;
    for (size_t j = 0; j < windows.size(); ++j) {
      const std::string id = std::to_string(j);
      out.push_back({a.at("b" + id), grads ? a.at("d_b" + id) : Tensor{}, windows[j].first});
    }
    return out;
  };
  constexpr float kScale = 2.0f;  // alpha / r
  c.forward = [adapters](Ops& o, const Args& a) {
    o.fill_zero(a.at("out"));
    o.add(a.at("out"), a.at("base"), a.at("out"));
    o.lora_up_forward(a.at("out"), a.at("t"), adapters(a, false), kScale);
  };
  c.backward = [adapters](Ops& o, const Args& a) {
    o.lora_up_backward(a.at("d_t"), a.at("d_out"), a.at("t"), adapters(a, true), kScale);
  };
  c.loss = {{"out", "d_out"}};
  c.gradients.emplace_back("t", "d_t");
  return c;
}

// LoRA dropout at p over an adapter's input x [t, k] whose first column is column
// `feature_begin` of the layer's (a row-parallel TP shard's), the tokens' (row, index) pairs
// random: out = x ⊙ m / (1 − p); the backward d_x += d_out ⊙ m / (1 − p), onto a start. The CPU
// twin and the kernel draw the mask each (ops/lora_dropout.h): one bit apart, an output value
// would be off by all of it.
OpCase lora_dropout(int64_t t, int64_t k, int percent, int64_t feature_begin) {
  OpCase c;
  c.name = "lora_dropout" + shape_name({{"t", t}, {"k", k}, {"p", percent}, {"f", feature_begin}});
  c.ops = {"lora_dropout"};
  c.args = {input("x", {t, k}),
            {"tokens", {t, 2}, Kind::ids, {Fill::How::ids, 0, 1, 8192, 0.0}},
            input("d_out", {t, k}),
            output("out", {t, k}, Tolerance::bf16),
            output("d_x", {t, k}, Tolerance::bf16, Kind::activation, normal(1.0f))};
  const double p = percent / 100.0;
  const auto mask = [=](const Args& a) {
    LoraDropoutMask m;
    m.stream = lora_dropout_stream(1234, 7, 3, 2);
    m.threshold = lora_dropout_threshold(p);
    m.scale = static_cast<float>(1.0 / (1.0 - p));
    m.tokens = a.at("tokens");
    m.feature_begin = feature_begin;
    return m;
  };
  c.forward = [mask](Ops& o, const Args& a) { o.lora_dropout(a.at("out"), a.at("x"), mask(a), false); };
  c.backward = [mask](Ops& o, const Args& a) { o.lora_dropout(a.at("d_x"), a.at("d_out"), mask(a), true); };
  c.loss = {{"out", "d_out"}};
  c.gradients = {{"x", "d_x"}};
  return c;
}

// Column sums of fp32 [R, C] of mean 1 (sums far from zero, judged relatively): the router's
// probs per expert.
OpCase column_sum(int64_t r, int64_t cols) {
  OpCase c;
  c.name = "column_sum" + shape_name({{"r", r}, {"c", cols}});
  c.ops = {"column_sum"};
  c.args = {{"x", {r, cols}, Kind::f32, {Fill::How::normal, 1.0f, 1.0f}},
            output("out", {cols}, Tolerance::reduced_f32, Kind::f32)};
  c.forward = [](Ops& o, const Args& a) { o.column_sum(a.at("out"), a.at("x")); };
  return c;
}

// FP8 (ops.h, "FP8 GEMM pieces"). Casts and censuses are compared bit for bit (the CPU twin
// emulates the same rounding, core/fp8.h); GEMMs by Tolerance::fp8_gemm.

OpCase amax(int64_t t, int64_t h, Kind kind, bool specials) {
  OpCase c;
  c.name = std::string("amax") + (kind == Kind::f32 ? "_f32" : "") + (specials ? "_inf_nan" : "") +
           shape_name({{"t", t}, {"h", h}});
  c.ops = {"amax"};
  c.args = {{"x", {t, h}, kind, spread(1.0f, specials)}, exact("amax", {1}, Kind::f32, constant(-1))};
  c.forward = [](Ops& o, const Args& a) { o.amax(a.at("amax"), a.at("x")); };
  return c;
}

// Tensor scaling's cast under the amax of x, both orientations; out_t's columns padded to 16
// (the weight gradient's K, as the FP8 layer pads the tokens), the pad written 0.
OpCase fp8_cast(int64_t t, int64_t h, DType format) {
  OpCase c;
  c.name = "fp8_cast" + format_name(format) + shape_name({{"t", t}, {"h", h}});
  c.ops = {"amax", "fp8_cast"};
  c.args = {{"x", {t, h}, Kind::activation, spread(1.0f)},
            exact("amax", {1}, Kind::f32),
            exact("out", {t, h}, fp8_kind(format), kUnwrittenByte),
            exact("out_t", {h, round_up(t, 16)}, fp8_kind(format), kUnwrittenByte),
            exact("scale_inv", {1}, Kind::f32, kUnwrittenScale)};
  c.setup = [](Ops& o, const Args& a) { o.amax(a.at("amax"), a.at("x")); };
  c.forward = [=](Ops& o, const Args& a) {
    o.fp8_cast(a.at("out"), a.at("out_t"), a.at("scale_inv"), a.at("x"), a.at("amax"), format);
  };
  return c;
}

// An operand of a tensor-scaled FP8 GEMM, cast from the activation `name` [rows, cols] under
// its amax: the GEMM reads the cast's out, or its out_t [cols, rows padded to 16]
// (`transposed`: a weight's transpose for the input gradient, or the weight gradient's
// operands, which sum over the tokens). Arguments: name, name_amax, name_q (what the GEMM
// reads), name_scale_inv.
struct Fp8Operand {
  int64_t rows, cols;
  DType format;
  bool transposed;
  float scale;
  Shape gemm_shape() const { return transposed ? Shape{cols, round_up(rows, 16)} : Shape{rows, cols}; }
};

void add_fp8_operand(OpCase& c, const std::string& name, const Fp8Operand& x) {
  c.args.push_back(input(name, {x.rows, x.cols}, x.scale));
  c.args.push_back(exact(name + "_amax", {1}, Kind::f32));
  c.args.push_back(exact(name + "_q", x.gemm_shape(), fp8_kind(x.format), kUnwrittenByte));
  c.args.push_back(exact(name + "_scale_inv", {1}, Kind::f32, kUnwrittenScale));
}

void cast_fp8_operand(Ops& o, const Args& a, const std::string& name, const Fp8Operand& x) {
  const Tensor amax = a.at(name + "_amax"), q = a.at(name + "_q");
  o.amax(amax, a.at(name));
  o.fp8_cast(x.transposed ? Tensor{} : q, x.transposed ? q : Tensor{}, a.at(name + "_scale_inv"), a.at(name),
             amax, x.format);
}

// An FP8 GEMM's out [m, n] from the operands cast from "a" and "b": activations, or with
// `accumulate` fp32 main grads that already hold earlier micro-batches' sums.
Arg fp8_gemm_out(int64_t m, int64_t n, bool accumulate) {
  Arg out = output("out", {m, n}, Tolerance::fp8_gemm, accumulate ? Kind::f32 : Kind::activation,
                   accumulate ? normal(0.1f) : Fill{});
  out.operands = {"a", "b"};
  return out;
}

// The FP8 linear layer's GEMMs (model/linear.h): out [m, n] = a_q [m, k] · b_q [n, k]ᵀ, the
// operands cast in setup. accumulate: the weight gradient, added into fp32 main grads.
OpCase fp8_gemm(const std::string& form, const Fp8Operand& a, const Fp8Operand& b, bool accumulate,
                bool fast) {
  const Shape as = a.gemm_shape(), bs = b.gemm_shape();
  const int64_t m = as[0], k = as[1], n = bs[0];
  OpCase c;
  c.name = "fp8_gemm_" + form + shape_name({{"m", m}, {"n", n}, {"k", k}});
  c.ops = {"amax", "fp8_cast", "fp8_gemm"};
  add_fp8_operand(c, "a", a);
  add_fp8_operand(c, "b", b);
  c.args.push_back(fp8_gemm_out(m, n, accumulate));
  c.setup = [=](Ops& o, const Args& args) {
    cast_fp8_operand(o, args, "a", a);
    cast_fp8_operand(o, args, "b", b);
  };
  c.forward = [=](Ops& o, const Args& args) {
    o.fp8_gemm(args.at("out"), args.at("a_q"), args.at("a_scale_inv"), args.at("b_q"), args.at("b_scale_inv"),
               accumulate, fast);
  };
  c.flops = gemm_flops(m, n, k);
  return c;
}

// Block scaling's casts, each over x [rows, cols]: rows (1 × 128 along a row), columns (xᵀ,
// 1 × 128 along the tokens, padded to 128), blocks (128 × 128, both orientations). The
// 128 × 128 scales' rows are padded to 4, the pad written 0.
enum class BlockCast { rows, columns, blocks, blocks_transposed };

const char* block_cast_op(BlockCast cast) {
  switch (cast) {
    case BlockCast::rows: return "fp8_cast_rows";
    case BlockCast::columns: return "fp8_cast_columns";
    case BlockCast::blocks:
    case BlockCast::blocks_transposed: return "fp8_cast_blocks";
  }
  return "?";
}

// A block-scaled operand cast from the activation `name` [rows, cols]. The GEMM reads name_q
// with name_scale_inv: for rows and blocks the cast's out, for columns its out_t [cols, rows
// padded to 128], for blocks_transposed the 128 × 128 cast's out_t (the input gradient's Wᵀ);
// name_other and name_other_scale_inv hold the 128 × 128 cast's other orientation.
struct BlockOperand {
  int64_t rows, cols;
  DType format;
  BlockCast cast;
  float scale = 1.0f;
  Shape gemm_shape() const {
    switch (cast) {
      case BlockCast::rows:
      case BlockCast::blocks: return {rows, cols};
      case BlockCast::columns: return {cols, round_up(rows, kFp8BlockSize)};
      case BlockCast::blocks_transposed: return {cols, rows};
    }
    return {};
  }
  Fp8Blocks blocks() const {
    return cast == BlockCast::rows || cast == BlockCast::columns ? Fp8Blocks::vec128
                                                                 : Fp8Blocks::block128x128;
  }
  bool square() const { return blocks() == Fp8Blocks::block128x128; }
};

void add_block_operand(OpCase& c, const std::string& name, const BlockOperand& x, Fill fill) {
  const Shape g = x.gemm_shape();
  c.args.push_back({name, {x.rows, x.cols}, Kind::activation, fill});
  c.args.push_back(exact(name + "_q", g, fp8_kind(x.format), kUnwrittenByte));
  c.args.push_back(
      exact(name + "_scale_inv", fp8_block_scales_shape(x.blocks(), g[0], g[1]), Kind::f32, kUnwrittenScale));
  if (x.square()) {
    c.args.push_back(exact(name + "_other", {g[1], g[0]}, fp8_kind(x.format), kUnwrittenByte));
    c.args.push_back(exact(name + "_other_scale_inv",
                           fp8_block_scales_shape(Fp8Blocks::block128x128, g[1], g[0]), Kind::f32,
                           kUnwrittenScale));
  }
}

void cast_block_operand(Ops& o, const Args& a, const std::string& name, const BlockOperand& x) {
  const Tensor src = a.at(name), q = a.at(name + "_q"), inv = a.at(name + "_scale_inv");
  switch (x.cast) {
    case BlockCast::rows: o.fp8_cast_rows(q, inv, src, x.format); break;
    case BlockCast::columns: o.fp8_cast_columns(q, inv, src, x.format); break;
    case BlockCast::blocks:
      o.fp8_cast_blocks(q, a.at(name + "_other"), inv, a.at(name + "_other_scale_inv"), src, x.format);
      break;
    case BlockCast::blocks_transposed:
      o.fp8_cast_blocks(a.at(name + "_other"), q, a.at(name + "_other_scale_inv"), inv, src, x.format);
      break;
  }
}

// One block cast alone, over values across 24 binades with +inf and NaN (the block that
// holds the inf takes scale 1).
OpCase fp8_block_cast(BlockCast cast, int64_t rows, int64_t cols, DType format) {
  const BlockOperand x{rows, cols, format, cast};
  OpCase c;
  c.name = std::string(block_cast_op(cast)) + format_name(format) + shape_name({{"r", rows}, {"c", cols}});
  c.ops = {block_cast_op(cast)};
  add_block_operand(c, "x", x, spread(1.0f, true));
  c.forward = [=](Ops& o, const Args& a) { cast_block_operand(o, a, "x", x); };
  return c;
}

// The block-scaled linear layer's GEMMs: out [m, n] = Σ over K's blocks of a_q · b_qᵀ and
// their scales, the operands cast in setup.
OpCase fp8_gemm_blocks(const std::string& form, const BlockOperand& a, const BlockOperand& b,
                       bool accumulate) {
  const Shape as = a.gemm_shape(), bs = b.gemm_shape();
  const int64_t m = as[0], k = as[1], n = bs[0];
  OpCase c;
  c.name = "fp8_gemm_blocks_" + form + shape_name({{"m", m}, {"n", n}, {"k", k}});
  c.ops = {block_cast_op(a.cast), block_cast_op(b.cast), "fp8_gemm_blocks"};
  add_block_operand(c, "a", a, normal(a.scale));
  add_block_operand(c, "b", b, normal(b.scale));
  c.args.push_back(fp8_gemm_out(m, n, accumulate));
  c.setup = [=](Ops& o, const Args& args) {
    cast_block_operand(o, args, "a", a);
    cast_block_operand(o, args, "b", b);
  };
  c.forward = [=](Ops& o, const Args& args) {
    o.fp8_gemm_blocks(args.at("out"), args.at("a_q"), args.at("a_scale_inv"), a.blocks(), args.at("b_q"),
                      args.at("b_scale_inv"), b.blocks(), accumulate);
  };
  c.flops = gemm_flops(m, n, k);
  return c;
}

// The census of a cast (tensor scaling when `blocks` is empty): values across 24 binades
// (some flush) with +inf (clamped) and NaN (neither); the counters start at 3 and the amax at
// 2, which the census adds to and maxes into.
OpCase fp8_census(int64_t r, int64_t c_cols, std::optional<Fp8Blocks> blocks, DType format) {
  OpCase c;
  const std::string layout = !blocks ? "tensor" : *blocks == Fp8Blocks::vec128 ? "rows" : "blocks";
  c.name = "fp8_census_" + layout + format_name(format) + shape_name({{"r", r}, {"c", c_cols}});
  c.args = {exact("counts", {2}, Kind::i64, constant(3)), exact("most", {1}, Kind::f32, constant(2))};
  if (!blocks) {
    c.ops = {"amax", "fp8_cast", "fp8_census"};
    c.args.push_back({"x", {r, c_cols}, Kind::activation, spread(1.0f, true)});
    c.args.push_back(exact("x_amax", {1}, Kind::f32));
    c.args.push_back(exact("x_q", {r, c_cols}, fp8_kind(format), kUnwrittenByte));
    c.args.push_back(exact("x_scale_inv", {1}, Kind::f32, kUnwrittenScale));
    c.setup = [=](Ops& o, const Args& a) {
      o.amax(a.at("x_amax"), a.at("x"));
      o.fp8_cast(a.at("x_q"), Tensor{}, a.at("x_scale_inv"), a.at("x"), a.at("x_amax"), format);
    };
  } else {
    const BlockOperand x{r, c_cols, format,
                         *blocks == Fp8Blocks::vec128 ? BlockCast::rows : BlockCast::blocks};
    c.ops = {block_cast_op(x.cast), "fp8_census"};
    add_block_operand(c, "x", x, spread(1.0f, true));
    c.setup = [=](Ops& o, const Args& a) { cast_block_operand(o, a, "x", x); };
  }
  c.forward = [=](Ops& o, const Args& a) {
    o.fp8_census(a.at("counts"), a.at("most"), a.at("x"), a.at("x_q"), a.at("x_scale_inv"), blocks);
  };
  return c;
}

// Ops::quantize and Ops::gemm: the two calls the FP8 linear layer makes (model/linear.h), each
// a composition of the kernels above on a QuantizedTensor (core/quantized_tensor.h).

// The quantized value of the arguments `name`_q (and `name`_other, `name`_amax) of a tensor
// or block operand, as the layer makes it.
QuantizedTensor tensor_operand_value(const Args& a, const std::string& name, const Fp8Operand& x) {
  QuantizedTensor q;
  q.format = x.format;
  (x.transposed ? q.data_t : q.data) = a.at(name + "_q");
  q.scale_inv = q.scale_inv_t = a.at(name + "_scale_inv");
  q.amax = a.at(name + "_amax");
  return q;
}
QuantizedTensor block_operand_value(const Args& a, const std::string& name, const BlockOperand& x) {
  QuantizedTensor q;
  q.scaling = Fp8Scaling::block;
  q.format = x.format;
  q.blocks = q.blocks_t = x.blocks();
  switch (x.cast) {
    case BlockCast::rows: q.data = a.at(name + "_q"), q.scale_inv = a.at(name + "_scale_inv"); break;
    case BlockCast::columns: q.data_t = a.at(name + "_q"), q.scale_inv_t = a.at(name + "_scale_inv"); break;
    case BlockCast::blocks:
      q.data = a.at(name + "_q"), q.scale_inv = a.at(name + "_scale_inv");
      q.data_t = a.at(name + "_other"), q.scale_inv_t = a.at(name + "_other_scale_inv");
      break;
    case BlockCast::blocks_transposed:
      q.data = a.at(name + "_other"), q.scale_inv = a.at(name + "_other_scale_inv");
      q.data_t = a.at(name + "_q"), q.scale_inv_t = a.at(name + "_scale_inv");
      break;
  }
  return q;
}

// quantize of x [t, h] as the layer's output gradient is: both orientations, the transpose
// padded (to 16 under tensor scaling, 128 under block scaling), the amax from a pass.
OpCase quantize(int64_t t, int64_t h, Fp8Scaling scaling, DType format) {
  const bool tensor = scaling == Fp8Scaling::tensor;
  const int64_t padded = round_up(t, tensor ? 16 : kFp8BlockSize);
  OpCase c;
  c.name = std::string("quantize_") + (tensor ? "tensor" : "blocks") + format_name(format) +
           shape_name({{"t", t}, {"h", h}});
  c.ops = {"quantize"};
  c.args = {{"x", {t, h}, Kind::activation, spread(1.0f)},
            exact("data", {t, h}, fp8_kind(format), kUnwrittenByte),
            exact("data_t", {h, padded}, fp8_kind(format), kUnwrittenByte)};
  if (tensor) {
    c.args.push_back(exact("amax", {1}, Kind::f32, constant(-1)));
    c.args.push_back(exact("scale_inv", {1}, Kind::f32, kUnwrittenScale));
  } else {
    c.args.push_back(
        exact("scale_inv", fp8_block_scales_shape(Fp8Blocks::vec128, t, h), Kind::f32, kUnwrittenScale));
    c.args.push_back(exact("scale_inv_t", fp8_block_scales_shape(Fp8Blocks::vec128, h, padded), Kind::f32,
                           kUnwrittenScale));
  }
  c.forward = [=](Ops& o, const Args& a) {
    QuantizedTensor q;
    q.scaling = scaling;
    q.format = format;
    q.data = a.at("data");
    q.data_t = a.at("data_t");
    q.scale_inv = a.at("scale_inv");
    q.scale_inv_t = tensor ? q.scale_inv : a.at("scale_inv_t");
    if (tensor) q.amax = a.at("amax");
    o.quantize(q, a.at("x"), false);
  };
  return c;
}

// gemm of plain operands: out = a · bᵀ in the activation dtype.
OpCase gemm_plain(int64_t m, int64_t n, int64_t k) {
  OpCase c;
  c.name = "gemm_plain" + shape_name({{"m", m}, {"n", n}, {"k", k}});
  c.ops = {"gemm"};
  c.args = {input("a", {m, k}), input("b", {n, k}, 0.02f), output("out", {m, n}, Tolerance::gemm_bf16)};
  c.forward = [](Ops& o, const Args& a) {
    o.gemm(a.at("out"), GemmOperand{a.at("a"), {}, {}}, GemmOperand{a.at("b"), {}, {}}, false, false);
  };
  c.flops = gemm_flops(m, n, k);
  return c;
}

// gemm of tensor-scaled operands, quantized in setup: the fp8_gemm case through the layer's calls.
OpCase gemm_tensor(const std::string& form, const Fp8Operand& a, const Fp8Operand& b, bool accumulate,
                   bool fast) {
  OpCase c = fp8_gemm(form, a, b, accumulate, fast);
  c.name = "gemm_tensor_" + c.name.substr(std::string("fp8_gemm_").size());
  c.ops = {"quantize", "gemm"};
  c.setup = [=](Ops& o, const Args& args) {
    for (const auto& [name, x] : {std::pair{std::string("a"), a}, std::pair{std::string("b"), b}}) {
      QuantizedTensor q = tensor_operand_value(args, name, x);
      o.quantize(q, args.at(name), false);
    }
  };
  c.forward = [=](Ops& o, const Args& args) {
    const auto oriented = [&](const std::string& name, const Fp8Operand& x) {
      const QuantizedTensor q = tensor_operand_value(args, name, x);
      return x.transposed ? q.transposed() : q.operand();
    };
    o.gemm(args.at("out"), oriented("a", a), oriented("b", b), accumulate, fast);
  };
  return c;
}

// gemm of block-scaled operands, quantized in setup: the fp8_gemm_blocks case through the
// layer's calls.
OpCase gemm_blocks(const std::string& form, const BlockOperand& a, const BlockOperand& b, bool accumulate) {
  OpCase c = fp8_gemm_blocks(form, a, b, accumulate);
  c.name = "gemm_blocks_" + c.name.substr(std::string("fp8_gemm_blocks_").size());
  c.ops = {"quantize", "gemm"};
  c.setup = [=](Ops& o, const Args& args) {
    for (const auto& [name, x] : {std::pair{std::string("a"), a}, std::pair{std::string("b"), b}}) {
      QuantizedTensor q = block_operand_value(args, name, x);
      o.quantize(q, args.at(name), false);
    }
  };
  c.forward = [=](Ops& o, const Args& args) {
    const auto oriented = [&](const std::string& name, const BlockOperand& x) {
      const QuantizedTensor q = block_operand_value(args, name, x);
      return x.cast == BlockCast::columns || x.cast == BlockCast::blocks_transposed ? q.transposed()
                                                                                    : q.operand();
    };
    o.gemm(args.at("out"), oriented("a", a), oriented("b", b), accumulate, false);
  };
  return c;
}

// The case with frozen weights (LoRA's base): their gradient arguments passed to the backward
// empty, so that it forms no weight gradient and leaves those arguments as they started.
OpCase frozen(OpCase c, std::vector<std::string> weight_grads) {
  c.name += "_frozen";
  c.backward = [backward = c.backward, weight_grads](Ops& o, const Args& a) {
    Args without = a;
    for (const std::string& g : weight_grads) without[g] = Tensor{};
    backward(o, without);
  };
  std::erase_if(c.gradients, [&](const auto& pair) {
    return std::find(weight_grads.begin(), weight_grads.end(), pair.second) != weight_grads.end();
  });
  return c;
}

OpCase gpu_only(OpCase c) {
  c.finite_differences = false;
  return c;
}
OpCase cpu_only(OpCase c) {
  c.cuda = false;
  return c;
}
// Timed on the GPU, never run on the CPU: a model's size that the CPU twin would take minutes over.
OpCase perf_only(OpCase c) {
  c.finite_differences = false;
  c.compared = false;
  return c;
}

float round_bf16(float x) {
  return bf16_to_float(float_to_bf16(x));
}

}  // namespace

double tolerance(Tolerance tolerance, const std::vector<float>& reference) {
  switch (tolerance) {
    case Tolerance::exact: return 0.0;
    // bf16 keeps 8 bits: rounding the output alone is ~3e-3.
    case Tolerance::bf16: return 8e-3;
    // fp32 summation order only.
    case Tolerance::reduced_f32: return 1e-4;
    // The products of sin and cos of large angles (positions · theta^(-2i/hd)) round apart.
    case Tolerance::rotated_f32: return 1e-3;
    case Tolerance::accumulated_f32: return 1e-5;
    // Twice the error of a plain bf16 GEMM (the fp32 result rounded to bf16), FlashAttention's
    // judge; 1e-5 for outputs that round almost exactly.
    case Tolerance::gemm_bf16: {
      double err = 0, norm = 0;
      for (float r : reference) {
        err += (static_cast<double>(round_bf16(r)) - r) * (static_cast<double>(round_bf16(r)) - r);
        norm += static_cast<double>(r) * r;
      }
      return 2 * (norm > 0 ? std::sqrt(err / norm) : 0.0) + 1e-5;
    }
    // bf16 logits of magnitude ~1 shift each nll by ~2^-9.
    case Tolerance::bf16_logits: return 5e-3;
    // bf16's error on the logits' gradients, through one more GEMM.
    case Tolerance::bf16_logit_grads: return 2 * 8e-3;
    // A flash attention's backward rounds P, dP and dS to bf16 before its GEMMs (the plain
    // bf16 implementation of test_cuda_ops, which judges the row attention at twice its error):
    // twice bf16's bound, until the device's first run of the context cases says more.
    case Tolerance::attention_grads: return 2 * 8e-3;
    case Tolerance::fp8_gemm: throw std::logic_error("an FP8 GEMM's tolerance needs its operands");
  }
  throw std::logic_error("unknown tolerance class");
}

// An FP8 GEMM's output. Both backends multiply the same FP8 operands (the casts' outputs,
// compared bit for bit), so the quantization error is the same on both and cancels; what
// differs is how they sum the products p_k = â_k · b̂_k (each exact in fp32: two FP8
// significands of at most 4 bits) and how the output is rounded. Hopper's FP8 MMA adds
// products in an accumulator of about 14 significant bits before they reach fp32 (DeepSeek-V3's
// report, 3.3.2; with fast accumulation over more of K): an addition rounds off up to 2^-14 of
// what the sum holds. Those errors have random signs, so over K products they come to about
// 2^-14 · Σ_k |p_k| (K times that is the worst case, all of one sign, not met by these
// data); the CPU's fp32 sums to 2^-24 of it. We allow 2^-13 · Σ_k |â_ik| |b̂_jk| an output,
// and over all of them, by Cauchy–Schwarz (Σ_k |â_ik| |b̂_jk| ≤ ‖â_i‖ ‖b̂_j‖),
// 2^-13 · ‖A‖ ‖B‖, the operands' Frobenius norms: those of the sources, from which the FP8
// operands differ by their quantization error (a few percent, inside the factor 2 over
// 2^-14). A wrong scale, block or stretch of K is off by the order of the output itself.
// On top, the output's rounding: a bf16 one as a bf16 GEMM's (gemm_bf16), fp32 as
// accumulated_f32.
double fp8_gemm_tolerance(const Arg& arg, const HostArgs& start, const std::vector<float>& reference) {
  if (arg.operands.size() != 2)
    throw std::logic_error(arg.name + ": an FP8 GEMM output names its two operands");
  const auto norm = [](const std::vector<float>& v) {
    double sum = 0;
    for (float x : v) sum += static_cast<double>(x) * x;
    return std::sqrt(sum);
  };
  const double ref_norm = norm(reference);
  if (ref_norm == 0) throw std::logic_error(arg.name + ": an all-zero reference judges nothing");
  const double sums = std::ldexp(1.0, -13) * norm(start.at(arg.operands[0]).values) *
                      norm(start.at(arg.operands[1]).values) / ref_norm;
  const Tolerance rounding = arg.kind == Kind::f32 ? Tolerance::accumulated_f32 : Tolerance::gemm_bf16;
  return sums + tolerance(rounding, reference);
}

double tolerance(const Arg& arg, const HostArgs& start, const std::vector<float>& reference) {
  if (arg.tolerance == Tolerance::fp8_gemm) return fp8_gemm_tolerance(arg, start, reference);
  return tolerance(arg.tolerance, reference);
}

const char* tolerance_name(Tolerance tolerance) {
  switch (tolerance) {
    case Tolerance::exact: return "exact";
    case Tolerance::bf16: return "bf16";
    case Tolerance::reduced_f32: return "reduced_f32";
    case Tolerance::rotated_f32: return "rotated_f32";
    case Tolerance::accumulated_f32: return "accumulated_f32";
    case Tolerance::gemm_bf16: return "gemm_bf16";
    case Tolerance::bf16_logits: return "bf16_logits";
    case Tolerance::bf16_logit_grads: return "bf16_logit_grads";
    case Tolerance::attention_grads: return "attention_grads";
    case Tolerance::fp8_gemm: return "fp8_gemm";
  }
  return "?";
}

std::vector<OpCase> op_table() {
  std::vector<OpCase> table;
  const auto add = [&table](OpCase c) { table.push_back(std::move(c)); };

  // RMSNorm's CUDA kernels hold 1 to 4 16-byte vectors a thread (ops/cuda/rmsnorm.cu): 1 at
  // hidden 1,024 and 2,048, 2 at 2,560 and 4,096, 3 at 5,120, 4 at 8,192. 67 tokens: more
  // than one of the CPU's 64-token reduction blocks; 1,201: more than the CUDA backward's
  // 1,056 weight-gradient blocks, so a block takes several tokens.
  const int64_t tokens[] = {7, 9, 5, 3, 3};
  for (size_t i = 0; i < std::size(kQwen3Hidden); ++i) {
    add(rmsnorm(tokens[i], kQwen3Hidden[i]));
    add(residual_rmsnorm(tokens[i], kQwen3Hidden[i]));
  }
  add(rmsnorm(3, 8192));
  add(residual_rmsnorm(3, 8192));
  add(rmsnorm(67, 1024));
  add(frozen(rmsnorm(67, 1024), {"d_weight"}));
  for (int64_t h : {1024, 2560, 5120}) {
    add(gpu_only(rmsnorm(1201, h)));
    add(gpu_only(residual_rmsnorm(1201, h)));
  }

  // Qwen3's head counts at head_dim 128 (0.6B and 1.7B; 4B and 8B; 14B; 32B), and smaller
  // head_dims: the CUDA kernels give a head G = head_dim / 8 lanes and a block 128 / G head
  // slots, so the head count sets how many rounds a token takes.
  const std::vector<int32_t> rows = {3, 2, 4};
  for (const HeadLayout heads : {HeadLayout{4, 2, 32}, HeadLayout{4, 2, 128}, HeadLayout{16, 8, 128},
                                 HeadLayout{32, 8, 128}, HeadLayout{40, 8, 128}, HeadLayout{64, 8, 128}})
    add(qk_norm_rope(rows, heads));
  add(cpu_only(qk_norm_rope({5, 3, 6}, HeadLayout{4, 2, 8}, {100.0f})));
  add(frozen(qk_norm_rope(rows, HeadLayout{4, 2, 32}), {"d_q_weight", "d_k_weight"}));
  add(gpu_only(qk_norm_rope({600, 601}, HeadLayout{16, 8, 128})));
  // The other families' variants: Llama 3's scaled RoPE (theta 500,000) at head_dim 64
  // (Llama 3.2 1B: 32/8 heads) and 128 (Llama 3.1 8B), with and without q/k norm; the
  // default RoPE without norm at Qwen2.5's 14/2 heads of 64; rows long enough (30) to pass
  // the original context of llama3_rope.
  add(qk_norm_rope(rows, HeadLayout{4, 2, 64}, llama3_rope(5e5f)));
  add(rope_only(rows, HeadLayout{32, 8, 64}, llama3_rope(5e5f)));
  add(rope_only({30, 7}, HeadLayout{32, 8, 128}, llama3_rope(5e5f)));
  add(rope_only(rows, HeadLayout{14, 2, 64}, {kRopeTheta}));
  add(cpu_only(rope_only({5, 3, 6}, HeadLayout{4, 2, 8}, llama3_rope(100.0f))));

  // Qwen2.5's q/k/v biases: 0.5B's qkv width (14 + 2·2 heads of 64) and 7B's (28 + 2·4 of 128).
  add(bias_add(7, 1152));
  add(bias_add(67, 4608));

  add(attention({6, 5}, HeadLayout{4, 2, 8}));
  add(attention({5, 4}, HeadLayout{4, 2, 128}));
  add(attention({3, 4}, HeadLayout{16, 8, 128}));
  // CP2 over a row of 8 (chunks of 2): rank 0's tokens 0 1 6 7 of one span; rank 1's tokens 2
  // 3 4 5 of two samples [0, 3) and [3, 8), the first crossing into rank 1's chunk.
  add(attention_context("cp2_rank0_row8", 8, {0, 8}, {0, 1, 6, 7}, HeadLayout{4, 2, 8}));
  add(attention_context("cp2_rank1_samples3x5", 8, {0, 3, 8}, {2, 3, 4, 5}, HeadLayout{4, 2, 8}));
  // At head_dim 128 and 64 with GQA (the GPU's cases too; parallel/context_split.h's chunks): a
  // row of 16 under CP2 (chunks of 4: rank 0 holds 0-3 and 12-15, rank 1 4-11) and CP4 (chunks
  // of 2: rank 1 holds 2 3 12 13, rank 3 6-9); two rows of 16 under CP2; isolated samples
  // [0, 3) [3, 9) [9, 16) crossing chunk boundaries, rank 0's last chunk reading a sample that
  // starts in rank 1's, and under CP4 a sample spread over three ranks' chunks.
  const std::vector<int32_t> row16 = {0, 16}, samples16 = {0, 3, 9, 16};
  const std::vector<int32_t> cp2_rank0 = {0, 1, 2, 3, 12, 13, 14, 15}, cp2_rank1 = {4, 5, 6, 7, 8, 9, 10, 11};
  add(attention_context("cp2_rank0_row16", 16, row16, cp2_rank0, HeadLayout{4, 2, 128}));
  add(attention_context("cp2_rank1_row16", 16, row16, cp2_rank1, HeadLayout{8, 2, 64}));
  add(attention_context("cp4_rank1_row16", 16, row16, {2, 3, 12, 13}, HeadLayout{4, 2, 128}));
  add(attention_context("cp4_rank3_row16", 16, row16, {6, 7, 8, 9}, HeadLayout{8, 2, 64}));
  add(attention_context("cp2_rank1_rows16x2", 32, {0, 16, 32},
                        {4, 5, 6, 7, 8, 9, 10, 11, 20, 21, 22, 23, 24, 25, 26, 27}, HeadLayout{4, 2, 64}));
  add(attention_context("cp2_rank0_samples3x6x7", 16, samples16, cp2_rank0, HeadLayout{4, 2, 128}));
  add(attention_context("cp2_rank1_samples3x6x7", 16, samples16, cp2_rank1, HeadLayout{8, 2, 64}));
  add(attention_context("cp4_rank2_samples3x6x7", 16, samples16, {4, 5, 10, 11}, HeadLayout{4, 2, 64}));
  add(cpu_only(attention_blocks("cp2_rank0_row8", 8, {0, 8}, {0, 1, 6, 7}, 4, HeadLayout{4, 2, 8})));
  add(cpu_only(attention_blocks("cp2_rank1_samples3x5", 8, {0, 3, 8}, {2, 3, 4, 5}, 4, HeadLayout{4, 2, 8})));
  add(cpu_only(attention_blocks("samples2x1x5_blocks3x5", 8, {0, 2, 3, 8}, {1, 2, 3, 7}, 3, HeadLayout{2, 1, 4})));

  // Qwen3's ffn sizes take the CUDA kernel's 16-byte accesses; 130 is not a multiple of 8
  // and takes its two-value ones.
  for (int64_t f : {3072, 6144, 9728, 12288, 17408, 25600}) add(swiglu(3, f));
  add(swiglu(77, 130));
  add(cpu_only(swiglu(6, 5)));
  add(gpu_only(swiglu(1201, 3072)));

  // GEMMs over each hidden size as k; n small enough for finite differences to stay cheap.
  for (int64_t k : kQwen3Hidden) add(linear(k == 1024 ? 5 : 3, k, 24));
  // Qwen2.5-0.5B's qkv (hidden 896, 14 + 2·2 heads of 64) with its bias.
  add(linear(7, 896, 1152, true));
  add(cpu_only(linear(5, 7, 3)));
  add(gpu_only(linear(96, 160, 224)));

  for (int64_t h : kQwen3Hidden) add(embedding(7, h, 37));
  add(embedding(500, 96, 37));  // many repeated ids

  // The GPU's loss runs in chunks of 48 tokens in test_cuda_ops (130: three); the CPU's in
  // 256 (300: two). Vocabularies of a multiple of 8 take the CUDA kernels' 16-byte accesses,
  // others one logit at a time.
  add(lm_head_loss(7, 1024, 40));
  add(lm_head_loss(5, 5120, 37));
  OpCase frozen_lm_head = frozen(lm_head_loss(7, 1024, 40), {"d_weight"});
  frozen_lm_head.flops = 3 * gemm_flops(7, 40, 1024);  // no d_weight GEMM
  add(frozen_lm_head);
  add(cpu_only(lm_head_loss(300, 6, 11)));
  add(gpu_only(lm_head_loss(130, 64, 500)));
  add(gpu_only(lm_head_loss(130, 64, 512)));

  // The vocab-parallel pieces (TP): shards of odd sizes and offsets, at hidden 64 and 2,560
  // for finite differences; on the GPU a shard of a multiple of 8 (16-byte accesses) beside
  // one that is not, over three 48-token chunks.
  add(embedding_shard(7, 64, 37, 20, 17));
  add(embedding_shard(9, 2560, 37, 0, 20));
  add(gpu_only(embedding_shard(500, 4096, 1000, 504, 496)));
  add(lm_head_shards(7, 64, 40, 24));
  add(lm_head_shards(5, 2560, 37, 20));
  add(gpu_only(lm_head_shards(130, 2560, 500, 248)));

  // Moves and host results, at Qwen3's widths and one that is not a multiple of 8.
  add(gather_scatter_rows(1000, 333, 5120));
  add(gather_scatter_rows(700, 300, 2560));
  add(gather_scatter_rows(70, 30, 12));
  add(fill_zero(1000, 2560));
  add(sum(1000003));
  add(copy_to_host(1000, 2560));
  add(copy_from_host(128));

  // Mixture of experts at Qwen3-30B-A3B's shapes (hidden 2,048, 128 experts, top-8, expert
  // ffn 768: gate_up [128, 1536, 2048], down [128, 2048, 768]) and 235B-A22B's (hidden 4,096,
  // 128 experts, top-8, expert ffn 1,536), and small odd ones (8 experts, top-2, 37 tokens) for
  // finite differences. The router: normalized (Qwen3's norm_topk_prob) or not, with and
  // without a balancing loss's gradient, with exact ties; 40 experts leave a lane of the CUDA
  // kernel's 2 per lane empty, 512 experts and top-32 are its limits.
  for (const bool normalize : {false, true})
    for (const bool balance : {false, true}) add(moe_route(37, 8, 2, normalize, balance));
  add(moe_route(19, 40, 3, true, true));
  add(moe_route(5, 128, 8, true, true));
  add(moe_route(37, 8, 2, true, false, true));
  add(gpu_only(moe_route(4096, 128, 8, true, true)));
  add(gpu_only(moe_route(4096, 128, 8, false, false, true)));
  add(gpu_only(moe_route(1000, 512, 32, true, true)));
  add(gpu_only(moe_route(1000, 512, 32, false, true, true)));
  // The sort: one chunk of the CUDA kernel's 2,048 pairs; 32,768 pairs (4,096 tokens at
  // top-8) in 16; about a million pairs over 512 experts in 512; an odd count over 1,000.
  add(moe_sort(37, 8, 2));
  add(moe_sort(4096, 128, 8));
  add(moe_sort(131071, 512, 8));
  add(moe_sort(3001, 1000, 4));
  // Permute and combine at both hidden sizes, and a hidden of 20 (not a multiple of 8: the
  // kernels' one-value path).
  for (const bool accumulate : {false, true}) {
    add(moe_permute(37, 24, 2, accumulate));
    add(moe_permute(37, 20, 2, accumulate));
  }
  add(moe_permute(5, 2048, 8, true));
  add(gpu_only(moe_permute(4096, 2048, 8, false)));
  add(gpu_only(moe_permute(2048, 4096, 8, true)));
  add(moe_combine(37, 24, 2));
  add(moe_combine(37, 20, 2));
  add(moe_combine(5, 2048, 8));
  add(gpu_only(moe_combine(4096, 2048, 8)));
  add(gpu_only(moe_combine(2048, 4096, 8)));
  // The grouped GEMMs: 37 tokens × top-2 over 8 experts, with rows left unrouted and with n
  // and k off the CUDA fallback's 64 × 64 tiles; each model's gate_up and down at its widths
  // over a share of its experts (the CPU twin runs them); and at a step's size (4,096 tokens
  // × top-8 = 32,768 rows; 235B-A22B over an EP8 rank's 16 experts), timed only.
  add(grouped_linear(74, 8, 24, 40, 0.1));
  add(grouped_linear(74, 8, 70, 33));
  add(gpu_only(grouped_linear(300, 16, 1536, 2048)));
  add(gpu_only(grouped_linear(300, 16, 2048, 768, 0.05)));
  add(gpu_only(grouped_linear(200, 8, 3072, 4096)));
  add(gpu_only(grouped_linear(200, 8, 4096, 1536)));
  add(perf_only(grouped_linear(32768, 128, 1536, 2048)));
  add(perf_only(grouped_linear(32768, 128, 2048, 768)));
  add(perf_only(grouped_linear(32768, 16, 3072, 4096)));
  add(perf_only(grouped_linear(32768, 16, 4096, 1536)));
  // LoRA: qkv of a tiny model with q and v targeted (k's columns untouched); one adapter over
  // o_proj's whole output; Qwen3-8B's qkv (q 4,096, k and v 1,024 each) at rank 16, timed.
  add(lora_up(37, 40, 8, {{0, 24}, {32, 8}}));
  add(lora_up(37, 24, 8, {{0, 24}}));
  // Ranks that are not a multiple of 8: adapter j's window of t starts off a 16-byte boundary
  // (the CUDA op copies it, cuda_ops.cpp lora_up_forward).
  add(lora_up(37, 48, 4, {{0, 16}, {16, 16}, {32, 16}}));
  add(lora_up(37, 40, 2, {{0, 24}, {32, 8}}));
  add(perf_only(lora_up(4096, 6144, 16, {{0, 4096}, {4096, 1024}, {5120, 1024}})));
  // LoRA dropout: a hidden of 1,024 (the 16-byte path), down's shard of a TP rank past the
  // first (columns from 3,072), a width off the vectors (the scalar path); Qwen3-8B's hidden
  // and FFN at 4,096 tokens, timed.
  add(lora_dropout(37, 1024, 10, 0));
  add(lora_dropout(37, 768, 50, 3072));
  add(lora_dropout(37, 100, 5, 0));
  add(perf_only(lora_dropout(4096, 4096, 10, 0)));
  add(perf_only(lora_dropout(4096, 12288, 10, 0)));
  // The probs' column sums: 128 experts over 4,096 tokens (16 chunks of 256 rows), odd sizes.
  add(column_sum(37, 8));
  add(column_sum(4096, 128));
  add(column_sum(1201, 512));

  // FP8 with tensor scaling: amax (bf16 activations, fp32, +inf and NaN) and the cast over
  // token counts that are not multiples of 16; then the linear layer's three GEMMs at
  // Qwen3's widths: the forward (e4m3 × e4m3, fast accumulation) of 4B's qkv and of 32B's
  // down projection (K 25,600), the input gradient (e5m2 × e4m3 Wᵀ) of 8B's down projection,
  // the weight gradient (e5m2 × e4m3 over the tokens, 200 padded to 208) of 4B's o_proj.
  // Few tokens: the CPU twin computes each GEMM too.
  add(amax(1000, 2560, Kind::activation, false));
  add(amax(37, 5120, Kind::activation, true));
  add(amax(333, 4096, Kind::f32, false));
  add(fp8_cast(1000, 4096, DType::e4m3));
  add(fp8_cast(1000, 4096, DType::e5m2));
  add(fp8_cast(37, 2560, DType::e4m3));
  add(fp8_cast(250, 5120, DType::e5m2));
  const auto operand = [](int64_t r, int64_t c, DType format, bool transposed, float scale) {
    return Fp8Operand{r, c, format, transposed, scale};
  };
  add(fp8_gemm("forward", operand(96, 2560, DType::e4m3, false, 1.0f),
               operand(6144, 2560, DType::e4m3, false, 0.02f), false, true));
  add(fp8_gemm("forward", operand(64, 25600, DType::e4m3, false, 1.0f),
               operand(5120, 25600, DType::e4m3, false, 0.02f), false, true));
  add(fp8_gemm("input_grad", operand(96, 4096, DType::e5m2, false, 1e-3f),
               operand(4096, 12288, DType::e4m3, true, 0.02f), false, false));
  add(fp8_gemm("weight_grad", operand(200, 2560, DType::e5m2, true, 1e-3f),
               operand(200, 4096, DType::e4m3, true, 1.0f), true, false));

  // FP8 with block scaling: each cast at Qwen3's widths over token counts that are not
  // multiples of 128 (the CUDA casts take any rows; the column cast pads them to 128), the
  // 128 × 128 cast of 4B's gate and up weights; then the linear layer's three GEMMs, whose
  // setups cast too (32B's down weight of 25,600 columns in 128 × 128 blocks): forward (x
  // 1 × 128 · W 128 × 128) of 32B's down projection and of its TP4 shard (K 6,400: 50 blocks,
  // the scales' rows padded to 52), input gradient (d_out e5m2 1 × 128 · Wᵀ 128 × 128) of
  // 8B's down projection, weight gradient (1 × 128 along 200 tokens padded to 256) of 4B's
  // down projection.
  add(fp8_block_cast(BlockCast::rows, 1000, 5120, DType::e4m3));
  add(fp8_block_cast(BlockCast::rows, 37, 2560, DType::e5m2));
  add(fp8_block_cast(BlockCast::columns, 1000, 2560, DType::e5m2));
  add(fp8_block_cast(BlockCast::columns, 130, 4096, DType::e4m3));
  add(fp8_block_cast(BlockCast::blocks, 9728, 2560, DType::e4m3));
  add(fp8_block_cast(BlockCast::blocks, 384, 640, DType::e5m2));
  const auto block = [](int64_t r, int64_t c, DType format, BlockCast cast, float scale) {
    return BlockOperand{r, c, format, cast, scale};
  };
  add(fp8_gemm_blocks("forward", block(128, 25600, DType::e4m3, BlockCast::rows, 1.0f),
                      block(5120, 25600, DType::e4m3, BlockCast::blocks, 0.02f), false));
  add(fp8_gemm_blocks("forward", block(256, 6400, DType::e4m3, BlockCast::rows, 1.0f),
                      block(5120, 6400, DType::e4m3, BlockCast::blocks, 0.02f), false));
  add(fp8_gemm_blocks("input_grad", block(128, 4096, DType::e5m2, BlockCast::rows, 1e-3f),
                      block(4096, 12288, DType::e4m3, BlockCast::blocks_transposed, 0.02f), false));
  add(fp8_gemm_blocks("weight_grad", block(200, 2560, DType::e5m2, BlockCast::columns, 1e-3f),
                      block(200, 9728, DType::e4m3, BlockCast::columns, 1.0f), true));

  // The layer's two calls over the same kernels: quantize as an output gradient is (both
  // orientations), gemm with plain operands and with each scaling's (4B's qkv forward, 8B's
  // down input gradient, 4B's o_proj weight gradient; 32B's TP4 down forward in blocks).
  add(quantize(250, 5120, Fp8Scaling::tensor, DType::e5m2));
  add(quantize(200, 2560, Fp8Scaling::block, DType::e5m2));
  add(gemm_plain(96, 6144, 2560));
  add(gemm_tensor("forward", operand(96, 2560, DType::e4m3, false, 1.0f),
                  operand(6144, 2560, DType::e4m3, false, 0.02f), false, true));
  add(gemm_tensor("input_grad", operand(96, 4096, DType::e5m2, false, 1e-3f),
                  operand(4096, 12288, DType::e4m3, true, 0.02f), false, false));
  add(gemm_tensor("weight_grad", operand(200, 2560, DType::e5m2, true, 1e-3f),
                  operand(200, 4096, DType::e4m3, true, 1.0f), true, false));
  add(gemm_blocks("forward", block(256, 6400, DType::e4m3, BlockCast::rows, 1.0f),
                  block(5120, 6400, DType::e4m3, BlockCast::blocks, 0.02f), false));
  add(gemm_blocks("input_grad", block(128, 4096, DType::e5m2, BlockCast::rows, 1e-3f),
                  block(4096, 12288, DType::e4m3, BlockCast::blocks_transposed, 0.02f), false));
  add(gemm_blocks("weight_grad", block(200, 2560, DType::e5m2, BlockCast::columns, 1e-3f),
                  block(200, 9728, DType::e4m3, BlockCast::columns, 1.0f), true));

  // The census of each cast's layout.
  add(fp8_census(1000, 2560, std::nullopt, DType::e5m2));
  add(fp8_census(1000, 2560, Fp8Blocks::vec128, DType::e4m3));
  add(fp8_census(1024, 4096, Fp8Blocks::block128x128, DType::e4m3));
  return table;
}

void PrintTo(const OpCase& c, std::ostream* out) {
  *out << c.name;
}

DType kind_dtype(Kind kind, DType activation) {
  switch (kind) {
    case Kind::activation: return activation;
    case Kind::f32:
    case Kind::host: return DType::f32;
    case Kind::ids: return DType::i32;
    case Kind::e4m3: return DType::e4m3;
    case Kind::e5m2: return DType::e5m2;
    case Kind::i64: return DType::i64;
  }
  throw std::logic_error("unknown argument kind");
}

namespace {

bool held_as_bytes(Kind kind) {
  return kind == Kind::e4m3 || kind == Kind::e5m2 || kind == Kind::i64;
}

// An FP8 or int64 argument's starting bytes: zeros, or each value `fill.mean`.
std::vector<uint8_t> starting_bytes(const Arg& arg) {
  const size_t n = static_cast<size_t>(arg.shape.numel());
  if (arg.fill.how == Fill::How::zeros)
    return std::vector<uint8_t>(n * dtype_size(kind_dtype(arg.kind, DType::f32)));
  if (arg.fill.how != Fill::How::constant)
    throw std::logic_error(arg.name + ": FP8 and int64 arguments start constant");
  if (arg.kind != Kind::i64) return std::vector<uint8_t>(n, static_cast<uint8_t>(arg.fill.mean));
  const std::vector<int64_t> values(n, static_cast<int64_t>(arg.fill.mean));
  std::vector<uint8_t> bytes(n * sizeof(int64_t));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// How often each of E experts is drawn: Zipf over a shuffled order (the favourite takes about
// 1/H_E of the draws, 18% at E = 128), the experts marked `empty` never.
std::vector<double> expert_popularity(std::mt19937& rng, int64_t experts, const std::vector<bool>& empty) {
  std::vector<int64_t> order(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<double> weight(static_cast<size_t>(experts));
  for (size_t rank = 0; rank < order.size(); ++rank) {
    const auto e = static_cast<size_t>(order[rank]);
    weight[e] = empty[e] ? 0.0 : 1.0 / static_cast<double>(rank + 1);
  }
  return weight;
}

// `count` of the experts marked empty, chosen at random among those `empty` does not mark yet.
void mark_empty(std::mt19937& rng, std::vector<bool>& empty, int64_t count) {
  std::vector<size_t> open;
  for (size_t e = 0; e < empty.size(); ++e)
    if (!empty[e]) open.push_back(e);
  std::shuffle(open.begin(), open.end(), rng);
  for (int64_t i = 0; i < count && i < static_cast<int64_t>(open.size()); ++i)
    empty[open[static_cast<size_t>(i)]] = true;
}

// Rows of k distinct expert ids (shape [T, k]) drawn by popularity, an eighth of the experts
// (no more than leave k) never drawn.
std::vector<int32_t> top_k_experts(std::mt19937& rng, const Shape& shape, int64_t experts) {
  const int64_t k = shape[shape.ndim - 1], tokens = shape.numel() / k;
  if (k > experts) throw std::logic_error("experts fill: top-k above the experts");
  std::vector<bool> empty(static_cast<size_t>(experts), false);
  mark_empty(rng, empty, std::min(experts / 8, experts - k));
  const std::vector<double> weight = expert_popularity(rng, experts, empty);
  std::discrete_distribution<int32_t> draw(weight.begin(), weight.end());
  std::vector<int32_t> ids(static_cast<size_t>(tokens * k));
  for (int64_t t = 0; t < tokens; ++t) {
    int32_t* row = ids.data() + t * k;
    for (int64_t j = 0; j < k; ++j) {
      do row[j] = draw(rng);
      while (std::find(row, row + j, row[j]) != row + j);
    }
  }
  return ids;
}

// Group boundaries [E + 1] over `rows` rows: each of the first rows − masked·rows rows drawn
// to an expert by popularity, the first and last experts and an eighth of the others empty.
std::vector<int32_t> group_offsets(std::mt19937& rng, const Shape& shape, int64_t rows, double masked) {
  const int64_t experts = shape.numel() - 1;
  std::vector<bool> empty(static_cast<size_t>(experts), false);
  empty.front() = true;
  if (experts > 2) empty.back() = true;
  mark_empty(rng, empty, experts / 8);
  if (std::count(empty.begin(), empty.end(), false) == 0) empty.back() = false;
  const std::vector<double> weight = expert_popularity(rng, experts, empty);
  std::discrete_distribution<int32_t> draw(weight.begin(), weight.end());
  std::vector<int32_t> offsets(static_cast<size_t>(experts + 1), 0);
  const auto routed = static_cast<int64_t>(std::llround(static_cast<double>(rows) * (1.0 - masked)));
  for (int64_t r = 0; r < routed; ++r) ++offsets[static_cast<size_t>(draw(rng)) + 1];
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  return offsets;
}

// Router logits [T, E]: each row distinct multiples m · scale, m in [−256, 256] (exact in
// bf16), shuffled; with `ties`, each row's four largest values copied onto other experts.
std::vector<float> router_logits(std::mt19937& rng, const Shape& shape, float scale, bool ties) {
  const int64_t experts = shape[shape.ndim - 1], tokens = shape.numel() / experts;
  if (experts > 513) throw std::logic_error("logits fill: more experts than distinct values");
  std::vector<int32_t> grid(513);
  std::iota(grid.begin(), grid.end(), -256);
  std::vector<float> values(static_cast<size_t>(tokens * experts));
  std::uniform_int_distribution<int64_t> other(0, experts - 2);
  for (int64_t t = 0; t < tokens; ++t) {
    std::shuffle(grid.begin(), grid.end(), rng);
    float* row = values.data() + t * experts;
    for (int64_t e = 0; e < experts; ++e) row[e] = static_cast<float>(grid[static_cast<size_t>(e)]) * scale;
    if (!ties) continue;
    std::vector<int64_t> order(static_cast<size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return row[a] > row[b]; });
    for (int64_t i = 0; i < std::min<int64_t>(4, experts - 1); ++i) {
      const int64_t from = order[static_cast<size_t>(i)];
      int64_t to = other(rng);
      if (to >= from) ++to;  // any expert but `from`
      row[to] = row[from];
    }
  }
  return values;
}

}  // namespace

HostArgs op_case_values(const OpCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  HostArgs values;
  for (const Arg& arg : c.args) {
    HostArg& v = values[arg.name];
    const size_t n = static_cast<size_t>(arg.shape.numel());
    if (held_as_bytes(arg.kind)) {
      v.bytes = starting_bytes(arg);
      continue;
    }
    switch (arg.fill.how) {
      case Fill::How::zeros:
        if (arg.kind == Kind::ids)
          v.ids.assign(n, 0);
        else
          v.values.assign(n, 0.0f);
        break;
      case Fill::How::constant:
        if (arg.kind == Kind::ids)
          v.ids.assign(n, static_cast<int32_t>(arg.fill.mean));
        else
          v.values.assign(n, arg.fill.mean);
        break;
      case Fill::How::normal: {
        std::normal_distribution<float> dist(arg.fill.mean, arg.fill.scale);
        v.values.resize(n);
        for (float& x : v.values) x = round_bf16(dist(rng));
        break;
      }
      case Fill::How::ids: {
        std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(arg.fill.vocab - 1));
        std::bernoulli_distribution masked(arg.fill.masked);
        v.ids.resize(n);
        for (int32_t& id : v.ids) id = masked(rng) ? -1 : pick(rng);
        break;
      }
      case Fill::How::spread: {
        std::normal_distribution<float> dist(0.0f, arg.fill.scale);
        std::uniform_int_distribution<int> binades(0, 23);
        v.values.resize(n);
        for (float& x : v.values) x = round_bf16(std::ldexp(dist(rng), -binades(rng)));
        if (arg.fill.specials) {
          v.values.at(0) = std::numeric_limits<float>::infinity();
          v.values.at(1) = std::numeric_limits<float>::quiet_NaN();
        }
        break;
      }
      case Fill::How::positions: {
        std::vector<int32_t> all(static_cast<size_t>(arg.fill.vocab));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        v.ids.assign(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(n));
        break;
      }
      case Fill::How::experts: v.ids = top_k_experts(rng, arg.shape, arg.fill.vocab); break;
      case Fill::How::offsets: v.ids = group_offsets(rng, arg.shape, arg.fill.vocab, arg.fill.masked); break;
      case Fill::How::logits:
        v.values = router_logits(rng, arg.shape, arg.fill.scale, arg.fill.specials);
        break;
      case Fill::How::tiled: {
        const std::vector<float>& of = values.at(arg.fill.of).values;
        if (of.empty())
          throw std::logic_error(arg.name + ": tiled from " + arg.fill.of + ", which has no values");
        v.values.resize(n);
        for (size_t i = 0; i < n; ++i) v.values[i] = of[i % of.size()];
        break;
      }
    }
  }
  return values;
}

Args host_tensors(const OpCase& c, HostArgs& values) {
  Args args;
  for (const Arg& arg : c.args) {
    HostArg& v = values.at(arg.name);
    void* data = arg.kind == Kind::ids     ? static_cast<void*>(v.ids.data())
                 : held_as_bytes(arg.kind) ? static_cast<void*>(v.bytes.data())
                                           : static_cast<void*>(v.values.data());
    args[arg.name] = Tensor{data, arg.shape, kind_dtype(arg.kind, DType::f32), Device::cpu};
  }
  return args;
}

int64_t bits_differ(const HostArg& a, const HostArg& b) {
  const auto count = [](const auto& x, const auto& y) {
    if (x.size() != y.size()) return static_cast<int64_t>(std::max(x.size(), y.size()));
    int64_t n = 0;
    for (size_t i = 0; i < x.size(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(x[i])) != 0 ? 1 : 0;
    return n;
  };
  return count(a.values, b.values) + count(a.ids, b.ids) + count(a.bytes, b.bytes);
}

double op_case_bytes(const OpCase& c) {
  if (c.bytes > 0) return c.bytes;
  double bytes = 0;
  for (const Arg& arg : c.args)
    bytes += static_cast<double>(arg.shape.numel()) *
             static_cast<double>(dtype_size(kind_dtype(arg.kind, DType::bf16)));
  return bytes;
}

}  // namespace loom::test
