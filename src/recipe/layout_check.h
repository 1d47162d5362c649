// layout_check: whether a layout fits the model, the workload and the GPUs, checked before
// any GPU work (issue 5, item 2). Each rule names the fields it relates:
//   tp·pp·cp·dp = gpu.count                      (when the recipe names its GPUs)
//   the model's split over TP and PP (model/shard_spec.h shard_layout_check, the rules the
//     engine enforces): tp divides the heads, the KV heads (or is a multiple of them), the
//     FFN and the vocabulary; layer_split null: layers % (pp·vpp) = 0; else pp entries,
//     each at least 1 and a multiple of vpp, summing to the layers
//   max_tokens_per_gpu · cp >= row_tokens        (a micro-batch holds whole rows; with CP a
//     row spreads over cp GPUs, as slime's max_tokens_per_gpu · cp_size)
//   rows_per_microbatch · row_tokens <= max_tokens_per_gpu · cp   (when given)
//   sequence_parallel only with tp > 1, and then row_tokens % tp = 0 (rows are not padded)
//   cp > 1: row_tokens % (2·cp) = 0 (each CP rank takes two of 2·cp chunks, for balance)
//   global_batch % dp = 0                        (each DP rank takes an equal share of rows)
//   ep = 1, etp = 1, dispatcher null             (dense models have no experts)
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "recipe/recipe.h"
#include "recipe/violation.h"

namespace loom {

// The broken rules; empty when the layout fits. gpu_count: gpu.count, 0 when not given.
// The violations name fields but no file or line: recipe_load fills those in.
std::vector<Violation> layout_check(const WorkloadSpec& workload, const LayoutSpec& layout,
                                    const Qwen3Config& model, int64_t gpu_count);

}  // namespace loom
