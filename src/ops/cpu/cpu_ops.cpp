#include "ops/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "core/parallel.h"
#include "ops/lora_dropout.h"

namespace loom {
namespace {

// Weight-gradient reductions sum over tokens in blocks of this many, in block order, so the
// result is the same for any thread count.
constexpr int64_t kReduceBlockTokens = 64;

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// Sums per-block partials of length `width` produced by `block_fn(begin, end, partial)`
// over [0, n) tokens, then adds them in block order into `accumulate`.
template <typename BlockFn>
void blocked_reduce(int64_t n, int64_t width, float* accumulate, BlockFn block_fn) {
  int64_t blocks = (n + kReduceBlockTokens - 1) / kReduceBlockTokens;
  std::vector<float> partials(static_cast<size_t>(blocks * width), 0.0f);
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      block_fn(b * kReduceBlockTokens, std::min(n, (b + 1) * kReduceBlockTokens),
               &partials[static_cast<size_t>(b * width)]);
  });
  for (int64_t b = 0; b < blocks; ++b)
    axpy(1.0f, &partials[static_cast<size_t>(b * width)], accumulate, width);
}

float row_rstd(const float* x, int64_t n, float eps) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_sq += static_cast<double>(x[i]) * x[i];
  float mean_sq = static_cast<float>(sum_sq / static_cast<double>(n));
  return 1.0f / std::sqrt(mean_sq + eps);
}

// d_x += rstd · (g − x̂ · mean(g · x̂)) with g = d_out · w, x̂ = x · rstd: the input gradient of
// y = x̂ · w over one vector of length n.
void rmsnorm_vector_backward(float* d_x, const float* d_out, const float* x, const float* w, float rstd,
                             int64_t n) {
  double mean_gx = 0.0;
  for (int64_t i = 0; i < n; ++i) mean_gx += static_cast<double>(d_out[i]) * w[i] * x[i] * rstd;
  float m = static_cast<float>(mean_gx / static_cast<double>(n));
  for (int64_t i = 0; i < n; ++i) d_x[i] += rstd * (d_out[i] * w[i] - x[i] * rstd * m);
}

// cos/sin of RoPE for positions [0, max_len) and frequency i < hd/2, in fp32 as
// transformers computes them: angle = position · inv_freq (ops/rope.h).
struct RopeTable {
  int64_t half = 0;
  std::vector<float> cos, sin;
  RopeTable(int64_t max_len, int64_t head_dim, const RopeSpec& spec) : half(head_dim / 2) {
    cos.resize(static_cast<size_t>(max_len * half));
    sin.resize(cos.size());
    const std::vector<float> inv_freq = rope_inv_freq(spec, head_dim);
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t p = 0; p < max_len; ++p) {
        float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(i)];
        cos[static_cast<size_t>(p * half + i)] = std::cos(angle);
        sin[static_cast<size_t>(p * half + i)] = std::sin(angle);
      }
    }
  }
};

// Position of each token within its row, or the given ones (RowSpans::positions).
std::vector<int32_t> row_positions(const RowSpans& rows, int64_t* max_len) {
  *max_len = 1;
  if (!rows.positions.empty()) {
    for (int32_t p : rows.positions) {
      LOOM_ASSERT(p >= 0, "a negative RoPE position");
      *max_len = std::max<int64_t>(*max_len, p + 1);
    }
    return rows.positions;
  }
  std::vector<int32_t> pos(static_cast<size_t>(rows.tokens()));
  for (int64_t r = 0; r < rows.rows(); ++r) {
    int32_t begin = rows.offsets[static_cast<size_t>(r)], end = rows.offsets[static_cast<size_t>(r + 1)];
    for (int32_t t = begin; t < end; ++t) pos[static_cast<size_t>(t)] = t - begin;
    *max_len = std::max<int64_t>(*max_len, end - begin);
  }
  return pos;
}

void check_rows(const char* op, const RowSpans& rows, int64_t tokens) {
  if (rows.offsets.empty() || rows.offsets.front() != 0 || rows.tokens() != tokens)
    throw_runtime_failure(op, "row spans cover " + std::to_string(rows.tokens()) + " tokens, expected " +
                                  std::to_string(tokens));
  if (!rows.positions.empty() && static_cast<int64_t>(rows.positions.size()) != tokens)
    throw_runtime_failure(op, "positions for " + std::to_string(rows.positions.size()) +
                                  " tokens, expected " + std::to_string(tokens));
}

// A CP rank's queries (ContextSpans): one span of keys each, within the whole micro-batch's.
void check_context(const char* op, const ContextSpans& spans, int64_t queries, int64_t keys) {
  if (static_cast<int64_t>(spans.key_begin.size()) != queries ||
      spans.key_end.size() != spans.key_begin.size())
    throw_runtime_failure(op, "context spans for " + std::to_string(spans.key_begin.size()) +
                                  " queries, expected " + std::to_string(queries));
  for (size_t i = 0; i < spans.key_begin.size(); ++i)
    LOOM_ASSERT(0 <= spans.key_begin[i] && spans.key_begin[i] < spans.key_end[i] && spans.key_end[i] <= keys,
                std::string(op) + ": a query's keys outside the whole micro-batch");
}

// The ring form's block (ops.h attention_block_forward): its kv heads and the micro-batch
// index of each key, checked.
void check_block(const char* op, const ContextSpans& spans, int64_t queries, Tensor kv, Tensor keys,
                 const HeadLayout& heads) {
  check_tensor(op, "kv", kv, DType::f32, {-1, 2 * heads.kv_heads, heads.head_dim});
  check_tensor(op, "keys", keys, DType::i32, {kv.shape[0]});
  check_context(op, spans, queries, std::numeric_limits<int32_t>::max());
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

// The lm_head's backward walk (lm_head_loss, lm_head_shard_backward): logits exist for 256
// tokens at a time, as the CUDA path keeps them chunked. token(t, z) fills token t's row z of
// the chunk (its logit gradients, or zeros, which add nothing); then, where d_weight is
// given, the chunk's rows are added into it vocabulary row by vocabulary row.
template <typename Token>
void lm_head_chunks(int64_t t_count, int64_t vocab, int64_t h, const float* hidden, float* d_weight,
                    Token token) {
  constexpr int64_t kChunk = 256;
  std::vector<float> logits(static_cast<size_t>(std::min(kChunk, t_count) * vocab));
  for (int64_t c0 = 0; c0 < t_count; c0 += kChunk) {
    const int64_t c1 = std::min(t_count, c0 + kChunk);
    parallel_for(c1 - c0, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = c0 + b; t < c0 + e; ++t) token(t, &logits[static_cast<size_t>((t - c0) * vocab)]);
    });
    if (!d_weight) continue;
    parallel_for(vocab, 16, [&](int64_t b, int64_t e) {
      for (int64_t v = b; v < e; ++v) {
        float* dw = d_weight + v * h;
        for (int64_t t = c0; t < c1; ++t) {
          const float g = logits[static_cast<size_t>((t - c0) * vocab + v)];
          if (g != 0.0f) axpy(g, hidden + t * h, dw, h);
        }
      }
    });
  }
}

}  // namespace

void CpuOps::embedding_forward(Tensor out, Tensor ids, Tensor table) {
  const int64_t t_count = ids.numel(), h = table.shape[1], vocab = table.shape[0];
  check_tensor("embedding_forward", "ids", ids, DType::i32, {t_count});
  check_tensor("embedding_forward", "out", out, DType::f32, {t_count, h});
  const int32_t* id = ids.as<int32_t>();
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      LOOM_ASSERT(id[t] >= 0 && id[t] < vocab, "token id out of range");
      std::copy_n(table.as<float>() + id[t] * h, h, out.as<float>() + t * h);
    }
  });
}

void CpuOps::embedding_backward(Tensor d_table, Tensor ids, Tensor d_out) {
  const int64_t t_count = ids.numel(), h = d_table.shape[1];
  check_tensor("embedding_backward", "d_out", d_out, DType::f32, {t_count, h});
  const int32_t* id = ids.as<int32_t>();
  // Split the hidden dimension across threads: each thread adds every token, in order, to
  // its own columns, so the sum order is fixed.
  parallel_for(h, 8, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < t_count; ++t) {
      float* dst = d_table.as<float>() + id[t] * h;
      const float* src = d_out.as<float>() + t * h;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

void CpuOps::linear_forward(Tensor out, Tensor x, Tensor weight, Tensor bias) {
  const int64_t t_count = x.shape[0], k = x.shape[1], n = weight.shape[0];
  check_tensor("linear_forward", "weight", weight, DType::f32, {n, k});
  check_tensor("linear_forward", "out", out, DType::f32, {t_count, n});
  if (bias.data) check_tensor("linear_forward", "bias", bias, DType::f32, {n});
  const float* w = weight.as<float>();
  const float* b_row = bias.data ? bias.as<float>() : nullptr;
  parallel_for(t_count, 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* xr = x.as<float>() + t * k;
      float* yr = out.as<float>() + t * n;
      for (int64_t j = 0; j < n; ++j) yr[j] = dot(xr, w + j * k, k) + (b_row ? b_row[j] : 0.0f);
    }
  });
}

void CpuOps::linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight) {
  const int64_t t_count = d_out.shape[0], k = weight.shape[1], n = weight.shape[0];
  check_tensor("linear_backward", "d_out", d_out, DType::f32, {t_count, n});
  const float* w = weight.as<float>();
  const float* dy = d_out.as<float>();
  if (d_x.data) {
    check_tensor("linear_backward", "d_x", d_x, DType::f32, {t_count, k});
    parallel_for(t_count, 4, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        float* dxr = d_x.as<float>() + t * k;
        std::fill_n(dxr, k, 0.0f);
        for (int64_t j = 0; j < n; ++j) axpy(dy[t * n + j], w + j * k, dxr, k);
      }
    });
  }
  if (!d_weight.data) return;
  check_tensor("linear_backward", "d_weight", d_weight, DType::f32, {n, k});
  check_tensor("linear_backward", "x", x, DType::f32, {t_count, k});
  // Each output row of d_weight is owned by one thread and sums tokens in order.
  parallel_for(n, 4, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      float* dwr = d_weight.as<float>() + j * k;
      for (int64_t t = 0; t < t_count; ++t) axpy(dy[t * n + j], x.as<float>() + t * k, dwr, k);
    }
  });
}

