// recipe_rules: the recipe's rules across its fields, its model and the device, the one set
// `loom recipe validate`, `loom plan` (and `--search`, which leaves out the layouts that
// break one) and `loom train` all check (issue 5, item 2; issue 38, item 3). Each rule names
// the fields it relates:
//   layout
//     tp·pp·cp·dp = gpu.count                    (when the recipe names its GPUs)
//     the model's split over TP and PP (model/shard_spec.h shard_layout_check, the rules the
//       engine enforces): tp divides the heads, the KV heads (or is a multiple of them), the
//       FFN and the vocabulary; layer_split null: layers % (pp·vpp) = 0; else pp entries,
//       each at least 1 and a multiple of vpp, summing to the layers; ep divides the experts
//     max_tokens_per_gpu · cp >= row_tokens      (a micro-batch holds whole rows; with CP a
//       row spreads over cp GPUs, as slime's max_tokens_per_gpu · cp_size)
//     rows_per_microbatch · row_tokens <= max_tokens_per_gpu · cp   (when given)
//     sequence_parallel only with tp > 1, and then row_tokens % tp = 0 (rows are not padded)
//     cp > 1: row_tokens % (2·cp) = 0 (each CP rank takes two of 2·cp chunks, for balance)
//     cp > 1: ep = 1                             (CP beside EP is not implemented yet)
//     activation_offload: recompute.granularity full (it offloads full recompute's chunk
//       inputs) and pp = 1 (its device slots serve one micro-batch at a time)
//     global_batch % dp = 0                      (each DP rank takes an equal share of rows)
//     ep: a divisor of dp (EP ranks are carved out of the DP ranks); a divisor of num_experts
//       and 1 for a dense model (the sharding spec's rules, above)
//     etp = 1, dispatcher null                   (experts split over TP are not implemented)
//   mixture of experts
//     workload.moe null for a dense model
//     workload.moe.aux_loss.kind hf only with pp = 1 (its product runs over every sparse layer)
//   device and precision
//     train.device cpu: precision fp32 or fp8 (the CPU reference computes in fp32)
//     train.device cuda: precision bf16 or fp8, and a CUDA engine on this machine (only where
//       the caller knows the machine: RuleCapabilities)
//     workload.fp8 set only with precision fp8
//   FP8 linear layers (precision fp8), over a TP rank's GEMM widths (model/shard_spec.h
//   shard_gemms: the n and k of qkv, o_proj, gate_up and down, each the n or k of the
//   forward, input-gradient and weight-gradient GEMMs; the tokens the layer pads itself)
//     bf16_first_layers + bf16_last_layers < the model's layers
//     scaling tensor on cuda: every width a multiple of 16 (cuBLASLt's FP8 GEMMs; the CPU
//       emulation takes any width)
//     scaling block with tp > 1: each rank's piece of a TP-split dimension (q and kv heads ·
//       head_dim, intermediate_size / tp) a multiple of 128, so no block straddles a shard
//       and TP ranks quantize what one rank does (any device)
//     scaling block on cuda: every width and row_tokens (the forward GEMMs' m) a multiple of
//       128 (cuBLASLt's block-scaled GEMMs and the block casts take whole blocks; the CPU
//       takes a partial last block)
//   LoRA (train.lora)
//     targets: at least one, each once; rank at most every targeted module's narrower side
//     dropout 0 and a dense model (not implemented yet)
//   train block
//     checkpoint.keep_best only with a train.eval to rank the checkpoints by
// The rules that read the model's config run only when there is one (config null: a recipe
// whose architecture could not be resolved, itself a violation recipe_load reports).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "recipe/recipe.h"
#include "recipe/violation.h"

namespace loom {

// What the machine that runs the recipe can do, as far as the caller knows: recipe/ does not
// probe the machine. `loom recipe validate` and `loom plan` judge a recipe for the machine it
// names, so they leave it unknown; `loom train` fills it in (train/engine.h
// cuda_engine_available).
struct RuleCapabilities {
  std::optional<bool> cuda_engine;  // whether a CUDA engine runs here; nullopt: not known
  std::string cuda_engine_why;      // why not, when *cuda_engine is false
};

// The broken rules, in the order above; empty when the recipe keeps them all. The violations
// name fields but no file or line: recipe_load (recipe_refuse) fills those in.
std::vector<Violation> recipe_rules(const Recipe& recipe, const ModelConfig* config,
                                    const RuleCapabilities& capabilities);

}  // namespace loom
