#include "model/qwen3.h"

#include "core/error.h"

namespace loom {

std::vector<Tensor> param_views(const ParamTable& table, float* flat) {
  std::vector<Tensor> views;
  views.reserve(table.params.size());
  for (const ParamSpec& p : table.params)
    views.push_back(Tensor{flat + p.offset, p.shape, DType::f32, Device::cpu});
  return views;
}

Qwen3Model::Qwen3Model(const Qwen3Config& config, const ParamTable& table, Ops& ops,
                       RecomputePolicy recompute)
    : config_(config),
      table_(table),
      ops_(ops),
      heads_{config.num_attention_heads, config.num_key_value_heads, config.head_dim},
      recompute_(recompute),
      chunks_(recompute_chunks(recompute, config.num_hidden_layers)),
      eps_(static_cast<float>(config.rms_norm_eps)),
      theta_(static_cast<float>(config.rope_theta)) {}

const Tensor& Qwen3Model::param(const ModelTensors& tensors, ParamKind kind, int64_t layer) const {
  int index = kind == ParamKind::lm_head ? table_.lm_head_param() : table_.find(kind, layer);
  LOOM_ASSERT(index >= 0, "parameter missing from the table");
  return tensors.params[static_cast<size_t>(index)];
}

const Tensor& Qwen3Model::grad(const ModelTensors& tensors, ParamKind kind, int64_t layer) const {
  int index = kind == ParamKind::lm_head ? table_.lm_head_param() : table_.find(kind, layer);
  LOOM_ASSERT(index >= 0, "parameter missing from the table");
  return tensors.grads[static_cast<size_t>(index)];
}

void Qwen3Model::attention_core_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l,
                                        LayerActivations& x) {
  ops_.qk_norm_rope_forward(x.qkv_rot, x.qk_rstd, x.qkv, param(w, ParamKind::q_norm, l),
                            param(w, ParamKind::k_norm, l), batch.rows, heads_, eps_, theta_);
  ops_.attention_forward(x.attn, x.lse, x.qkv_rot, batch.rows, heads_);
}

void Qwen3Model::layer_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l, LayerActivations& x,
                               const LayerActivations* prev, TensorAllocator& scratch,
                               const AttentionCore* core) {
  const int64_t t = batch.ids.numel(), h = config_.hidden_size, f = config_.intermediate_size;
  const int64_t nq = heads_.q_heads, nh = heads_.total_heads(), hd = heads_.head_dim;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };

  if (!x.norm1.data) {
    x.norm1 = alloc({t, h}, act, "input norm output");
    x.rstd1 = alloc({t}, DType::f32, "input norm rstd");
    if (x.residual_in.data) {
      ops_.rmsnorm_forward(x.norm1, x.rstd1, x.residual_in, param(w, ParamKind::input_norm, l), eps_);
    } else {
      LOOM_ASSERT(prev, "layer_forward needs the layer's input or the previous layer");
      x.residual_in = alloc({t, h}, act, "residual stream");
      ops_.residual_rmsnorm_forward(x.residual_in, x.norm1, x.rstd1, prev->residual_mid, prev->down,
                                    param(w, ParamKind::input_norm, l), eps_);
    }
  }
  x.qkv = alloc({t, nh, hd}, act, "qkv projection");
  ops_.linear_forward(x.qkv.reshaped({t, nh * hd}), x.norm1, param(w, ParamKind::qkv, l));
  x.qk_rstd = alloc({t, nq + heads_.kv_heads}, DType::f32, "q/k norm rstd");
  if (core) {
    x.qkv_rot = core->qkv_rot;
    x.attn = core->attn;
    x.lse = core->lse;
  } else {
    x.qkv_rot = alloc({t, nh, hd}, act, "qkv after q/k norm and rope");
    x.attn = alloc({t, nq, hd}, act, "attention output");
    x.lse = alloc({nq, t}, DType::f32, "attention log-sum-exp");
  }
  attention_core_forward(w, batch, l, x);
  Tensor o = alloc({t, h}, act, "o_proj output");
  ops_.linear_forward(o, x.attn.reshaped({t, nq * hd}), param(w, ParamKind::o_proj, l));
  x.residual_mid = alloc({t, h}, act, "residual stream");
  x.norm2 = alloc({t, h}, act, "post-attention norm output");
  x.rstd2 = alloc({t}, DType::f32, "post-attention norm rstd");
  ops_.residual_rmsnorm_forward(x.residual_mid, x.norm2, x.rstd2, x.residual_in, o,
                                param(w, ParamKind::post_attn_norm, l), eps_);
  x.gate_up = alloc({t, 2 * f}, act, "gate/up projection");
  ops_.linear_forward(x.gate_up, x.norm2, param(w, ParamKind::gate_up, l));
  x.act = alloc({t, f}, act, "swiglu output");
  ops_.swiglu_forward(x.act, x.gate_up);
  x.down = alloc({t, h}, act, "down projection");
  ops_.linear_forward(x.down, x.act, param(w, ParamKind::down, l));
}