void CpuOps::lora_up_forward(Tensor out, Tensor t, const std::vector<LoraUp>& adapters, float scale) {
  const int64_t r = lora_up_check("lora_up_forward", out, t, adapters, DType::f32, DType::f32, false);
  const int64_t t_count = out.shape[0], n = out.shape[1], width = t.shape[1];
  parallel_for(t_count, 4, [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row)
      for (size_t j = 0; j < adapters.size(); ++j) {
        const float* tr = t.as<float>() + row * width + static_cast<int64_t>(j) * r;
        const LoraUp& a = adapters[j];
        float* yr = out.as<float>() + row * n + a.column;
        for (int64_t i = 0; i < a.b.shape[0]; ++i) yr[i] += scale * dot(tr, a.b.as<float>() + i * r, r);
      }
  });
}

void CpuOps::lora_dropout(Tensor out, Tensor x, const LoraDropoutMask& mask, bool accumulate) {
  lora_dropout_check(out, x, mask, DType::f32);
  const int64_t k = x.shape[1];
  const int32_t* tokens = mask.tokens.as<int32_t>();
  parallel_for(x.shape[0], 4, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const uint64_t token = lora_dropout_token(mask.stream, tokens[2 * t], tokens[2 * t + 1]);
      const float* xr = x.as<float>() + t * k;
      float* yr = out.as<float>() + t * k;
      for (int64_t c = 0; c < k; ++c) {
        const float v =
            lora_dropout_kept(token, mask.feature_begin + c, mask.threshold) ? xr[c] * mask.scale : 0.0f;
        yr[c] = accumulate ? yr[c] + v : v;
      }
    }
  });
}

void CpuOps::lora_up_backward(Tensor d_t, Tensor d_out, Tensor t, const std::vector<LoraUp>& adapters,
                              float scale) {
  const int64_t r = lora_up_check("lora_up_backward", d_out, d_t, adapters, DType::f32, DType::f32, true);
  check_tensor("lora_up_backward", "t", t, DType::f32, {d_t.shape[0], d_t.shape[1]});
  const int64_t t_count = d_out.shape[0], n = d_out.shape[1], width = t.shape[1];
  const float* dy = d_out.as<float>();
  parallel_for(t_count, 4, [&](int64_t b, int64_t e) {
    for (int64_t row = b; row < e; ++row)
      for (size_t j = 0; j < adapters.size(); ++j) {
        const LoraUp& a = adapters[j];
        float* dtr = d_t.as<float>() + row * width + static_cast<int64_t>(j) * r;
        std::fill_n(dtr, r, 0.0f);
        for (int64_t i = 0; i < a.b.shape[0]; ++i)
          axpy(dy[row * n + a.column + i], a.b.as<float>() + i * r, dtr, r);
        for (int64_t c = 0; c < r; ++c) dtr[c] *= scale;
      }
  });
  // Each row of each d_B_j is owned by one thread and sums tokens in order.
  for (size_t j = 0; j < adapters.size(); ++j) {
    const LoraUp& a = adapters[j];
    parallel_for(a.b.shape[0], 4, [&](int64_t b, int64_t e) {
      std::vector<float> sum(static_cast<size_t>(r));
      for (int64_t i = b; i < e; ++i) {
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int64_t row = 0; row < t_count; ++row)
          axpy(dy[row * n + a.column + i], t.as<float>() + row * width + static_cast<int64_t>(j) * r,
               sum.data(), r);
        float* db = a.d_b.as<float>() + i * r;
        for (int64_t c = 0; c < r; ++c) db[c] += scale * sum[static_cast<size_t>(c)];
      }
    });
  }
}

void CpuOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Tensor out_amax) {
  const int64_t t_count = x.shape[0], h = x.shape[1];
  check_tensor("rmsnorm_forward", "weight", weight, DType::f32, {h});
  check_tensor("rmsnorm_forward", "out", out, DType::f32, {t_count, h});
  check_tensor("rmsnorm_forward", "rstd", rstd, DType::f32, {t_count});
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* xr = x.as<float>() + t * h;
      float r = row_rstd(xr, h, eps);
      rstd.as<float>()[t] = r;
      float* yr = out.as<float>() + t * h;
      for (int64_t i = 0; i < h; ++i) yr[i] = weight.as<float>()[i] * (xr[i] * r);
    }
  });
  if (out_amax.data) amax(out_amax, out);
}

void CpuOps::residual_rmsnorm_forward(Tensor residual_out, Tensor out, Tensor rstd, Tensor residual,
                                      Tensor delta, Tensor weight, float eps, Tensor out_amax) {
  const int64_t t_count = residual.shape[0], h = residual.shape[1];
  check_tensor("residual_rmsnorm_forward", "delta", delta, DType::f32, {t_count, h});
  check_tensor("residual_rmsnorm_forward", "residual_out", residual_out, DType::f32, {t_count, h});
  const int64_t n = t_count * h;
  parallel_for(n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      residual_out.as<float>()[i] = residual.as<float>()[i] + delta.as<float>()[i];
  });
  rmsnorm_forward(out, rstd, residual_out, weight, eps, out_amax);
}

void CpuOps::rmsnorm_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight, Tensor rstd,
                              Tensor out_amax) {
  const int64_t t_count = x.shape[0], h = x.shape[1];
  check_tensor("rmsnorm_backward", "d_x", d_x, DType::f32, {t_count, h});
  check_tensor("rmsnorm_backward", "d_out", d_out, DType::f32, {t_count, h});
  if (d_weight.data) check_tensor("rmsnorm_backward", "d_weight", d_weight, DType::f32, {h});
  const float* w = weight.as<float>();
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      rmsnorm_vector_backward(d_x.as<float>() + t * h, d_out.as<float>() + t * h, x.as<float>() + t * h, w,
                              rstd.as<float>()[t], h);
  });
  if (d_weight.data)
    blocked_reduce(t_count, h, d_weight.as<float>(), [&](int64_t b, int64_t e, float* partial) {
      for (int64_t t = b; t < e; ++t) {
        float r = rstd.as<float>()[t];
        const float* xr = x.as<float>() + t * h;
        const float* dy = d_out.as<float>() + t * h;
        for (int64_t i = 0; i < h; ++i) partial[i] += dy[i] * (xr[i] * r);
      }
    });
  if (out_amax.data) amax(out_amax, d_x);
}

void CpuOps::qk_norm_rope_forward(Tensor qkv_out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                                  const RowSpans& rows, const HeadLayout& heads, float eps,
                                  const RopeSpec& rope_spec) {
  const int64_t t_count = qkv.shape[0], nh = heads.total_heads(), hd = heads.head_dim;
  const int64_t normed = heads.q_heads + heads.kv_heads;
  const bool norm = q_weight.data != nullptr;
  check_tensor("qk_norm_rope_forward", "qkv", qkv, DType::f32, {t_count, nh, hd});
  check_tensor("qk_norm_rope_forward", "qkv_out", qkv_out, DType::f32, {t_count, nh, hd});
  if (norm) {
    check_tensor("qk_norm_rope_forward", "rstd", rstd, DType::f32, {t_count, normed});
    check_tensor("qk_norm_rope_forward", "q_weight", q_weight, DType::f32, {hd});
    check_tensor("qk_norm_rope_forward", "k_weight", k_weight, DType::f32, {hd});
  }
  check_rows("qk_norm_rope_forward", rows, t_count);
  int64_t max_len = 0;
  std::vector<int32_t> pos = row_positions(rows, &max_len);
  RopeTable rope(max_len, hd, rope_spec);
  const int64_t half = hd / 2;
  parallel_for(t_count, 4, [&](int64_t b, int64_t e) {
    std::vector<float> y(static_cast<size_t>(hd));
    for (int64_t t = b; t < e; ++t) {
      const float* cs = &rope.cos[static_cast<size_t>(pos[static_cast<size_t>(t)] * half)];
      const float* sn = &rope.sin[static_cast<size_t>(pos[static_cast<size_t>(t)] * half)];
      for (int64_t h = 0; h < nh; ++h) {
        const float* x = qkv.as<float>() + (t * nh + h) * hd;
        float* o = qkv_out.as<float>() + (t * nh + h) * hd;
        if (h >= normed) {
          std::copy_n(x, hd, o);
          continue;
        }
        if (norm) {
          const float* w = (h < heads.q_heads ? q_weight : k_weight).as<float>();
          float r = row_rstd(x, hd, eps);
          rstd.as<float>()[t * normed + h] = r;
          for (int64_t i = 0; i < hd; ++i) y[static_cast<size_t>(i)] = w[i] * (x[i] * r);
        } else {
          std::copy_n(x, hd, y.begin());
        }
        // Rotate-half: o = y·cos + cat(−y2, y1)·sin, the angle of pair (i, i + hd/2) shared.
        for (int64_t i = 0; i < half; ++i) {
          float y1 = y[static_cast<size_t>(i)], y2 = y[static_cast<size_t>(i + half)];
          o[i] = y1 * cs[i] - y2 * sn[i];
          o[i + half] = y2 * cs[i] + y1 * sn[i];
        }
      }
    }
  });
}

