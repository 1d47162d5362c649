// The plan's dry run (docs/plan.md, "Memory"): the real decoder (model/decoder.h) runs one
// micro-batch's forward and backward of a pipeline stage on the shape-only backend
// (ops/shape/shape_ops.h), every tensor coming from a counting arena laid out by the
// engine's own policy (core/block_arena.h), each arena standing for one of the CUDA
// engine's (train/cuda_param_store.cpp, ops/cuda/cuda_ops.h). What those arenas reserve
// after the pass is what the engine's reserve from its second step on: the plan does not
// restate the model's tensors, so a tensor the model adds is counted without a plan change.
#pragma once

#include <cstdint>

#include "ops/shape/shape_ops.h"
#include "plan/plan.h"

namespace loom {

// What one GPU of pipeline stage `stage` reserves in each arena the model's pass fills.
struct StageArenas {
  // One micro-batch's activation arena (train/cuda_param_store.cpp DeviceSlotArenas): its
  // token ids and targets, the forward's kept tensors and, where the stage has one slot
  // (the last stage), the backward's buffers too. A stage holds `in_flight` of them.
  int64_t slot = 0;
  // Its peak in use: below `slot` where temporaries freed within the pass (FP8 operands between
  // GEMMs) left gaps that a larger later request could not use, so it took a block of its own.
  int64_t slot_peak = 0;
  // Stages with several slots run every backward in one arena of its own.
  int64_t backward = 0;
  // The input gradient a stage copies out before it sends it back (every stage but the first).
  int64_t send = 0;
  int64_t workspace = 0;    // the op workspace arena (ops/cuda/cuda_ops.h)
  int64_t tables = 0;       // token positions, the RoPE table, THD arrays, the reduction result
  int64_t fp8_weights = 0;  // the FP8 weight cache (model/linear.h), workload.precision fp8
  // What the workspace's largest requests were: the lm_head's logits chunk (last stage) and
  // cuDNN's SDPA backward workspace (the GUESS of ops/shape/shape_ops.h).
  int64_t logits = 0, sdpa_backward = 0;
  // Under EP, the rows of the one sparse layer the pass routes at the dispatch's worst case,
  // every token of every EP rank's micro-batch to this GPU's experts (ep · T·k; dry_run.cpp
  // EpRouting), the others' T·k.
  int64_t dispatch_rows = 0;
  // layout.activation_offload (ops/activation_offload.h): its three device slots of a chunk
  // input each, and the chunk inputs it keeps in pinned host memory.
  int64_t offload_slots = 0, offload_host = 0;
};

StageArenas stage_dry_run(const PlanInput& input, const MicroBatchShape& micro, int64_t stage);

// The work of the same pass (docs/plan.md, "Time"), routed evenly over the EP ranks: what its
// ops did, by class (ops/shape/shape_ops.h OpWork), and of that what recompute redoes: the difference to the
// pass without recompute, whose forward keeps what recompute's redoes.
struct StageOps {
  OpCounts pass, recompute;
  // layout.activation_offload: the chunk inputs a micro-batch copies to the host (and back),
  // and the bytes of the largest.
  int64_t offloaded_inputs = 0, offloaded_input_bytes = 0;
};

StageOps stage_ops(const PlanInput& input, const MicroBatchShape& micro, int64_t stage);

}  // namespace loom