Qwen3Model::Activations Qwen3Model::forward(const ModelTensors& w, const MicroBatch& batch,
                                            TensorAllocator& scratch) {
  const int64_t t = batch.ids.numel(), h = config_.hidden_size, layers = config_.num_hidden_layers;
  const int64_t nq = heads_.q_heads, nh = heads_.total_heads(), hd = heads_.head_dim;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };

  Activations a;
  a.embed = alloc({t, h}, act, "embedding output");
  ops_.embedding_forward(a.embed, batch.ids, param(w, ParamKind::embedding));
  // The final norm's tensors come first: under full recompute the last layer's tensors are
  // freed once the final residual add has written them.
  a.residual_final = alloc({t, h}, act, "residual stream");
  a.final_norm = alloc({t, h}, act, "final norm output");
  a.final_rstd = alloc({t}, DType::f32, "final norm rstd");
  const AttentionCore* core = nullptr;
  if (recompute_.granularity == RecomputePolicy::Granularity::selective) {
    a.core = {alloc({t, nh, hd}, act, "qkv after q/k norm and rope (recomputed)"),
              alloc({t, nq, hd}, act, "attention output (recomputed)"),
              alloc({nq, t}, DType::f32, "attention log-sum-exp (recomputed)")};
    core = &a.core;
  }
  a.layers.resize(static_cast<size_t>(layers));
  a.layers[0].residual_in = a.embed;

  size_t chunk = 0;
  for (int64_t l = 0; l < layers;) {
    if (chunk < chunks_.size() && chunks_[chunk].begin == l) {
      // A chunk of full recompute keeps only its input (stored by the layer before) and
      // writes the next layer's input before its own tensors are freed.
      const LayerChunk c = chunks_[chunk++];
      Tensor next_residual = a.residual_final, next_norm, next_rstd;
      if (c.end < layers) {
        LayerActivations& next = a.layers[static_cast<size_t>(c.end)];
        next_residual = next.residual_in = alloc({t, h}, act, "residual stream (recompute chunk input)");
        // A next layer outside any chunk keeps its norm output, so it is computed here once.
        if (chunk >= chunks_.size() || chunks_[chunk].begin != c.end) {
          next_norm = next.norm1 = alloc({t, h}, act, "input norm output");
          next_rstd = next.rstd1 = alloc({t}, DType::f32, "input norm rstd");
        }
      } else {
        next_norm = a.final_norm;
        next_rstd = a.final_rstd;
      }
      const size_t mark = scratch.mark();
      chunk_forward(w, batch, c, a, scratch);
      l = c.end;
      if (!next_norm.data) {  // the next chunk recomputes its input norm: this one is thrown away
        next_norm = alloc({t, h}, act, "input norm output (discarded)");
        next_rstd = alloc({t}, DType::f32, "input norm rstd (discarded)");
      }
      const LayerActivations& last = a.layers[static_cast<size_t>(c.end - 1)];
      const ParamKind norm = c.end < layers ? ParamKind::input_norm : ParamKind::final_norm;
      ops_.residual_rmsnorm_forward(next_residual, next_norm, next_rstd, last.residual_mid, last.down,
                                    param(w, norm, c.end < layers ? c.end : -1), eps_);
      scratch.release_to(mark);
      for (int64_t k = c.begin; k < c.end; ++k) {
        LayerActivations& x = a.layers[static_cast<size_t>(k)];
        const Tensor input = k == c.begin ? x.residual_in : Tensor{};
        x = LayerActivations{};
        x.residual_in = input;
      }
      continue;
    }
    layer_forward(w, batch, l, a.layers[static_cast<size_t>(l)],
                  l == 0 ? nullptr : &a.layers[static_cast<size_t>(l - 1)], scratch, core);
    ++l;
  }
  const LayerActivations& last = a.layers.back();
  if (last.down.data)  // else the last chunk of full recompute wrote the final norm
    ops_.residual_rmsnorm_forward(a.residual_final, a.final_norm, a.final_rstd, last.residual_mid, last.down,
                                  param(w, ParamKind::final_norm), eps_);
  return a;
}

void Qwen3Model::chunk_forward(const ModelTensors& w, const MicroBatch& batch, const LayerChunk& c,
                               Activations& a, TensorAllocator& scratch) {
  for (int64_t l = c.begin; l < c.end; ++l)
    layer_forward(w, batch, l, a.layers[static_cast<size_t>(l)],
                  l == c.begin ? nullptr : &a.layers[static_cast<size_t>(l - 1)], scratch, nullptr);
}