void CpuOps::qk_norm_rope_backward(Tensor d_qkv, Tensor d_q_weight, Tensor d_k_weight, Tensor d_qkv_out,
                                   Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor rstd,
                                   const RowSpans& rows, const HeadLayout& heads, const RopeSpec& rope_spec,
                                   Tensor out_amax) {
  const int64_t t_count = qkv.shape[0], nh = heads.total_heads(), hd = heads.head_dim;
  const int64_t normed = heads.q_heads + heads.kv_heads;
  const bool norm = q_weight.data != nullptr;
  check_tensor("qk_norm_rope_backward", "d_qkv", d_qkv, DType::f32, {t_count, nh, hd});
  check_tensor("qk_norm_rope_backward", "d_qkv_out", d_qkv_out, DType::f32, {t_count, nh, hd});
  if (norm && d_q_weight.data) {
    check_tensor("qk_norm_rope_backward", "d_q_weight", d_q_weight, DType::f32, {hd});
    check_tensor("qk_norm_rope_backward", "d_k_weight", d_k_weight, DType::f32, {hd});
  }
  check_rows("qk_norm_rope_backward", rows, t_count);
  int64_t max_len = 0;
  std::vector<int32_t> pos = row_positions(rows, &max_len);
  RopeTable rope(max_len, hd, rope_spec);
  const int64_t half = hd / 2;
  // d_y: the gradient at the norm's output (RoPE undone: the transpose of the rotation).
  auto unrotate = [&](int64_t t, int64_t h, float* d_y) {
    const float* cs = &rope.cos[static_cast<size_t>(pos[static_cast<size_t>(t)] * half)];
    const float* sn = &rope.sin[static_cast<size_t>(pos[static_cast<size_t>(t)] * half)];
    const float* g = d_qkv_out.as<float>() + (t * nh + h) * hd;
    for (int64_t i = 0; i < half; ++i) {
      d_y[i] = g[i] * cs[i] + g[i + half] * sn[i];
      d_y[i + half] = g[i + half] * cs[i] - g[i] * sn[i];
    }
  };
  // Norm weights are shared by all heads of their kind: partial [2, hd] per token block.
  // Before d_qkv is written: in place, that overwrites d_qkv_out.
  std::vector<float> dw(static_cast<size_t>(2 * hd), 0.0f);
  if (norm)
    blocked_reduce(t_count, 2 * hd, dw.data(), [&](int64_t b, int64_t e, float* partial) {
      std::vector<float> d_y(static_cast<size_t>(hd));
      for (int64_t t = b; t < e; ++t) {
        for (int64_t h = 0; h < normed; ++h) {
          unrotate(t, h, d_y.data());
          const float* x = qkv.as<float>() + (t * nh + h) * hd;
          float r = rstd.as<float>()[t * normed + h];
          float* dst = partial + (h < heads.q_heads ? 0 : hd);
          for (int64_t i = 0; i < hd; ++i) dst[i] += d_y[static_cast<size_t>(i)] * (x[i] * r);
        }
      }
    });
  const bool in_place = d_qkv.data == d_qkv_out.data;
  parallel_for(t_count, 4, [&](int64_t b, int64_t e) {
    std::vector<float> d_y(static_cast<size_t>(hd));
    for (int64_t t = b; t < e; ++t) {
      for (int64_t h = 0; h < nh; ++h) {
        float* dx = d_qkv.as<float>() + (t * nh + h) * hd;
        if (h >= normed) {
          if (!in_place) std::copy_n(d_qkv_out.as<float>() + (t * nh + h) * hd, hd, dx);
          continue;
        }
        unrotate(t, h, d_y.data());
        if (!norm) {
          std::copy_n(d_y.begin(), hd, dx);
          continue;
        }
        std::fill_n(dx, hd, 0.0f);
        const float* w = (h < heads.q_heads ? q_weight : k_weight).as<float>();
        rmsnorm_vector_backward(dx, d_y.data(), qkv.as<float>() + (t * nh + h) * hd, w,
                                rstd.as<float>()[t * normed + h], hd);
      }
    }
  });
  if (out_amax.data) amax(out_amax, d_qkv);
  if (!norm || !d_q_weight.data) return;  // no q/k norm, or frozen ones
  axpy(1.0f, dw.data(), d_q_weight.as<float>(), hd);
  axpy(1.0f, dw.data() + hd, d_k_weight.as<float>(), hd);
}

void CpuOps::bias_add_forward(Tensor out, Tensor bias) {
  const int64_t t_count = out.shape[0], n = bias.numel();
  check_tensor("bias_add_forward", "out", out, DType::f32, {t_count, n});
  check_tensor("bias_add_forward", "bias", bias, DType::f32, {n});
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) axpy(1.0f, bias.as<float>(), out.as<float>() + t * n, n);
  });
}

void CpuOps::bias_backward(Tensor d_bias, Tensor d_out) {
  const int64_t t_count = d_out.shape[0], n = d_bias.numel();
  check_tensor("bias_backward", "d_out", d_out, DType::f32, {t_count, n});
  check_tensor("bias_backward", "d_bias", d_bias, DType::f32, {n});
  blocked_reduce(t_count, n, d_bias.as<float>(), [&](int64_t b, int64_t e, float* partial) {
    for (int64_t t = b; t < e; ++t) axpy(1.0f, d_out.as<float>() + t * n, partial, n);
  });
}

void CpuOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, const RowSpans& rows,
                               const HeadLayout& heads) {
  const int64_t t_count = qkv.shape[0], nh = heads.total_heads(), hd = heads.head_dim, nq = heads.q_heads;
  check_tensor("attention_forward", "qkv", qkv, DType::f32, {t_count, nh, hd});
  check_tensor("attention_forward", "out", out, DType::f32, {t_count, nq, hd});
  check_tensor("attention_forward", "lse", lse, DType::f32, {nq, t_count});
  check_rows("attention_forward", rows, t_count);
  const int64_t group = nq / heads.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* base = qkv.as<float>();
  auto head_ptr = [&](int64_t t, int64_t h) { return base + (t * nh + h) * hd; };
  // One task per (row, q head); queries of a row are independent.
  const int64_t tasks = rows.rows() * nq;
  parallel_for(tasks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    for (int64_t task = b; task < e; ++task) {
      int64_t r = task / nq, h = task % nq;
      int64_t kv = nq + h / group, v_head = nq + heads.kv_heads + h / group;
      int32_t begin = rows.offsets[static_cast<size_t>(r)], end = rows.offsets[static_cast<size_t>(r + 1)];
      for (int64_t i = begin; i < end; ++i) {
        const float* q = head_ptr(i, h);
        scores.resize(static_cast<size_t>(i - begin + 1));
        float max_score = -INFINITY;
        for (int64_t j = begin; j <= i; ++j) {
          float s = dot(q, head_ptr(j, kv), hd) * scale;
          scores[static_cast<size_t>(j - begin)] = s;
          max_score = std::max(max_score, s);
        }
        double sum = 0.0;
        for (float s : scores) sum += std::exp(static_cast<double>(s - max_score));
        float log_sum = max_score + static_cast<float>(std::log(sum));
        lse.as<float>()[begin * nq + h * (end - begin) + (i - begin)] = log_sum;
        float* o = out.as<float>() + (i * nq + h) * hd;
        std::fill_n(o, hd, 0.0f);
        for (int64_t j = begin; j <= i; ++j)
          axpy(std::exp(scores[static_cast<size_t>(j - begin)] - log_sum), head_ptr(j, v_head), o, hd);
      }
    }
  });
}

void CpuOps::attention_backward(Tensor d_qkv, Tensor d_out, Tensor out, Tensor lse, Tensor qkv,
                                const RowSpans& rows, const HeadLayout& heads) {
  const int64_t t_count = qkv.shape[0], nh = heads.total_heads(), hd = heads.head_dim, nq = heads.q_heads;
  const int64_t nkv = heads.kv_heads, group = nq / nkv;
  check_tensor("attention_backward", "d_qkv", d_qkv, DType::f32, {t_count, nh, hd});
  check_tensor("attention_backward", "d_out", d_out, DType::f32, {t_count, nq, hd});
  check_rows("attention_backward", rows, t_count);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* base = qkv.as<float>();
  float* d_base = d_qkv.as<float>();
  auto at = [&](int64_t t, int64_t h) { return (t * nh + h) * hd; };
  // One task per (row, kv head): it owns dK and dV of that head in that row and the dQ of
  // the q heads in its group, so every gradient is summed by one thread in a fixed order.
  const int64_t tasks = rows.rows() * nkv;
  parallel_for(tasks, 1, [&](int64_t b, int64_t e) {
    std::vector<float> probs, d_probs;
    for (int64_t task = b; task < e; ++task) {
      int64_t r = task / nkv, g = task % nkv;
      int64_t k_head = nq + g, v_head = nq + nkv + g;
      int32_t begin = rows.offsets[static_cast<size_t>(r)], end = rows.offsets[static_cast<size_t>(r + 1)];
      for (int64_t j = begin; j < end; ++j) {
        std::fill_n(d_base + at(j, k_head), hd, 0.0f);
        std::fill_n(d_base + at(j, v_head), hd, 0.0f);
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = begin; i < end; ++i) {
          const float* q = base + at(i, h);
          const float* d_o = d_out.as<float>() + (i * nq + h) * hd;
          const float* o = out.as<float>() + (i * nq + h) * hd;
          float log_sum = lse.as<float>()[begin * nq + h * (end - begin) + (i - begin)];
          float d_dot_o = dot(d_o, o, hd);  // D_i = Σ_j p_j dP_j
          float* dq = d_base + at(i, h);
          std::fill_n(dq, hd, 0.0f);
          for (int64_t j = begin; j <= i; ++j) {
            float p = std::exp(dot(q, base + at(j, k_head), hd) * scale - log_sum);
            float dp = dot(d_o, base + at(j, v_head), hd);
            float ds = p * (dp - d_dot_o);
            axpy(ds * scale, base + at(j, k_head), dq, hd);
            axpy(ds * scale, q, d_base + at(j, k_head), hd);
            axpy(p, d_o, d_base + at(j, v_head), hd);
          }
        }
      }
    }
  });
}

