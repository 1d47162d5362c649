// `loom plan`: the per-GPU memory and the step time of a layout, before launch.
//
// Memory (memory_model.cpp) is what the CUDA engine's arenas reserve (train/cuda_param_store.cpp,
// core/block_arena.h), each holding its pass's peak from the second step on, so max_mem_gib
// (metrics.jsonl) is their sum. Per pipeline stage:
//   weights     2 B · params on this GPU (1/tp of each matmul, this stage's layers)
//   main grads  4 B · params
//   optimizer   (8 B Adam m, v + 2 B int16 remainder) · params / dp (distributed optimizer),
//               less layout.offload.optimizer_fraction of it, which lives on the CPU
//   the rest    the dry run (dry_run.h): the real model's forward and backward of one
//               micro-batch of the stage on the shape-only backend (ops/shape/shape_ops.h),
//               its tensors in counting arenas laid out as the engine's: the activation arena
//               of a micro-batch, times the micro-batches in flight under 1F1B (stage s of pp
//               holds min(pp - s, M)), the backward's arena, the op workspace (the kernels'
//               own sizing functions, ops/op_workspace.h; cuDNN's SDPA workspace a GUESS), the
//               position and RoPE tables, the FP8 weight cache
// and, outside the arenas, the CUDA context, cuBLASLt's workspace, NCCL's buffers and the
// allocator's slack: what must also fit on the GPU. A layout fits when the stage with
// the most memory fits the GPU's capacity.
//
// Time (time_model.cpp) per micro-batch and stage: the GEMM, attention and elementwise
// work the dry run's ops record (dry_run.h stage_ops) at the measured rates of
// PlanConstants, TP collectives and PP sends at link bandwidth; the step is (M + pp - 1)
// micro-batch slots of the slowest stage (the 1F1B bubble is the pp - 1 extra), then the
// DP reduce-scatter / all-gather and the optimizer step (HBM-bound on the GPU, PCIe- and
// host-bound for the offloaded share).
// tokens/s/GPU = global_batch · row_tokens / gpus / step time; MFU = 6 · N · tokens/s/GPU / peak.
// Isolated packing (several samples a row): the dry run's micro-batch has the spans the
// plan knows (a row store's), else whole rows, an upper bound on its attention's work.
// train.eval adds a forward-only pass over the held-out rows every `every` steps, outside
// the step time and the measurement: its time is reported on its own (TimePlan::eval_s);
// it keeps no activations beyond one micro-batch's, fewer than training's, so it adds no
// memory term.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/config.h"
#include "ops/ops.h"
#include "plan/plan_constants.h"
#include "recipe/recipe.h"

