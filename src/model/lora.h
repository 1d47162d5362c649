// LoRA (docs/numerics.md, "LoRA"): a frozen base and, beside each targeted linear module of a
// decoder layer, a trainable low-rank update as PEFT computes it:
//
//   y = x · Wᵀ + scale · (x · Aᵀ) · Bᵀ,   A [r, K], B [N, r],   scale = alpha / r
//                                                              (rsLoRA: alpha / √r)
//
// The targets are the HF module names q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj and
// down_proj. loom fuses q/k/v into qkv and gate/up into gate_up (param_table.h), so a fused
// layer's targets share its input: their A's are stacked into one [J·r, K] tensor (one GEMM
// gives every target's x · Aᵀ side by side, ops.h lora_up_forward), each B adds into its
// module's rows of the fused output.
//
// The adapters live in a table of their own (lora_table_build), laid out as any ParamTable and
// named as PEFT saves them ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"),
// so that the adapter folder PEFT writes and reads is an HF checkpoint of that table.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/param_table.h"
#include "ops/ops.h"

namespace loom {

enum class LoraTarget : uint8_t { q, k, v, o, gate, up, down };
constexpr int kLoraTargets = 7;

struct LoraConfig {
  int64_t rank = 0;  // 0: no LoRA
  double alpha = 0;
  std::array<bool, kLoraTargets> targets{};
  bool rslora = false;
  double dropout = 0;  // PEFT's lora_dropout on each adapter's input, in [0, 1)

  bool enabled() const { return rank > 0; }
  bool targets_module(LoraTarget t) const { return targets[static_cast<size_t>(t)]; }
  // PEFT's scaling: alpha / r, or alpha / √r with rsLoRA.
  float scale() const {
    const double r = static_cast<double>(rank);
    return static_cast<float>(rslora ? alpha / std::sqrt(r) : alpha / r);
  }
};

// LoRA dropout (docs/numerics.md, "LoRA"): in training, adapter j of a layer reads
// x ⊙ m_j / (1 − p) instead of x, m_j a mask of its own (ops/lora_dropout.h draws it from the
// seed, the step, the layer, the target, the token's row in the step's global batch, its index
// in that row and the input column). A micro-batch carries what its masks are drawn from; an
// evaluation's (and a run's without dropout) has p = 0: no dropout.
struct LoraDropoutBatch {
  double p = 0;
  uint64_t seed = 0;  // train.seed
  int64_t step = 0;   // the optimizer step, from 1
  Tensor tokens;      // i32[T, 2]: each token's row in the step's global batch, its index in that row
  bool active() const { return p > 0; }
};

// The mask of `target`'s adapter in layer `layer` over an input whose first column is column
// `feature_begin` of the whole layer's input (a row-parallel layer's TP shard starts further on).
LoraDropoutMask lora_dropout_mask(const LoraDropoutBatch& batch, int64_t layer, LoraTarget target,
                                  int64_t feature_begin);

// "q_proj" ... "down_proj".
const char* lora_target_module(LoraTarget target);
// The target of an HF module name; false where it names none.
bool lora_target_parse(const std::string& module, LoraTarget* target);

// The fused linear layer a target belongs to (qkv, o_proj, gate_up or down), and the targets
// of a fused layer in their order within it (q, k, v; gate, up).
ParamKind lora_layer_of(LoraTarget target);
std::vector<LoraTarget> lora_layer_targets(ParamKind layer);

// The adapter tensors' kinds: a fused layer's stacked A's, and each target's B.
ParamKind lora_a_kind(ParamKind layer);
ParamKind lora_b_kind(LoraTarget target);

// The first row of `target`'s module within its fused layer's output (q 0, k q_dim, ...) and
// its row count; `tp`: within a TP rank's shard of the layer (its q and KV heads, its share of
// the FFN: model/shard_spec.h).
int64_t lora_target_row(const ModelConfig& config, LoraTarget target, int64_t tp = 1);
int64_t lora_target_rows(const ModelConfig& config, LoraTarget target);

// The adapters of every decoder layer, in layer order; within a layer for each fused layer
// with a target: its stacked A's [J·r, K] (one HF tensor per target, rows j·r ...), then each
// target's B [N_j, r]. Dense models only (a sparse layer's experts take no adapters).
ParamTable lora_table_build(const ModelConfig& config, const LoraConfig& lora);

// The N of MFU = 6 · N · tokens/s / peak (model/config.h matmul_params) for a run that trains
// `lora`: a frozen base does its forward and input-gradient GEMMs alone (4 · N a token, no
// weight gradient) and the adapters all three (6 · their parameters), so N = (4 · N_base +
// 6 · N_adapters) / 6. Without LoRA, matmul_params.
int64_t mfu_params(const ModelConfig& config, const LoraConfig& lora);

}  // namespace loom