void CpuOps::attention_context_forward(Tensor out, Tensor lse, Tensor qkv, Tensor whole,
                                       const ContextSpans& spans, const HeadLayout& heads) {
  const int64_t t_count = qkv.shape[0], t_all = whole.shape[0], nh = heads.total_heads(), hd = heads.head_dim;
  const int64_t nq = heads.q_heads;
  check_tensor("attention_context_forward", "qkv", qkv, DType::f32, {t_count, nh, hd});
  check_tensor("attention_context_forward", "whole", whole, DType::f32, {t_all, nh, hd});
  check_tensor("attention_context_forward", "out", out, DType::f32, {t_count, nq, hd});
  check_tensor("attention_context_forward", "lse", lse, DType::f32, {nq, t_count});
  check_context("attention_context_forward", spans, t_count, t_all);
  const int64_t group = nq / heads.kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto head_ptr = [&](const Tensor& x, int64_t t, int64_t h) { return x.as<float>() + (t * nh + h) * hd; };
  // One task per (query, q head): attention_forward's sums, over the query's keys in order.
  parallel_for(t_count * nq, 16, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    for (int64_t task = b; task < e; ++task) {
      const int64_t i = task / nq, h = task % nq;
      const int64_t kv = nq + h / group, v_head = nq + heads.kv_heads + h / group;
      const int64_t begin = spans.key_begin[static_cast<size_t>(i)],
                    end = spans.key_end[static_cast<size_t>(i)];
      const float* q = head_ptr(qkv, i, h);
      scores.resize(static_cast<size_t>(end - begin));
      float max_score = -INFINITY;
      for (int64_t j = begin; j < end; ++j) {
        float s = dot(q, head_ptr(whole, j, kv), hd) * scale;
        scores[static_cast<size_t>(j - begin)] = s;
        max_score = std::max(max_score, s);
      }
      double sum = 0.0;
      for (float s : scores) sum += std::exp(static_cast<double>(s - max_score));
      const float log_sum = max_score + static_cast<float>(std::log(sum));
      lse.as<float>()[h * t_count + i] = log_sum;
      float* o = out.as<float>() + (i * nq + h) * hd;
      std::fill_n(o, hd, 0.0f);
      for (int64_t j = begin; j < end; ++j)
        axpy(std::exp(scores[static_cast<size_t>(j - begin)] - log_sum), head_ptr(whole, j, v_head), o, hd);
    }
  });
}

void CpuOps::attention_context_backward(Tensor d_qkv, Tensor d_whole, Tensor d_out, Tensor out, Tensor lse,
                                        Tensor qkv, Tensor whole, const ContextSpans& spans,
                                        const HeadLayout& heads) {
  const int64_t t_count = qkv.shape[0], t_all = whole.shape[0], nh = heads.total_heads(), hd = heads.head_dim;
  const int64_t nq = heads.q_heads, nkv = heads.kv_heads, group = nq / nkv;
  check_tensor("attention_context_backward", "d_qkv", d_qkv, DType::f32, {t_count, nh, hd});
  check_tensor("attention_context_backward", "d_whole", d_whole, DType::f32, {t_all, nh, hd});
  check_tensor("attention_context_backward", "d_out", d_out, DType::f32, {t_count, nq, hd});
  check_tensor("attention_context_backward", "whole", whole, DType::f32, {t_all, nh, hd});
  check_context("attention_context_backward", spans, t_count, t_all);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto at = [&](int64_t t, int64_t h) { return (t * nh + h) * hd; };
  const float* q_base = qkv.as<float>();
  const float* kv_base = whole.as<float>();
  float* dq_base = d_qkv.as<float>();
  float* dkv_base = d_whole.as<float>();
  std::fill_n(dkv_base, d_whole.numel(), 0.0f);
  // One task per kv head: it owns that head's dK and dV over the whole micro-batch and the dQ
  // of the q heads in its group, so every gradient is summed by one thread in a fixed order
  // (its q heads, then this rank's queries in order, then each query's keys in order).
  parallel_for(nkv, 1, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) {
      const int64_t k_head = nq + g, v_head = nq + nkv + g;
      for (int64_t i = 0; i < t_count; ++i) {
        std::fill_n(dq_base + at(i, k_head), hd, 0.0f);
        std::fill_n(dq_base + at(i, v_head), hd, 0.0f);
      }
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < t_count; ++i) {
          const int64_t begin = spans.key_begin[static_cast<size_t>(i)];
          const int64_t end = spans.key_end[static_cast<size_t>(i)];
          const float* q = q_base + at(i, h);
          const float* d_o = d_out.as<float>() + (i * nq + h) * hd;
          const float* o = out.as<float>() + (i * nq + h) * hd;
          const float log_sum = lse.as<float>()[h * t_count + i];
          const float d_dot_o = dot(d_o, o, hd);  // D_i = Σ_j p_j dP_j
          float* dq = dq_base + at(i, h);
          std::fill_n(dq, hd, 0.0f);
          for (int64_t j = begin; j < end; ++j) {
            const float p = std::exp(dot(q, kv_base + at(j, k_head), hd) * scale - log_sum);
            const float dp = dot(d_o, kv_base + at(j, v_head), hd);
            const float ds = p * (dp - d_dot_o);
            axpy(ds * scale, kv_base + at(j, k_head), dq, hd);
            axpy(ds * scale, q, dkv_base + at(j, k_head), hd);
            axpy(p, d_o, dkv_base + at(j, v_head), hd);
          }
        }
      }
    }
  });
}

void CpuOps::attention_block_forward(Tensor out, Tensor lse, Tensor qkv, Tensor kv, Tensor keys,
                                     const ContextSpans& spans, const HeadLayout& heads) {
  const int64_t t_count = qkv.shape[0], nh = heads.total_heads(), hd = heads.head_dim, nq = heads.q_heads;
  const int64_t nkv = heads.kv_heads, group = nq / nkv;
  check_tensor("attention_block_forward", "qkv", qkv, DType::f32, {t_count, nh, hd});
  check_tensor("attention_block_forward", "out", out, DType::f32, {t_count, nq, hd});
  check_tensor("attention_block_forward", "lse", lse, DType::f32, {nq, t_count});
  check_block("attention_block_forward", spans, t_count, kv, keys, heads);
  const int64_t t_block = kv.shape[0];
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int32_t* key_index = keys.as<int32_t>();
  auto kv_ptr = [&](int64_t j, int64_t head) { return kv.as<float>() + (j * 2 * nkv + head) * hd; };
  // One task per (query, q head): attention_context_forward's sums over the block's keys
  // that lie in the query's span, in the block's order.
  parallel_for(t_count * nq, 16, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    std::vector<int64_t> seen;
    for (int64_t task = b; task < e; ++task) {
      const int64_t i = task / nq, h = task % nq, g = h / group;
      const int32_t begin = spans.key_begin[static_cast<size_t>(i)],
                    end = spans.key_end[static_cast<size_t>(i)];
      const float* q = qkv.as<float>() + (i * nh + h) * hd;
      seen.clear();
      scores.clear();
      float max_score = -INFINITY;
      for (int64_t j = 0; j < t_block; ++j) {
        if (key_index[j] < begin || key_index[j] >= end) continue;
        const float s = dot(q, kv_ptr(j, g), hd) * scale;
        seen.push_back(j);
        scores.push_back(s);
        max_score = std::max(max_score, s);
      }
      float* o = out.as<float>() + (i * nq + h) * hd;
      std::fill_n(o, hd, 0.0f);
      if (seen.empty()) {
        lse.as<float>()[h * t_count + i] = -INFINITY;
        continue;
      }
      double sum = 0.0;
      for (float s : scores) sum += std::exp(static_cast<double>(s - max_score));
      const float log_sum = max_score + static_cast<float>(std::log(sum));
      lse.as<float>()[h * t_count + i] = log_sum;
      for (size_t k = 0; k < seen.size(); ++k)
        axpy(std::exp(scores[k] - log_sum), kv_ptr(seen[k], nkv + g), o, hd);
    }
  });
}

void CpuOps::attention_block_merge(Tensor out, Tensor lse, Tensor block_out, Tensor block_lse) {
  const int64_t t_count = out.shape[0], nq = out.shape[1], hd = out.shape[2];
  check_tensor("attention_block_merge", "out", out, DType::f32, {t_count, nq, hd});
  check_tensor("attention_block_merge", "block_out", block_out, DType::f32, {t_count, nq, hd});
  check_tensor("attention_block_merge", "lse", lse, DType::f32, {nq, t_count});
  check_tensor("attention_block_merge", "block_lse", block_lse, DType::f32, {nq, t_count});
  parallel_for(t_count * nq, 64, [&](int64_t b, int64_t e) {
    for (int64_t task = b; task < e; ++task) {
      const int64_t i = task / nq, h = task % nq;
      float& l = lse.as<float>()[h * t_count + i];
      const float lb = block_lse.as<float>()[h * t_count + i];
      if (lb == -INFINITY) continue;
      float* o = out.as<float>() + (i * nq + h) * hd;
      const float* ob = block_out.as<float>() + (i * nq + h) * hd;
      if (l == -INFINITY) {
        std::copy_n(ob, hd, o);
        l = lb;
        continue;
      }
      const float most = std::max(l, lb);
      const float merged = most + static_cast<float>(std::log(std::exp(static_cast<double>(l - most)) +
                                                              std::exp(static_cast<double>(lb - most))));
      const float keep = std::exp(l - merged), add = std::exp(lb - merged);
      for (int64_t d = 0; d < hd; ++d) o[d] = o[d] * keep + ob[d] * add;
      l = merged;
    }
  });
}

void CpuOps::attention_block_backward(Tensor d_qkv, Tensor d_kv, Tensor d_out, Tensor out, Tensor lse,
                                      Tensor qkv, Tensor kv, Tensor keys, const ContextSpans& spans,
                                      const HeadLayout& heads) {
  const int64_t t_count = qkv.shape[0], nh = heads.total_heads(), hd = heads.head_dim;
  const int64_t nq = heads.q_heads, nkv = heads.kv_heads, group = nq / nkv;
  check_tensor("attention_block_backward", "qkv", qkv, DType::f32, {t_count, nh, hd});
  check_tensor("attention_block_backward", "d_qkv", d_qkv, DType::f32, {t_count, nh, hd});
  check_tensor("attention_block_backward", "d_out", d_out, DType::f32, {t_count, nq, hd});
  check_tensor("attention_block_backward", "out", out, DType::f32, {t_count, nq, hd});
  check_tensor("attention_block_backward", "lse", lse, DType::f32, {nq, t_count});
  check_block("attention_block_backward", spans, t_count, kv, keys, heads);
  const int64_t t_block = kv.shape[0];
  check_tensor("attention_block_backward", "d_kv", d_kv, DType::f32, {t_block, 2 * nkv, hd});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int32_t* key_index = keys.as<int32_t>();
  auto kv_at = [&](int64_t j, int64_t head) { return (j * 2 * nkv + head) * hd; };
  // One task per kv head, as attention_context_backward: it owns that head's dK and dV of the
  // block and the dQ of the q heads in its group, each summed by one thread in a fixed order.
  parallel_for(nkv, 1, [&](int64_t b, int64_t e) {
    for (int64_t g = b; g < e; ++g) {
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i = 0; i < t_count; ++i) {
          const int32_t begin = spans.key_begin[static_cast<size_t>(i)];
          const int32_t end = spans.key_end[static_cast<size_t>(i)];
          const float* q = qkv.as<float>() + (i * nh + h) * hd;
          const float* d_o = d_out.as<float>() + (i * nq + h) * hd;
          const float* o = out.as<float>() + (i * nq + h) * hd;
          const float log_sum = lse.as<float>()[h * t_count + i];
          const float d_dot_o = dot(d_o, o, hd);  // D_i = Σ_j p_j dP_j over every block's keys
          float* dq = d_qkv.as<float>() + (i * nh + h) * hd;
          for (int64_t j = 0; j < t_block; ++j) {
            if (key_index[j] < begin || key_index[j] >= end) continue;
            const float* k = kv.as<float>() + kv_at(j, g);
            const float p = std::exp(dot(q, k, hd) * scale - log_sum);
            const float dp = dot(d_o, kv.as<float>() + kv_at(j, nkv + g), hd);
            const float ds = p * (dp - d_dot_o);
            axpy(ds * scale, k, dq, hd);
            axpy(ds * scale, q, d_kv.as<float>() + kv_at(j, g), hd);
            axpy(p, d_o, d_kv.as<float>() + kv_at(j, nkv + g), hd);
          }
        }
      }
    }
  });
}