void Qwen3Model::forward_logits(const ModelTensors& tensors, const MicroBatch& batch,
                                TensorAllocator& scratch, Tensor logits) {
  Activations a = forward(tensors, batch, scratch);
  ops_.linear_forward(logits, a.final_norm, param(tensors, ParamKind::lm_head));
}

double Qwen3Model::forward_backward(const ModelTensors& w, const MicroBatch& batch, TensorAllocator& scratch,
                                    float grad_scale) {
  LOOM_ASSERT(w.grads.size() == w.params.size(), "forward_backward needs grads");
  const int64_t t = batch.ids.numel(), h = config_.hidden_size, f = config_.intermediate_size;
  const int64_t nq = heads_.q_heads, nh = heads_.total_heads(), hd = heads_.head_dim;
  const DType act = ops_.activation_dtype();
  auto alloc = [&](Shape shape, DType dtype, const char* what) {
    return scratch.allocate(shape, dtype, what);
  };

  Activations a = forward(w, batch, scratch);
  Tensor nll = alloc({t}, DType::f32, "per-token nll");
  Tensor d_final = alloc({t, h}, act, "final norm gradient");
  ops_.lm_head_loss(nll, d_final, grad(w, ParamKind::lm_head), a.final_norm, param(w, ParamKind::lm_head),
                    batch.targets, grad_scale);

  // d_residual is the gradient of the residual stream; the norm backwards add into it.
  Tensor d_residual = alloc({t, h}, act, "residual stream gradient");
  ops_.fill_zero(d_residual);
  ops_.rmsnorm_backward(d_residual, grad(w, ParamKind::final_norm), d_final, a.residual_final,
                        param(w, ParamKind::final_norm), a.final_rstd);
  Tensor d_act = alloc({t, f}, act, "swiglu output gradient");
  Tensor d_gate_up = alloc({t, 2 * f}, act, "gate/up gradient");
  Tensor d_norm = alloc({t, h}, act, "norm output gradient");
  Tensor d_attn = alloc({t, nq, hd}, act, "attention output gradient");
  Tensor d_qkv_rot = alloc({t, nh, hd}, act, "rotated qkv gradient");
  Tensor d_qkv = alloc({t, nh, hd}, act, "qkv gradient");
  const bool selective = recompute_.granularity == RecomputePolicy::Granularity::selective;
  size_t chunk = chunks_.size(), chunk_mark = 0;
  for (int64_t l = config_.num_hidden_layers - 1; l >= 0; --l) {
    if (chunk > 0 && chunks_[chunk - 1].end - 1 == l) {
      chunk_mark = scratch.mark();
      chunk_forward(w, batch, chunks_[chunk - 1], a, scratch);
    }
    const LayerActivations& x = a.layers[static_cast<size_t>(l)];
    // The MLP's output was added to the residual stream, so its gradient is d_residual.
    ops_.linear_backward(d_act, grad(w, ParamKind::down, l), d_residual, x.act, param(w, ParamKind::down, l));
    ops_.swiglu_backward(d_gate_up, d_act, x.gate_up);
    ops_.linear_backward(d_norm, grad(w, ParamKind::gate_up, l), d_gate_up, x.norm2,
                         param(w, ParamKind::gate_up, l));
    ops_.rmsnorm_backward(d_residual, grad(w, ParamKind::post_attn_norm, l), d_norm, x.residual_mid,
                          param(w, ParamKind::post_attn_norm, l), x.rstd2);
    if (selective) attention_core_forward(w, batch, l, a.layers[static_cast<size_t>(l)]);
    ops_.linear_backward(d_attn.reshaped({t, nq * hd}), grad(w, ParamKind::o_proj, l), d_residual,
                         x.attn.reshaped({t, nq * hd}), param(w, ParamKind::o_proj, l));
    ops_.attention_backward(d_qkv_rot, d_attn, x.attn, x.lse, x.qkv_rot, batch.rows, heads_);
    ops_.qk_norm_rope_backward(d_qkv, grad(w, ParamKind::q_norm, l), grad(w, ParamKind::k_norm, l), d_qkv_rot,
                               x.qkv, param(w, ParamKind::q_norm, l), param(w, ParamKind::k_norm, l),
                               x.qk_rstd, batch.rows, heads_, theta_);
    ops_.linear_backward(d_norm, grad(w, ParamKind::qkv, l), d_qkv.reshaped({t, nh * hd}), x.norm1,
                         param(w, ParamKind::qkv, l));
    ops_.rmsnorm_backward(d_residual, grad(w, ParamKind::input_norm, l), d_norm, x.residual_in,
                          param(w, ParamKind::input_norm, l), x.rstd1);
    if (chunk > 0 && chunks_[chunk - 1].begin == l) {
      scratch.release_to(chunk_mark);
      --chunk;
    }
  }
  ops_.embedding_backward(grad(w, ParamKind::embedding), batch.ids, d_residual);

  return ops_.sum(nll);
}

}  // namespace loom
