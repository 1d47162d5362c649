// The Qwen3 decoder, forward and backward, written against the op interface only.
//
// Per block (SEMANTICS.md):  h = rmsnorm(x);  x += o_proj(attn(rope(qk_norm(qkv(h)))));
//                            h = rmsnorm(x);  x += down(silu(gate(h)) · up(h)).
// Then the final norm and the lm_head with the shifted, masked loss. The residual add is
// fused into the following norm (residual_rmsnorm_forward), so a block's last add happens
// at the start of the next block, and the final one in front of the final norm.
#pragma once

#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/param_table.h"
#include "model/recompute.h"
#include "ops/ops.h"

namespace loom {

// A micro-batch: whole rows laid end to end. targets[t] is the token position t predicts
// (tokens[t + 1] of the same row) when loss_mask[t + 1] is 1, else -1.
struct MicroBatch {
  Tensor ids;      // i32[T]
  Tensor targets;  // i32[T]
  RowSpans rows;
};

// The weights and main grads of a model, one view per ParamTable entry.
struct ModelTensors {
  std::vector<Tensor> params;
  std::vector<Tensor> grads;  // fp32 main grads; empty for forward-only use
};

// Views of a flat buffer laid out by the table (ParamSpec::offset).
std::vector<Tensor> param_views(const ParamTable& table, float* flat);

class Qwen3Model {
 public:
  Qwen3Model(const Qwen3Config& config, const ParamTable& table, Ops& ops, RecomputePolicy recompute = {});

  // Forward and backward of one micro-batch. Returns Σ nll over its targets (unscaled);
  // adds the gradient of grad_scale · Σ nll to tensors.grads. Activations live in
  // `scratch`, released by the caller after the call.
  double forward_backward(const ModelTensors& tensors, const MicroBatch& batch, TensorAllocator& scratch,
                          float grad_scale);
  // Logits [T, V] of the micro-batch (tests and checks; the training path never forms them).
  void forward_logits(const ModelTensors& tensors, const MicroBatch& batch, TensorAllocator& scratch,
                      Tensor logits);

 private:
  struct LayerActivations {
    Tensor residual_in, norm1, rstd1, qkv, qkv_rot, qk_rstd, attn, lse;
    Tensor residual_mid, norm2, rstd2, gate_up, act, down;
  };
  // Under selective recompute every layer's attention core lives in these buffers, shared by
  // the layers and refilled in the backward.
  struct AttentionCore {
    Tensor qkv_rot, attn, lse;
  };
  struct Activations {
    Tensor embed;
    std::vector<LayerActivations> layers;
    Tensor residual_final, final_norm, final_rstd;
    AttentionCore core;
  };
  Activations forward(const ModelTensors& tensors, const MicroBatch& batch, TensorAllocator& scratch);
  // Layer l's forward into x. Its input: x.residual_in with x.norm1 already computed, or
  // x.residual_in alone (the norm is computed here), or neither: then the residual add of
  // the previous layer `prev` is fused in front of the norm.
  void layer_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l, LayerActivations& x,
                     const LayerActivations* prev, TensorAllocator& scratch, const AttentionCore* core);
  void attention_core_forward(const ModelTensors& w, const MicroBatch& batch, int64_t l, LayerActivations& x);
  // Full recompute: chunk `c`'s layers from its stored input, in the forward (whose tensors
  // are freed once the next layer's input is stored) and again before the chunk's backward.
  void chunk_forward(const ModelTensors& w, const MicroBatch& batch, const LayerChunk& c, Activations& a,
                     TensorAllocator& scratch);
  const Tensor& param(const ModelTensors& tensors, ParamKind kind, int64_t layer = -1) const;
  const Tensor& grad(const ModelTensors& tensors, ParamKind kind, int64_t layer = -1) const;

  Qwen3Config config_;
  const ParamTable& table_;
  Ops& ops_;
  HeadLayout heads_;
  RecomputePolicy recompute_;
  std::vector<LayerChunk> chunks_;  // of full recompute; empty otherwise
  float eps_;
  float theta_;
};

}  // namespace loom