void CpuOps::amax(Tensor amax, Tensor x) {
  check_tensor("amax", "amax", amax, DType::f32, {1});
  if (x.dtype != DType::f32) throw_runtime_failure("amax", "x is " + dtype_name(x.dtype) + ", expected F32");
  float most = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) most = std::fmax(most, std::fabs(x.as<float>()[i]));
  amax.as<float>()[0] = most;
}

void CpuOps::fp8_cast(Tensor out, Tensor out_t, Tensor scale_inv, Tensor x, Tensor amax, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  LOOM_ASSERT(is_fp8(format), "fp8_cast needs an FP8 format");
  check_tensor("fp8_cast", "x", x, DType::f32, {r, c});
  check_tensor("fp8_cast", "amax", amax, DType::f32, {1});
  check_tensor("fp8_cast", "scale_inv", scale_inv, DType::f32, {1});
  if (out.data) check_tensor("fp8_cast", "out", out, format, {r, c});
  if (out_t.data) check_tensor("fp8_cast", "out_t", out_t, format, {c, -1});
  const int64_t ld = out_t.data ? out_t.shape[1] : r;
  if (ld < r) throw_runtime_failure("fp8_cast", "out_t " + out_t.shape.str() + " is narrower than x's rows");
  if (out_t.data) std::fill_n(out_t.as<uint8_t>(), out_t.numel(), uint8_t{0});
  const float scale = fp8_scale(amax.as<float>()[0], format);
  scale_inv.as<float>()[0] = 1.0f / scale;
  parallel_for(r, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const uint8_t q = fp8_encode(x.as<float>()[i * c + j] * scale, format);
        if (out.data) out.as<uint8_t>()[i * c + j] = q;
        if (out_t.data) out_t.as<uint8_t>()[j * ld + i] = q;
      }
  });
}

void CpuOps::fp8_gemm(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, bool accumulate,
                      bool fast_accumulation) {
  (void)fast_accumulation;  // the CPU's fp32 sums are its one accumulation
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[0];
  if (!is_fp8(a.dtype) || !is_fp8(b.dtype) || (a.dtype == DType::e5m2 && b.dtype == DType::e5m2))
    throw_runtime_failure("fp8_gemm", "a and b must be FP8, not both e5m2");
  check_tensor("fp8_gemm", "b", b, b.dtype, {n, k});
  check_tensor("fp8_gemm", "a_scale_inv", a_scale_inv, DType::f32, {1});
  check_tensor("fp8_gemm", "b_scale_inv", b_scale_inv, DType::f32, {1});
  check_tensor("fp8_gemm", "out", out, DType::f32, {m, n});
  const auto decoded = [](const Tensor& t) {
    std::vector<float> values(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < values.size(); ++i) values[i] = fp8_decode(t.as<uint8_t>()[i], t.dtype);
    return values;
  };
  const std::vector<float> av = decoded(a), bv = decoded(b);
  const float scale = a_scale_inv.as<float>()[0] * b_scale_inv.as<float>()[0];
  parallel_for(m, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = out.as<float>() + i * n;
      for (int64_t j = 0; j < n; ++j) {
        const float product =
            dot(&av[static_cast<size_t>(i * k)], &bv[static_cast<size_t>(j * k)], k) * scale;
        row[j] = accumulate ? row[j] + product : product;
      }
    }
  });
}

namespace {

void check_block_scales(const char* op, const char* name, const Tensor& scale_inv, Fp8Blocks blocks,
                        int64_t rows, int64_t cols) {
  const Shape shape = fp8_block_scales_shape(blocks, rows, cols);
  check_tensor(op, name, scale_inv, DType::f32, {shape[0], shape[1]});
}

// The `count` values of one block, x[index(i)]: their amax (NaN passed over, as amax does),
// then their FP8 bytes under the block's scale, to store(i, byte); returns the inverse scale.
template <typename Index, typename Store>
float quantize_block(const float* x, int64_t count, Index index, Store store, DType format) {
  float most = 0.0f;
  for (int64_t i = 0; i < count; ++i) most = std::fmax(most, std::fabs(x[index(i)]));
  const float scale = fp8_block_scale(most, format);
  for (int64_t i = 0; i < count; ++i) store(i, fp8_encode(x[index(i)] * scale, format));
  return 1.0f / scale;
}

int64_t block_count(int64_t n) {
  return (n + kFp8BlockSize - 1) / kFp8BlockSize;
}

}  // namespace

void CpuOps::fp8_cast_rows(Tensor out, Tensor scale_inv, Tensor x, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  LOOM_ASSERT(is_fp8(format), "fp8_cast_rows needs an FP8 format");
  check_tensor("fp8_cast_rows", "x", x, DType::f32, {r, c});
  check_tensor("fp8_cast_rows", "out", out, format, {r, c});
  check_block_scales("fp8_cast_rows", "scale_inv", scale_inv, Fp8Blocks::vec128, r, c);
  parallel_for(r, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      for (int64_t block = 0; block < block_count(c); ++block) {
        const int64_t begin = block * kFp8BlockSize, count = std::min(kFp8BlockSize, c - begin);
        const int64_t at = i * c + begin;
        uint8_t* q = out.as<uint8_t>();
        scale_inv.as<float>()[block * r + i] = quantize_block(
            x.as<float>(), count, [at](int64_t j) { return at + j; },
            [q, at](int64_t j, uint8_t v) { q[at + j] = v; }, format);
      }
  });
}

void CpuOps::fp8_cast_columns(Tensor out_t, Tensor scale_inv, Tensor x, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  LOOM_ASSERT(is_fp8(format), "fp8_cast_columns needs an FP8 format");
  check_tensor("fp8_cast_columns", "x", x, DType::f32, {r, c});
  check_tensor("fp8_cast_columns", "out_t", out_t, format, {c, -1});
  const int64_t ld = out_t.shape[1];
  if (ld < r)
    throw_runtime_failure("fp8_cast_columns", "out_t " + out_t.shape.str() + " is narrower than x's rows");
  check_block_scales("fp8_cast_columns", "scale_inv", scale_inv, Fp8Blocks::vec128, c, ld);
  parallel_for(c, 16, [&](int64_t b, int64_t e) {
    for (int64_t j = b; j < e; ++j) {
      uint8_t* q = out_t.as<uint8_t>() + j * ld;
      for (int64_t block = 0; block < block_count(ld); ++block) {
        const int64_t begin = block * kFp8BlockSize,
                      count = std::max<int64_t>(0, std::min(kFp8BlockSize, r - begin));
        scale_inv.as<float>()[block * c + j] = quantize_block(
            x.as<float>(), count, [begin, c, j](int64_t i) { return (begin + i) * c + j; },
            [q, begin](int64_t i, uint8_t v) { q[begin + i] = v; }, format);
      }
      std::fill(q + r, q + ld, uint8_t{0});
    }
  });
}

void CpuOps::fp8_cast_blocks(Tensor out, Tensor out_t, Tensor scale_inv, Tensor scale_inv_t, Tensor w,
                             DType format) {
  const int64_t r = w.shape[0], c = w.shape[1];
  LOOM_ASSERT(is_fp8(format), "fp8_cast_blocks needs an FP8 format");
  check_tensor("fp8_cast_blocks", "w", w, DType::f32, {r, c});
  check_tensor("fp8_cast_blocks", "out", out, format, {r, c});
  check_tensor("fp8_cast_blocks", "out_t", out_t, format, {c, r});
  check_block_scales("fp8_cast_blocks", "scale_inv", scale_inv, Fp8Blocks::block128x128, r, c);
  check_block_scales("fp8_cast_blocks", "scale_inv_t", scale_inv_t, Fp8Blocks::block128x128, c, r);
  std::fill_n(scale_inv.as<float>(), scale_inv.numel(), 0.0f);
  std::fill_n(scale_inv_t.as<float>(), scale_inv_t.numel(), 0.0f);
  const int64_t row_blocks = block_count(r), col_blocks = block_count(c);
  parallel_for(row_blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t bi = b; bi < e; ++bi)
      for (int64_t bj = 0; bj < col_blocks; ++bj) {
        const int64_t row0 = bi * kFp8BlockSize, col0 = bj * kFp8BlockSize;
        const int64_t rows = std::min(kFp8BlockSize, r - row0), cols = std::min(kFp8BlockSize, c - col0);
        // Index i of the block: row i / cols, column i % cols, in w, out and out_t alike.
        const auto at = [&](int64_t i) { return (row0 + i / cols) * c + col0 + i % cols; };
        const auto store = [&](int64_t i, uint8_t v) {
          const int64_t row = row0 + i / cols, col = col0 + i % cols;
          out.as<uint8_t>()[row * c + col] = v;
          out_t.as<uint8_t>()[col * r + row] = v;
        };
        const float inv = quantize_block(w.as<float>(), rows * cols, at, store, format);
        scale_inv.as<float>()[bi * scale_inv.shape[1] + bj] = inv;
        scale_inv_t.as<float>()[bj * scale_inv_t.shape[1] + bi] = inv;
      }
  });
}

