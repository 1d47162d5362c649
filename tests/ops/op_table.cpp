#include "ops/op_table.h"

#include <cmath>
#include <stdexcept>

#include "core/dtype.h"

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

OpCase swiglu(int64_t t, int64_t f) {
  OpCase c;
  c.name = "swiglu" + shape_name({{"t", t}, {"f", f}});
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

OpCase gpu_only(OpCase c) {
  c.finite_differences = false;
  return c;
}
OpCase cpu_only(OpCase c) {
  c.cuda = false;
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
  }
  throw std::logic_error("unknown tolerance class");
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
  add(cpu_only(lm_head_loss(300, 6, 11)));
  add(gpu_only(lm_head_loss(130, 64, 500)));
  add(gpu_only(lm_head_loss(130, 64, 512)));
  return table;
}

void PrintTo(const OpCase& c, std::ostream* out) {
  *out << c.name;
}

HostArgs op_case_values(const OpCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  HostArgs values;
  for (const Arg& arg : c.args) {
    HostArg& v = values[arg.name];
    const size_t n = static_cast<size_t>(arg.shape.numel());
    switch (arg.fill.how) {
      case Fill::How::zeros: v.values.assign(n, 0.0f); break;
      case Fill::How::constant: v.values.assign(n, arg.fill.mean); break;
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
    }
  }
  return values;
}

Args host_tensors(const OpCase& c, HostArgs& values) {
  Args args;
  for (const Arg& arg : c.args) {
    HostArg& v = values.at(arg.name);
    args[arg.name] = arg.kind == Kind::ids ? Tensor{v.ids.data(), arg.shape, DType::i32, Device::cpu}
                                           : Tensor{v.values.data(), arg.shape, DType::f32, Device::cpu};
  }
  return args;
}

}  // namespace loom::test
