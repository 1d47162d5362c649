// The per-GPU memory model (plan.h): the parameter store's arenas from the stage's parameter
// count, every other arena from the dry run of the real model (dry_run.h).
#include <algorithm>
#include <string>

#include "core/block_arena.h"
#include "plan/dry_run.h"
#include "plan/plan.h"
#include "plan/shard.h"

namespace loom {
namespace {

int64_t align_up(int64_t bytes, int64_t alignment) {
  return (std::max<int64_t>(bytes, 1) + alignment - 1) / alignment * alignment;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

int64_t communicators(const LayoutSpec& layout) {
  int64_t count = layout.world_size() > 1 ? 1 : 0;
  for (int64_t size : {layout.tp, layout.cp, layout.dp, layout.pp}) count += size > 1 ? 1 : 0;
  if (layout.cp > 1 && layout.dp > 1) ++count;                // dp_cp, where gradients are reduced
  if (layout.pp > 1) ++count;                                 // the embedding group of first and last stage
  if (layout.ep > 1) count += layout.dp > layout.ep ? 2 : 1;  // EP and EDP (when it has 2+ ranks)
  return count;
}

void add_term(StageMemory& m, std::string name, std::string what, int64_t bytes, bool in_arenas = true) {
  m.terms.push_back({std::move(name), std::move(what), bytes, in_arenas});
}

// This GPU's share of the distributed optimizer (1/dp of its parameters; under EP the experts'
// 1/(dp/ep), over the EDP ranks that hold the same experts: train/rank_shard.h ShardRegion)
// and the part of it that stays on the GPU (less the offloaded fraction).
struct OptimizerShare {
  int64_t shard = 0;
  int64_t on_gpu = 0;
};

OptimizerShare optimizer_share(const GpuShard& g, int64_t stage, double offload) {
  const int64_t params = g.stage_trained_params(stage), experts = g.stage_expert_params(stage);
  const int64_t shard = g.ep == 1 || !g.stage_adapter_tensors.empty()
                            ? ceil_div(params, g.dp)
                            : ceil_div(params - experts, g.dp) + ceil_div(experts, g.dp / g.ep);
  return {shard, static_cast<int64_t>(static_cast<double>(shard) * (1.0 - offload) + 0.5)};
}

// The engine's weights, grads and optimizer arenas (train/cuda_param_store.cpp).
void add_engine_terms(StageMemory& m, const GpuShard& g, const PlanConstants& c, double offload) {
  const int64_t a = BlockArena::kAlignment;
  const int64_t n = m.params;
  const int64_t experts = g.stage_expert_params(m.stage);
  const std::string of_experts =
      experts > 0
          ? " (" + std::to_string(experts) + " of them experts'" +
                (g.ep > 1 ? ": 1/" + std::to_string(g.ep) + " of each layer's, EP " + std::to_string(g.ep)
                          : "") +
                ")"
          : "";
  // With LoRA the store holds the frozen base beside the adapters, which alone train.
  const int64_t trained = g.stage_trained_params(m.stage);
  if (g.stage_adapter_tensors.empty())
    add_term(m, "weights",
             "bf16 weights: 2 B x " + std::to_string(n) + " parameters on this GPU" + of_experts,
             align_up(2 * n, a));
  else
    add_term(m, "weights",
             "bf16 weights: 2 B x " + std::to_string(n) +
                 " parameters of the frozen base on this GPU and 2 B x " + std::to_string(trained) +
                 " of LoRA's adapters",
             align_up(2 * n, a) + align_up(2 * trained, a));
  add_term(m, "main_grads",
           std::string("fp32 main grads: 4 B a ") +
               (trained == n ? "parameter" : "trained (adapter) parameter") + " (full on every DP rank)",
           align_up(4 * trained, a));
  const OptimizerShare share = optimizer_share(g, m.stage, offload);
  // train/cuda_param_store.cpp reduce-scatters into a buffer of its own (a Comm does not
  // promise an in-place reduce-scatter); a region over one rank is its own slice, the grads
  // there: every parameter with one DP rank, the experts with one EDP rank (ep = dp).
  const int64_t edp = g.dp / g.ep;
  const int64_t regrouped = g.ep > 1 ? experts : 0;  // the experts' own region under EP
  const int64_t slice_buffer = (g.dp > 1 ? ceil_div(g.stage_params(m.stage) - regrouped, g.dp) : 0) +
                               (edp > 1 ? ceil_div(regrouped, edp) : 0);
  if (slice_buffer > 0)
    add_term(m, "main_grads.dp_slice",
             "fp32 reduce-scatter output: 4 B a parameter of 1/" + std::to_string(g.dp) +
                 (g.ep > 1 ? (edp > 1 ? "; the experts' 1/" + std::to_string(edp) + " over EDP"
                                      : "; the experts' none (one EDP rank: their slice is their grads)")
                           : ""),
             align_up(4 * slice_buffer, a));
  const std::string of = "1/" + std::to_string(g.dp) + " (distributed optimizer" +
                         (g.ep > 1 ? "; the experts' 1/" + std::to_string(g.dp / g.ep) + " over EDP" : "") +
                         ")" + (offload > 0 ? ", less the offloaded share" : "");
  add_term(m, "optimizer.adam_moments", "fp32 Adam m and v: 8 B a parameter of " + of,
           share.on_gpu > 0 ? 2 * align_up(4 * share.on_gpu, a) : 0);
  add_term(m, "optimizer.remainders", "int16 master remainders: 2 B a parameter of " + of,
           share.on_gpu > 0 ? align_up(2 * share.on_gpu, a) : 0);
  int64_t chunks = 0;
  for (int64_t size : g.stage_trained_tensor_sizes(m.stage)) chunks += ceil_div(size, c.adam_chunk_elements);
  chunks = static_cast<int64_t>(static_cast<double>(ceil_div(chunks, g.dp)) * (1.0 - offload) + 0.5);
  add_term(m, "optimizer.chunk_table", "Adam's per-chunk records (64K elements a chunk)",
           chunks > 0 ? align_up(chunks * c.adam_chunk_record_bytes, a) : 0);
  // The offload stages its copies in pinned host memory (optim/cuda_adamw.h): nothing on
  // the GPU beyond the shares above.
}

// The arenas of the model's pass (dry_run.h): the activations of the micro-batches in
// flight, the backward's own arena, the send buffer, the op workspace, the tables and the
// FP8 weight cache.
void add_dry_run_terms(StageMemory& m, const PlanInput& input, const MicroBatchShape& micro) {
  const StageArenas d = stage_dry_run(input, micro, m.stage);
  add_term(m, "activations",
           std::to_string(m.in_flight) + " micro-batch(es) in flight x " + std::to_string(d.slot) +
               " B: the activation arena of one micro-batch's pass of this stage's model (its ids and "
               "targets, the forward's kept tensors" +
               (d.backward > 0 ? ")" : ", the backward's buffers)") + "; its peak in use " +
               std::to_string(d.slot_peak) + " B, the rest gaps freed temporaries left in its blocks" +
               (d.dispatch_rows > 0
                    ? "; the experts' rows of one sparse layer at the EP dispatch's worst case, every "
                      "token of the EP group's micro-batches to this GPU's experts (" +
                          std::to_string(d.dispatch_rows) + " rows), the other layers' routed evenly"
                    : ""),
           m.in_flight * d.slot);
  if (d.backward > 0)
    add_term(m, "activations.backward", "the backward's buffers, in an arena of their own", d.backward);
  if (d.send > 0) add_term(m, "activations.pipeline_send", "the input gradient being sent back", d.send);
  const int64_t isolated_tokens = isolated_attention_tokens(input, micro.rows);
  const std::string sdpa_calls =
      isolated_tokens > 0 ? "isolated rows as THD, in calls of at most " + std::to_string(isolated_tokens) +
                                " bucketed tokens (a micro-batch's spans grouped within the workspace bound)"
      : input.attention_backward_by_row ? "one row a call: all rows in one call would not fit"
                                        : "all rows in one call";
  add_term(m, "workspace",
           "op workspace arena: lm_head logits chunk (" + std::to_string(d.logits) + " B), SDPA backward (" +
               std::to_string(d.sdpa_backward) + " B, GUESS, " + sdpa_calls + "), kernel partials",
           d.workspace);
  add_term(m, "tables", "token positions, the RoPE cos/sin table, THD arrays and the reduction result",
           d.tables);
  if (d.offload_slots > 0) {
    add_term(
        m, "activation_offload.slots",
        "layout.activation_offload: three chunk inputs on the GPU in turn (the one read, the next written "
        "or fetched, the one before on its way to the host)",
        d.offload_slots);
    m.host_terms.push_back({"host.activation_offload",
                            "pinned: full recompute's chunk inputs but the stage input, " +
                                std::to_string(m.in_flight) + " micro-batch(es) in flight",
                            m.in_flight * d.offload_host, false});
  }
  if (d.fp8_weights > 0)
    add_term(m, "fp8.weights",
             "FP8 weight cache: the FP8 linear layers' weights and transposes with their scales, and the FP8 "
             "statistics' counters",
             d.fp8_weights);
}

// What lives outside the arenas: not in max_mem_gib, but on the GPU.
void add_outside_terms(StageMemory& m, const PlanInput& input) {
  const PlanConstants& c = input.constants;
  const int64_t arenas = m.arena_bytes();
  add_term(m, "outside.cuda_context", "CUDA context and library kernels (GUESS)", c.cuda_context_bytes,
           false);
  add_term(m, "outside.cublas_workspace", "cuBLASLt workspace (gemm.h)", c.cublas_workspace_bytes, false);
  const int64_t comms = communicators(input.layout);
  if (comms > 0)
    add_term(m, "outside.nccl", std::to_string(comms) + " NCCL communicator(s) (GUESS a communicator)",
             comms * c.nccl_bytes_per_communicator, false);
  add_term(m, "outside.allocator_slack", "cudaMalloc pages and fragmentation (GUESS: a share of the arenas)",
           static_cast<int64_t>(c.allocator_slack_fraction * static_cast<double>(arenas)), false);
}

// The host: CudaAdamW's pinned block (optim/cuda_adamw.h host_bytes), the weights read in
// and final/ written out a piece at a time (fp32 piece, its bf16 bits and remainders), and a
// checkpoint's state on the writing rank, rank 0 of stage 0 (train/resume.h): a parallel
// layout gathers it whole; one GPU's engine writes it streamed where the host's
// MemAvailable does not hold a copy, so a piece is all it needs.
void add_host_terms(StageMemory& m, const GpuShard& g, const PlanInput& input, double offload) {
  const PlanConstants& c = input.constants;
  const int64_t n = m.params;
  const OptimizerShare share = optimizer_share(g, m.stage, offload);
  const int64_t offloaded = offload > 0 ? share.shard - share.on_gpu : 0;
  m.host_terms.push_back(
      {"host.optimizer_offload",
       "pinned: Adam m and v, int16 remainders and the bf16 mirror of the offloaded share (12 B a "
       "parameter), two grad staging chunks",
       offloaded > 0 ? 12 * offloaded + 2 * std::min(c.offload_chunk_elements, offloaded) * 4 : 0, false});
  m.host_terms.push_back({"host.weight_pieces", "the weights' load and final/'s save, one piece at a time",
                          8 * std::min(c.weight_piece_elements, n), false});
  const bool one_gpu = g.tp == 1 && g.pp == 1 && g.cp == 1 && g.dp == 1;
  if (input.checkpoints && m.stage == 0 && one_gpu)
    m.host_terms.push_back(
        {"host.checkpoint_state",
         "a checkpoint written streamed: one piece of fp32 values and its bf16 + remainder staging (a "
         "copy of master, m and v, 12 B a parameter, only where MemAvailable holds it: then written in "
         "the background; a resume reads in host.weight_pieces' pieces)",
         8 * std::min(c.checkpoint_piece_elements, n), false});
  else if (input.checkpoints && m.stage == 0) {
    // LoRA's checkpoints hold the adapters alone (TP keeps them whole: tp = 1).
    int64_t trained = input.model.total_params();
    if (!g.stage_adapter_tensors.empty()) {
      trained = 0;
      for (int64_t s = 0; s < g.pp; ++s) trained += g.stage_trained_params(s);
    }
    m.host_terms.push_back(
        {"host.checkpoint_state",
         "a checkpoint's master, m and v in fp32 (12 B a trained parameter of the whole model), gathered on "
         "the writing rank",
         12 * trained, false});
  }
}

}  // namespace

int64_t StageMemory::arena_bytes() const {
  int64_t total = 0;
  for (const MemoryTerm& t : terms)
    if (t.in_arenas) total += t.bytes;
  return total;
}

int64_t StageMemory::device_bytes() const {
  int64_t total = 0;
  for (const MemoryTerm& t : terms) total += t.bytes;
  return total;
}

int64_t StageMemory::host_bytes() const {
  int64_t total = 0;
  for (const MemoryTerm& t : host_terms) total += t.bytes;
  return total;
}

MemoryPlan plan_memory(const PlanInput& input, const MicroBatchShape& micro) {
  const LayoutSpec& layout = input.layout;
  const GpuShard g = gpu_shard(input.model, layout, micro, input.lora);
  MemoryPlan plan;
  const double offload = layout.offload.enabled ? layout.offload.optimizer_fraction : 0.0;
  for (int64_t s = 0; s < g.pp; ++s) {
    StageMemory m;
    m.stage = s;
    m.layers = g.stage_layers[static_cast<size_t>(s)];
    m.in_flight = std::min(g.pp - s, micro.micro_batches);
    m.params = g.stage_params(s);
    add_engine_terms(m, g, input.constants, offload);
    add_dry_run_terms(m, input, micro);
    add_outside_terms(m, input);
    add_host_terms(m, g, input, offload);
    plan.stages.push_back(std::move(m));
  }
  for (size_t s = 1; s < plan.stages.size(); ++s)
    if (plan.stages[s].device_bytes() > plan.stages[plan.peak_stage].device_bytes()) plan.peak_stage = s;
  return plan;
}

}  // namespace loom