void CpuOps::fp8_gemm_blocks(Tensor out, Tensor a, Tensor a_scale_inv, Fp8Blocks a_blocks, Tensor b,
                             Tensor b_scale_inv, Fp8Blocks b_blocks, bool accumulate) {
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[0];
  if (!is_fp8(a.dtype) || !is_fp8(b.dtype) || (a.dtype == DType::e5m2 && b.dtype == DType::e5m2))
    throw_runtime_failure("fp8_gemm_blocks", "a and b must be FP8, not both e5m2");
  if (a_blocks == Fp8Blocks::block128x128 && b_blocks == Fp8Blocks::block128x128)
    throw_runtime_failure("fp8_gemm_blocks",
                          "a and b are both 128x128-blocked; one must be 1x128 (cuBLASLt's rule)");
  check_tensor("fp8_gemm_blocks", "b", b, b.dtype, {n, k});
  check_block_scales("fp8_gemm_blocks", "a_scale_inv", a_scale_inv, a_blocks, m, k);
  check_block_scales("fp8_gemm_blocks", "b_scale_inv", b_scale_inv, b_blocks, n, k);
  check_tensor("fp8_gemm_blocks", "out", out, DType::f32, {m, n});
  const auto decoded = [](const Tensor& t) {
    std::vector<float> values(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < values.size(); ++i) values[i] = fp8_decode(t.as<uint8_t>()[i], t.dtype);
    return values;
  };
  const std::vector<float> av = decoded(a), bv = decoded(b);
  // The inverse scale of row `row` of an operand of `rows` rows in K-block `block`.
  const auto scale_of = [](const Tensor& s, Fp8Blocks blocks, int64_t rows, int64_t row, int64_t block) {
    if (blocks == Fp8Blocks::vec128) return s.as<float>()[block * rows + row];
    return s.as<float>()[row / kFp8BlockSize * s.shape[1] + block];
  };
  parallel_for(m, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = out.as<float>() + i * n;
      for (int64_t j = 0; j < n; ++j) {
        float product = 0.0f;
        for (int64_t block = 0; block < block_count(k); ++block) {
          const int64_t p = block * kFp8BlockSize, count = std::min(kFp8BlockSize, k - p);
          const float partial =
              dot(&av[static_cast<size_t>(i * k + p)], &bv[static_cast<size_t>(j * k + p)], count);
          product += partial * (scale_of(a_scale_inv, a_blocks, m, i, block) *
                                scale_of(b_scale_inv, b_blocks, n, j, block));
        }
        row[j] = accumulate ? row[j] + product : product;
      }
    }
  });
}

void CpuOps::swiglu_forward(Tensor out, Tensor gate_up, Tensor out_amax) {
  const int64_t t_count = gate_up.shape[0], f = gate_up.shape[1] / 2;
  check_tensor("swiglu_forward", "out", out, DType::f32, {t_count, f});
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* gate = gate_up.as<float>() + t * 2 * f;
      const float* up = gate + f;
      float* o = out.as<float>() + t * f;
      for (int64_t i = 0; i < f; ++i) o[i] = silu(gate[i]) * up[i];
    }
  });
  if (out_amax.data) amax(out_amax, out);
}

void CpuOps::swiglu_backward(Tensor d_gate_up, Tensor d_out, Tensor gate_up, Tensor out_amax) {
  const int64_t t_count = gate_up.shape[0], f = gate_up.shape[1] / 2;
  check_tensor("swiglu_backward", "d_out", d_out, DType::f32, {t_count, f});
  check_tensor("swiglu_backward", "d_gate_up", d_gate_up, DType::f32, {t_count, 2 * f});
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* gate = gate_up.as<float>() + t * 2 * f;
      const float* up = gate + f;
      const float* dy = d_out.as<float>() + t * f;
      float* d_gate = d_gate_up.as<float>() + t * 2 * f;
      float* d_up = d_gate + f;
      for (int64_t i = 0; i < f; ++i) {
        float sig = 1.0f / (1.0f + std::exp(-gate[i]));
        d_up[i] = dy[i] * gate[i] * sig;
        // d silu(g)/dg = σ(g)·(1 + g·(1 − σ(g)))
        d_gate[i] = dy[i] * up[i] * sig * (1.0f + gate[i] * (1.0f - sig));
      }
    }
  });
  if (out_amax.data) amax(out_amax, d_gate_up);
}

void CpuOps::lm_head_loss(Tensor nll, Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                          Tensor targets, float grad_scale) {
  const int64_t t_count = hidden.shape[0], h = hidden.shape[1], vocab = weight.shape[0];
  check_tensor("lm_head_loss", "weight", weight, DType::f32, {vocab, h});
  check_tensor("lm_head_loss", "targets", targets, DType::i32, {t_count});
  check_tensor("lm_head_loss", "nll", nll, DType::f32, {t_count});
  const bool backward = d_hidden.data != nullptr;
  if (backward) {
    check_tensor("lm_head_loss", "d_hidden", d_hidden, DType::f32, {t_count, h});
    if (d_weight.data) check_tensor("lm_head_loss", "d_weight", d_weight, DType::f32, {vocab, h});
  }
  const float* w = weight.as<float>();
  const int32_t* target = targets.as<int32_t>();
  lm_head_chunks(t_count, vocab, h, hidden.as<float>(),
                 backward && d_weight.data ? d_weight.as<float>() : nullptr, [&](int64_t t, float* z) {
                   if (target[t] < 0) {
                     nll.as<float>()[t] = 0.0f;
                     std::fill_n(z, vocab, 0.0f);
                     if (backward) std::fill_n(d_hidden.as<float>() + t * h, h, 0.0f);
                     return;
                   }
                   const float* x = hidden.as<float>() + t * h;
                   float max_z = -INFINITY;
                   for (int64_t v = 0; v < vocab; ++v) {
                     z[v] = dot(x, w + v * h, h);
                     max_z = std::max(max_z, z[v]);
                   }
                   double sum = 0.0;
                   for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(z[v] - max_z));
                   float log_sum = max_z + static_cast<float>(std::log(sum));
                   nll.as<float>()[t] = log_sum - z[target[t]];
                   if (!backward) return;
                   // z becomes d logits = grad_scale · (softmax − onehot).
                   for (int64_t v = 0; v < vocab; ++v) z[v] = grad_scale * std::exp(z[v] - log_sum);
                   z[target[t]] -= grad_scale;
                   float* dx = d_hidden.as<float>() + t * h;
                   std::fill_n(dx, h, 0.0f);
                   for (int64_t v = 0; v < vocab; ++v) axpy(z[v], w + v * h, dx, h);
                 });
}

void CpuOps::embedding_forward_shard(Tensor out, Tensor ids, Tensor table, int64_t vocab_begin) {
  const int64_t t_count = ids.numel(), h = table.shape[1], vocab = table.shape[0];
  check_tensor("embedding_forward_shard", "ids", ids, DType::i32, {t_count});
  check_tensor("embedding_forward_shard", "out", out, DType::f32, {t_count, h});
  const int32_t* id = ids.as<int32_t>();
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t row = id[t] - vocab_begin;
      if (row >= 0 && row < vocab)
        std::copy_n(table.as<float>() + row * h, h, out.as<float>() + t * h);
      else
        std::fill_n(out.as<float>() + t * h, h, 0.0f);
    }
  });
}