namespace loom {

struct PlanInput {
  ModelConfig model;
  std::string model_name;
  WorkloadSpec workload;
  LayoutSpec layout;
  GpuSpec gpu;
  std::string gpu_source;  // where the GPU came from: "gpu.type", "gpu.instance ...", or the default
  int64_t gpus_per_node = 8;
  PlanConstants constants;
  // The CUDA engine runs cuDNN's SDPA backward one row a call (ops/cuda/attention.h): half
  // the workspace at two rows, a slower attention backward (docs/performance.md).
  // plan_layout sets it when the micro-batch's rows in one call do not fit.
  bool attention_backward_by_row = false;
  // train.checkpoint.every > 0: the writing rank holds a checkpoint's state on the host.
  bool checkpoints = false;
  // train.eval: the rows of an evaluation (max_rows, else the eval row store's manifest;
  // 0 when neither says, e.g. a .jsonl without max_rows) and its period; every 0: no eval.
  int64_t eval_rows = 0, eval_every = 0;
  // Sample-isolated rows (train/rows.h) from a row store: each row's attention spans (its
  // samples, and its padding when it has some) and the longest of them, in the store's order;
  // empty for rows packing and for a .jsonl (not read before the run). The CUDA engine runs a
  // micro-batch of them as THD, and cuDNN's deterministic backward takes a workspace of
  // each call's bucketed span count times its bucketed longest span (isolated_attention_tokens).
  std::vector<int32_t> isolated_spans, isolated_longest;
  int64_t steps = 0;  // train.steps: which rows the run's micro-batches hold
  // The lm_head's rows of a micro-batch that holds positions without a target (a loss mask,
  // padding): it runs on its loss rows alone, padded to a multiple of kLossRowsGranule, where
  // they are fewer than its tokens (model/decoder.h MicroBatch). The data is not read before the
  // run, so -1 counts the most (the largest multiple of the granule below the tokens); 0: none
  // (rows with a target at every position but a row's last); else that many.
  int64_t loss_rows = -1;
  // train.lora: the base frozen, the adapters the only trained parameters.
  LoraConfig lora;
};

// That micro-batch's spans and longest span (both 0 without isolated rows).
struct IsolatedShape {
  int64_t spans = 0, longest = 0;
};
// The bucketed tokens (sequences × longest, ops/thd_groups.h) of the largest THD backward call
// over the run's micro-batches: the CUDA engine splits a micro-batch's spans into calls of at
// most a bound of workspace (a span that alone asks more, alone), and cuDNN's deterministic
// backward takes a workspace of its call's bucketed shape. The micro-batch is taken as its
// longest span, then its other spans sharing the rest of its tokens
// (isolated_micro_batch_spans); 0 without isolated rows. With fixed-length rows a
// micro-batch is `rows` consecutive rows of its step's global_batch
// (parallel/micro_batching.h), a step's rows consecutive in the store's order.
int64_t isolated_attention_tokens(const PlanInput& in, int64_t rows);
// The run's micro-batch of `rows` rows with the largest such call.
IsolatedShape isolated_attention_shape(const PlanInput& in, int64_t rows);
// The spans the plan's dry run gives a micro-batch of `rows` rows of `row_tokens`: with an
// isolated shape its longest span first, its other spans sharing the rest of the tokens;
// without one (spans 0 or 1) the rows.
RowSpans isolated_micro_batch_spans(const IsolatedShape& iso, int64_t rows, int64_t row_tokens);

// The recipe's model, workload, layout and GPU. The GPU is gpu.type, else the GPU of
// gpu.instance's price-table entry, else gpu.memory_gb alone, else an H200 (what loom is
// measured on; the output says so). InputError for a gpu.type the table does not know
// and no gpu.memory_gb to plan it with.
PlanInput plan_input_from_recipe(const Recipe& recipe);

// How the global batch falls into micro-batches (parallel/micro_batching.h, fixed rows).
struct MicroBatchShape {
  int64_t rows = 0;           // rows in the largest micro-batch
  int64_t tokens = 0;         // its tokens (over cp GPUs)
  int64_t micro_batches = 0;  // per DP rank per step: M
  int64_t row_tokens = 0;
};

struct MemoryTerm {
  std::string name;  // short, stable: the key calibration reads ("weights", "activations")
  std::string what;  // how it is computed, in words
  int64_t bytes = 0;
  bool in_arenas = true;  // counted by the engine's max_mem_gib
};

struct StageMemory {
  int64_t stage = 0;
  int64_t layers = 0;
  int64_t in_flight = 0;  // micro-batches whose activations it holds at once
  int64_t params = 0;     // parameters on this GPU
  std::vector<MemoryTerm> terms;
  int64_t arena_bytes() const;   // what max_mem_gib reports
  int64_t device_bytes() const;  // all of it: what must fit
  // The host memory a GPU's process takes beyond its own code and libraries: the offloaded
  // optimizer's pinned state, the weights' load and save pieces, a checkpoint's state.
  std::vector<MemoryTerm> host_terms;
  int64_t host_bytes() const;
};

struct MemoryPlan {
  std::vector<StageMemory> stages;
  size_t peak_stage = 0;  // index of the stage with the most device bytes
  const StageMemory& peak() const { return stages[peak_stage]; }
};

struct TimeTerm {
  std::string name;
  std::string what;
  double seconds = 0;  // per step
};

struct TimePlan {
  std::vector<TimeTerm> terms;  // per step, on the slowest stage; they add up to step_s
  double micro_batch_s = 0;     // one micro-batch's forward + backward on the slowest stage
  double bubble_fraction = 0;   // (pp - 1) / (M + pp - 1)
  double step_s = 0;
  double tokens_per_s_per_gpu = 0;
  double mfu = 0;
  // train.eval: one evaluation's seconds, (its micro-batches per DP rank + pp − 1) forward
  // slots of a third of micro_batch_s (a forward is about a third of forward + backward).
  double eval_s = 0;
};

struct Plan {
  PlanInput input;
  MicroBatchShape micro;
  MemoryPlan memory;
  TimePlan time;
  bool fits = false;  // the fullest stage's device bytes ≤ the GPU's usable bytes
};

MicroBatchShape plan_micro_batches(const WorkloadSpec& workload, const LayoutSpec& layout);
MemoryPlan plan_memory(const PlanInput& input, const MicroBatchShape& micro);
TimePlan plan_time(const PlanInput& input, const MicroBatchShape& micro);
// All of it, with input.attention_backward_by_row set as the engine will run it (plan.input
// says which). InputError when the global batch cannot be split over dp.
Plan plan_layout(const PlanInput& input);

// The terminal table and the machine form (every term and constant separately).
std::string plan_to_text(const Plan& plan);
nlohmann::json plan_to_json(const Plan& plan);
// For `loom train`: the recipe's plan; with `require_fit`, InputError (exit 2) with the
// breakdown when the layout does not fit its GPU (docs/interface.md: `--force` skips this).
Plan plan_for_training(const Recipe& recipe, bool require_fit);

// One line: "TP4 PP2 DP1 SP, 2 × 8,192 tokens, recompute none, offload none".
std::string plan_layout_label(const PlanInput& input, const MicroBatchShape& micro);

}  // namespace loom