void CpuOps::embedding_backward_shard(Tensor d_table, Tensor ids, Tensor d_out, int64_t vocab_begin) {
  const int64_t t_count = ids.numel(), h = d_table.shape[1], vocab = d_table.shape[0];
  check_tensor("embedding_backward_shard", "d_out", d_out, DType::f32, {t_count, h});
  const int32_t* id = ids.as<int32_t>();
  // As embedding_backward: columns across threads, tokens in order.
  parallel_for(h, 8, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < t_count; ++t) {
      const int64_t row = id[t] - vocab_begin;
      if (row < 0 || row >= vocab) continue;
      float* dst = d_table.as<float>() + row * h;
      const float* src = d_out.as<float>() + t * h;
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

void CpuOps::lm_head_shard_forward(Tensor lse, Tensor target_logit, Tensor hidden, Tensor weight,
                                   Tensor targets, int64_t vocab_begin) {
  const int64_t t_count = hidden.shape[0], h = hidden.shape[1], vocab = weight.shape[0];
  check_tensor("lm_head_shard_forward", "weight", weight, DType::f32, {vocab, h});
  check_tensor("lm_head_shard_forward", "targets", targets, DType::i32, {t_count});
  check_tensor("lm_head_shard_forward", "lse", lse, DType::f32, {t_count});
  check_tensor("lm_head_shard_forward", "target_logit", target_logit, DType::f32, {t_count});
  const float* w = weight.as<float>();
  const int32_t* target = targets.as<int32_t>();
  parallel_for(t_count, 1, [&](int64_t b, int64_t e) {
    std::vector<float> z(static_cast<size_t>(vocab));
    for (int64_t t = b; t < e; ++t) {
      lse.as<float>()[t] = 0.0f;
      target_logit.as<float>()[t] = 0.0f;
      if (target[t] < 0) continue;
      const float* x = hidden.as<float>() + t * h;
      float max_z = -INFINITY;
      for (int64_t v = 0; v < vocab; ++v) {
        z[static_cast<size_t>(v)] = dot(x, w + v * h, h);
        max_z = std::max(max_z, z[static_cast<size_t>(v)]);
      }
      double sum = 0.0;
      for (int64_t v = 0; v < vocab; ++v)
        sum += std::exp(static_cast<double>(z[static_cast<size_t>(v)] - max_z));
      lse.as<float>()[t] = max_z + static_cast<float>(std::log(sum));
      const int64_t local = target[t] - vocab_begin;
      if (local >= 0 && local < vocab) target_logit.as<float>()[t] = z[static_cast<size_t>(local)];
    }
  });
}

void CpuOps::lm_head_shard_backward(Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                                    Tensor targets, Tensor lse, int64_t vocab_begin, float grad_scale) {
  const int64_t t_count = hidden.shape[0], h = hidden.shape[1], vocab = weight.shape[0];
  check_tensor("lm_head_shard_backward", "weight", weight, DType::f32, {vocab, h});
  check_tensor("lm_head_shard_backward", "targets", targets, DType::i32, {t_count});
  check_tensor("lm_head_shard_backward", "lse", lse, DType::f32, {t_count});
  check_tensor("lm_head_shard_backward", "d_hidden", d_hidden, DType::f32, {t_count, h});
  if (d_weight.data) check_tensor("lm_head_shard_backward", "d_weight", d_weight, DType::f32, {vocab, h});
  const float* w = weight.as<float>();
  const int32_t* target = targets.as<int32_t>();
  // As lm_head_loss: the logit gradients of 256 tokens at a time, then the weight gradient
  // over them row by row.
  lm_head_chunks(t_count, vocab, h, hidden.as<float>(), d_weight.data ? d_weight.as<float>() : nullptr,
                 [&](int64_t t, float* z) {
                   float* dx = d_hidden.as<float>() + t * h;
                   std::fill_n(dx, h, 0.0f);
                   if (target[t] < 0) {
                     std::fill_n(z, vocab, 0.0f);
                     return;
                   }
                   const float* x = hidden.as<float>() + t * h;
                   const float log_sum = lse.as<float>()[t];
                   for (int64_t v = 0; v < vocab; ++v)
                     z[v] = grad_scale * std::exp(dot(x, w + v * h, h) - log_sum);
                   const int64_t local = target[t] - vocab_begin;
                   if (local >= 0 && local < vocab) z[local] -= grad_scale;
                   for (int64_t v = 0; v < vocab; ++v) axpy(z[v], w + v * h, dx, h);
                 });
}

void CpuOps::lm_head_shard_combine(Tensor nll, Tensor lse, Tensor lse_parts, Tensor target_logit,
                                   Tensor targets) {
  const int64_t t_count = targets.numel(), parts = lse_parts.shape[0];
  check_tensor("lm_head_shard_combine", "lse_parts", lse_parts, DType::f32, {parts, t_count});
  check_tensor("lm_head_shard_combine", "nll", nll, DType::f32, {t_count});
  check_tensor("lm_head_shard_combine", "lse", lse, DType::f32, {t_count});
  check_tensor("lm_head_shard_combine", "target_logit", target_logit, DType::f32, {t_count});
  const float* part = lse_parts.as<float>();
  for (int64_t t = 0; t < t_count; ++t) {
    if (targets.as<int32_t>()[t] < 0) {
      lse.as<float>()[t] = nll.as<float>()[t] = 0.0f;
      continue;
    }
    float max_part = -INFINITY;
    for (int64_t r = 0; r < parts; ++r) max_part = std::max(max_part, part[r * t_count + t]);
    double sum = 0.0;
    for (int64_t r = 0; r < parts; ++r)
      sum += std::exp(static_cast<double>(part[r * t_count + t] - max_part));
    lse.as<float>()[t] = max_part + static_cast<float>(std::log(sum));
    nll.as<float>()[t] = lse.as<float>()[t] - target_logit.as<float>()[t];
  }
}

void CpuOps::add(Tensor out, Tensor a, Tensor b) {
  const int64_t n = a.numel();
  check_tensor("add", "a", a, DType::f32, {-1, -1});
  LOOM_ASSERT(b.numel() == n && out.numel() == n, "add takes tensors of one size");
  const float* x = a.as<float>();
  const float* y = b.as<float>();
  float* z = out.as<float>();
  parallel_for(n, 4096, [&](int64_t b0, int64_t e0) {
    for (int64_t i = b0; i < e0; ++i) z[i] = x[i] + y[i];
  });
}

void CpuOps::fill_zero(Tensor x) {
  std::memset(x.data, 0, x.nbytes());
}

namespace {

// The checks gather_rows and scatter_rows share: `rows` [>= n, H] moved to or from `full` [T, H].
void check_row_move(const char* op, const Tensor& full, const Tensor& rows, const Tensor& index) {
  const int64_t n = index.numel();
  check_tensor(op, "index", index, DType::i32, {n});
  check_tensor(op, "full rows", full, DType::f32, {-1, -1});
  check_tensor(op, "moved rows", rows, DType::f32, {-1, full.shape[1]});
  LOOM_ASSERT(rows.shape[0] >= n, std::string(op) + ": fewer moved rows than positions");
  for (int64_t i = 0; i < n; ++i)
    LOOM_ASSERT(index.as<int32_t>()[i] >= 0 && index.as<int32_t>()[i] < full.shape[0],
                std::string(op) + ": position out of range");
}

}  // namespace

void CpuOps::gather_rows(Tensor out, Tensor x, Tensor index) {
  const int64_t n = index.numel(), h = x.shape[1];
  check_row_move("gather_rows", x, out, index);
  check_tensor("gather_rows", "out", out, DType::f32, {n, h});
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(x.as<float>() + index.as<int32_t>()[i] * h, h, out.as<float>() + i * h);
}

void CpuOps::scatter_rows(Tensor out, Tensor x, Tensor index) {
  const int64_t n = index.numel(), h = out.shape[1];
  check_row_move("scatter_rows", out, x, index);
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(x.as<float>() + i * h, h, out.as<float>() + index.as<int32_t>()[i] * h);
}

void CpuOps::fp8_census(Tensor counts, Tensor amax, Tensor x, Tensor q, Tensor scale_inv,
                        std::optional<Fp8Blocks> blocks) {
  const int64_t r = x.shape[0], c = x.shape[1];
  check_tensor("fp8_census", "counts", counts, DType::i64, {2});
  check_tensor("fp8_census", "amax", amax, DType::f32, {1});
  check_tensor("fp8_census", "x", x, DType::f32, {r, c});
  if (!is_fp8(q.dtype)) throw_runtime_failure("fp8_census", "q is " + dtype_name(q.dtype) + ", expected FP8");
  check_tensor("fp8_census", "q", q, q.dtype, {r, c});
  if (blocks)
    check_block_scales("fp8_census", "scale_inv", scale_inv, *blocks, r, c);
  else
    check_tensor("fp8_census", "scale_inv", scale_inv, DType::f32, {1});
  const float bound = fp8_clamp_bound(q.dtype);
  const float* inverse = scale_inv.as<float>();
  const auto scale_inv_of = [&](int64_t i, int64_t j) {
    if (!blocks) return inverse[0];
    if (*blocks == Fp8Blocks::vec128) return inverse[(j / kFp8BlockSize) * r + i];
    return inverse[(i / kFp8BlockSize) * scale_inv.shape[1] + j / kFp8BlockSize];
  };
  float most = amax.as<float>()[0];
  int64_t flushed = 0, clamped = 0;
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) {
      const float v = x.as<float>()[i * c + j];
      most = std::fmax(most, std::fabs(v));
      if (v != 0.0f && (q.as<uint8_t>()[i * c + j] & 0x7f) == 0) ++flushed;
      if (std::fabs(v) > bound * scale_inv_of(i, j)) ++clamped;
    }
  amax.as<float>()[0] = most;
  counts.as<int64_t>()[0] += flushed;
  counts.as<int64_t>()[1] += clamped;
}

void CpuOps::moe_route_forward(Tensor expert_ids, Tensor weights, Tensor probs, Tensor logits,
                               bool normalize) {
  const int64_t t_count = logits.shape[0], e_count = logits.shape[1], k = expert_ids.shape[1];
  check_tensor("moe_route_forward", "logits", logits, DType::f32, {t_count, e_count});
  check_tensor("moe_route_forward", "probs", probs, DType::f32, {t_count, e_count});
  check_tensor("moe_route_forward", "expert_ids", expert_ids, DType::i32, {t_count, k});
  check_tensor("moe_route_forward", "weights", weights, DType::f32, {t_count, k});
  if (k < 1 || k > e_count) throw_runtime_failure("moe_route_forward", "top-k must be in [1, experts]");
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* z = logits.as<float>() + t * e_count;
      float* p = probs.as<float>() + t * e_count;
      const float top = *std::max_element(z, z + e_count);
      float total = 0.0f;
      for (int64_t i = 0; i < e_count; ++i) total += p[i] = std::exp(z[i] - top);
      for (int64_t i = 0; i < e_count; ++i) p[i] /= total;
      // Selection by repeated maximum: a strictly larger prob wins, so equal probs go to the
      // lower id.
      int32_t* ids = expert_ids.as<int32_t>() + t * k;
      float* w = weights.as<float>() + t * k;
      float chosen = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        int32_t best = -1;
        for (int64_t i = 0; i < e_count; ++i) {
          if (std::find(ids, ids + j, static_cast<int32_t>(i)) != ids + j) continue;
          if (best < 0 || p[i] > p[best]) best = static_cast<int32_t>(i);
        }
        ids[j] = best;
        chosen += w[j] = p[best];
      }
      if (normalize)
        for (int64_t j = 0; j < k; ++j) w[j] /= chosen;
    }
  });
}

void CpuOps::moe_route_backward(Tensor d_logits, Tensor d_weights, Tensor d_probs_per_expert, Tensor probs,
                                Tensor expert_ids, Tensor weights, bool normalize) {
  const int64_t t_count = probs.shape[0], e_count = probs.shape[1], k = expert_ids.shape[1];
  check_tensor("moe_route_backward", "d_logits", d_logits, DType::f32, {t_count, e_count});
  check_tensor("moe_route_backward", "d_weights", d_weights, DType::f32, {t_count, k});
  check_tensor("moe_route_backward", "expert_ids", expert_ids, DType::i32, {t_count, k});
  check_tensor("moe_route_backward", "weights", weights, DType::f32, {t_count, k});
  if (d_probs_per_expert.data)
    check_tensor("moe_route_backward", "d_probs_per_expert", d_probs_per_expert, DType::f32, {e_count});
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    std::vector<float> d_p(static_cast<size_t>(e_count));
    for (int64_t t = b; t < e; ++t) {
      const float* p = probs.as<float>() + t * e_count;
      const int32_t* ids = expert_ids.as<int32_t>() + t * k;
      const float* w = weights.as<float>() + t * k;
      const float* dw = d_weights.as<float>() + t * k;
      for (int64_t i = 0; i < e_count; ++i)
        d_p[static_cast<size_t>(i)] = d_probs_per_expert.data ? d_probs_per_expert.as<float>()[i] : 0.0f;
      // w_j = p_j / S with S = Σ_m p_m over the chosen: ∂/∂p_j = (dw_j − Σ_m dw_m · w_m) / S.
      float chosen = 0.0f, dot_w = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        chosen += p[ids[j]];
        dot_w += dw[j] * w[j];
      }
      for (int64_t j = 0; j < k; ++j)
        d_p[static_cast<size_t>(ids[j])] += normalize ? (dw[j] - dot_w) / chosen : dw[j];
      // Softmax: ∂/∂z_i = p_i · (d_p_i − Σ_e p_e · d_p_e).
      float mean = 0.0f;
      for (int64_t i = 0; i < e_count; ++i) mean += p[i] * d_p[static_cast<size_t>(i)];
      float* dz = d_logits.as<float>() + t * e_count;
      for (int64_t i = 0; i < e_count; ++i) dz[i] = p[i] * (d_p[static_cast<size_t>(i)] - mean);
    }
  });
}

void CpuOps::moe_sort(Tensor positions, Tensor offsets, Tensor expert_ids) {
  const int64_t t_count = expert_ids.shape[0], k = expert_ids.shape[1], e_count = offsets.numel() - 1;
  check_tensor("moe_sort", "positions", positions, DType::i32, {t_count, k});
  check_tensor("moe_sort", "offsets", offsets, DType::i32, {e_count + 1});
  const int32_t* ids = expert_ids.as<int32_t>();
  int32_t* start = offsets.as<int32_t>();
  std::fill_n(start, e_count + 1, 0);
  for (int64_t i = 0; i < t_count * k; ++i) {
    if (ids[i] < 0 || ids[i] >= e_count) throw_runtime_failure("moe_sort", "expert id out of range");
    ++start[ids[i] + 1];
  }
  for (int64_t e = 0; e < e_count; ++e) start[e + 1] += start[e];
  // Pairs in (token, slot) order taking the next place of their expert: a stable sort.
  std::vector<int32_t> next(start, start + e_count);
  for (int64_t i = 0; i < t_count * k; ++i) positions.as<int32_t>()[i] = next[static_cast<size_t>(ids[i])]++;
}

namespace {

void check_moe_rows(const char* op, const Tensor& tokens, const Tensor& sorted, const Tensor& positions) {
  const int64_t t_count = tokens.shape[0], k = positions.shape[1];
  check_tensor(op, "positions", positions, DType::i32, {t_count, k});
  check_tensor(op, "sorted rows", sorted, DType::f32, {-1, tokens.shape[1]});
  if (sorted.shape[0] < t_count * k) throw_runtime_failure(op, "fewer sorted rows than tokens × k");
}

}  // namespace

void CpuOps::moe_permute(Tensor sorted, Tensor x, Tensor positions) {
  const int64_t t_count = x.shape[0], h = x.shape[1], k = positions.shape[1];
  check_moe_rows("moe_permute", x, sorted, positions);
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      for (int64_t j = 0; j < k; ++j)
        std::copy_n(x.as<float>() + t * h, h, sorted.as<float>() + positions.as<int32_t>()[t * k + j] * h);
  });
}

void CpuOps::moe_permute_backward(Tensor d_x, Tensor d_sorted, Tensor positions, bool accumulate) {
  const int64_t t_count = d_x.shape[0], h = d_x.shape[1], k = positions.shape[1];
  check_moe_rows("moe_permute_backward", d_x, d_sorted, positions);
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* out = d_x.as<float>() + t * h;
      if (!accumulate) std::fill_n(out, h, 0.0f);
      for (int64_t j = 0; j < k; ++j)
        axpy(1.0f, d_sorted.as<float>() + positions.as<int32_t>()[t * k + j] * h, out, h);
    }
  });
}

void CpuOps::moe_combine_forward(Tensor out, Tensor y, Tensor positions, Tensor weights) {
  const int64_t t_count = out.shape[0], h = out.shape[1], k = positions.shape[1];
  check_moe_rows("moe_combine_forward", out, y, positions);
  check_tensor("moe_combine_forward", "weights", weights, DType::f32, {t_count, k});
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* o = out.as<float>() + t * h;
      std::fill_n(o, h, 0.0f);
      for (int64_t j = 0; j < k; ++j)
        axpy(weights.as<float>()[t * k + j], y.as<float>() + positions.as<int32_t>()[t * k + j] * h, o, h);
    }
  });
}

void CpuOps::moe_combine_backward(Tensor d_y, Tensor d_weights, Tensor d_out, Tensor y, Tensor positions,
                                  Tensor weights) {
  const int64_t t_count = d_out.shape[0], h = d_out.shape[1], k = positions.shape[1];
  check_moe_rows("moe_combine_backward", d_out, y, positions);
  check_moe_rows("moe_combine_backward", d_out, d_y, positions);
  check_tensor("moe_combine_backward", "weights", weights, DType::f32, {t_count, k});
  check_tensor("moe_combine_backward", "d_weights", d_weights, DType::f32, {t_count, k});
  parallel_for(t_count, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* g = d_out.as<float>() + t * h;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t row = positions.as<int32_t>()[t * k + j];
        const float w = weights.as<float>()[t * k + j];
        float* dy = d_y.as<float>() + row * h;
        for (int64_t c = 0; c < h; ++c) dy[c] = w * g[c];
        d_weights.as<float>()[t * k + j] = dot(g, y.as<float>() + row * h, h);
      }
    }
  });
}

namespace {

// The rows [begin, end) of a row-major [R, C] tensor, and expert e's [N, K] of an [E, N, K] one.
Tensor row_range(const Tensor& x, int64_t begin, int64_t end) {
  return Tensor{x.as<float>() + begin * x.shape[1], {end - begin, x.shape[1]}, x.dtype, x.device};
}
Tensor expert_of(const Tensor& w, int64_t e) {
  return Tensor{w.as<float>() + e * w.shape[1] * w.shape[2], {w.shape[1], w.shape[2]}, w.dtype, w.device};
}

// offsets i32[E + 1] of `experts` groups over at most `rows` rows, checked.
const int32_t* group_offsets(const char* op, const Tensor& offsets, int64_t experts, int64_t rows) {
  check_tensor(op, "offsets", offsets, DType::i32, {experts + 1});
  const int32_t* o = offsets.as<int32_t>();
  if (o[0] != 0 || o[experts] > rows) throw_runtime_failure(op, "offsets must start at 0 and end within x");
  for (int64_t e = 0; e < experts; ++e)
    if (o[e + 1] < o[e]) throw_runtime_failure(op, "offsets must not decrease");
  return o;
}

}  // namespace

void CpuOps::grouped_linear_forward(Tensor out, Tensor x, Tensor weight, Tensor offsets) {
  const int64_t r = x.shape[0], e_count = weight.shape[0], n = weight.shape[1], k = weight.shape[2];
  check_tensor("grouped_linear_forward", "weight", weight, DType::f32, {e_count, n, k});
  check_tensor("grouped_linear_forward", "x", x, DType::f32, {r, k});
  check_tensor("grouped_linear_forward", "out", out, DType::f32, {r, n});
  const int32_t* o = group_offsets("grouped_linear_forward", offsets, e_count, r);
  for (int64_t e = 0; e < e_count; ++e)
    if (o[e + 1] > o[e])
      linear_forward(row_range(out, o[e], o[e + 1]), row_range(x, o[e], o[e + 1]), expert_of(weight, e),
                     Tensor{});
}

void CpuOps::grouped_linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                                     Tensor offsets) {
  const int64_t r = d_out.shape[0], e_count = weight.shape[0], n = weight.shape[1], k = weight.shape[2];
  check_tensor("grouped_linear_backward", "weight", weight, DType::f32, {e_count, n, k});
  check_tensor("grouped_linear_backward", "d_out", d_out, DType::f32, {r, n});
  if (d_x.data) check_tensor("grouped_linear_backward", "d_x", d_x, DType::f32, {r, k});
  if (d_weight.data) {
    check_tensor("grouped_linear_backward", "d_weight", d_weight, DType::f32, {e_count, n, k});
    check_tensor("grouped_linear_backward", "x", x, DType::f32, {r, k});
  }
  const int32_t* o = group_offsets("grouped_linear_backward", offsets, e_count, r);
  for (int64_t e = 0; e < e_count; ++e) {
    if (o[e + 1] == o[e]) continue;
    linear_backward(d_x.data ? row_range(d_x, o[e], o[e + 1]) : Tensor{},
                    d_weight.data ? expert_of(d_weight, e) : Tensor{}, row_range(d_out, o[e], o[e + 1]),
                    d_weight.data ? row_range(x, o[e], o[e + 1]) : Tensor{}, expert_of(weight, e));
  }
}

void CpuOps::column_sum(Tensor out, Tensor x) {
  const int64_t r = x.shape[0], c = x.shape[1];
  check_tensor("column_sum", "x", x, DType::f32, {r, c});
  check_tensor("column_sum", "out", out, DType::f32, {c});
  std::vector<double> total(static_cast<size_t>(c), 0.0);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) total[static_cast<size_t>(j)] += x.as<float>()[i * c + j];
  for (int64_t j = 0; j < c; ++j) out.as<float>()[j] = static_cast<float>(total[static_cast<size_t>(j)]);
}

void CpuOps::copy_from_host(Tensor x, const void* in) {
  std::memcpy(x.data, in, static_cast<size_t>(x.numel()) * dtype_size(x.dtype));
}

void CpuOps::copy_to_host(void* out, Tensor x) {
  std::memcpy(out, x.data, static_cast<size_t>(x.numel()) * dtype_size(x.dtype));
}

double CpuOps::sum(Tensor x) {
  LOOM_ASSERT(x.dtype == DType::f32, "sum takes an f32 tensor");
  double total = 0.0;
  const float* values = x.as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) total += values[i];
  return total;
}

}  // namespace loom
