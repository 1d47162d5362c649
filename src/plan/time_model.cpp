// The step-time model (plan.h): the dry run's work (dry_run.h stage_ops) at measured rates,
// communication at link bandwidth, exposed but for the TP collectives the backward runs
// beside its GEMMs, and for the share PlanConstants::comm_overlap says.
#include <algorithm>
#include <string>

#include "plan/dry_run.h"
#include "plan/plan.h"
#include "plan/shard.h"

namespace loom {
namespace {

// One micro-batch's forward + backward on one stage, by kind of work (seconds); and the
// casts of the FP8 weight cache, once a step.
struct StageWork {
  double gemm = 0, attention = 0, lm_head = 0, elementwise = 0, fp8_casts = 0, recompute = 0, tp_comm = 0,
         cp_comm = 0, pp_comm = 0, ep_comm = 0, activation_offload = 0;
  double fp8_weight_casts = 0;
  double total() const {
    return gemm + attention + lm_head + elementwise + fp8_casts + recompute + tp_comm + cp_comm + pp_comm +
           ep_comm + activation_offload;
  }
};

// The time of one class of the dry run's ops at its measured rate: FLOPs for the GEMMs, the
// SDPA and the lm_head; bytes for the HBM-bound kernels and the FP8 casts.
double op_seconds(const PlanInput& in, OpWork work, const OpCount& n) {
  const PlanConstants& c = in.constants;
  switch (work) {
    case OpWork::gemm_forward: return n.flops / c.gemm_forward_flops_per_s;
    case OpWork::gemm_backward: return n.flops / c.gemm_backward_flops_per_s;
    case OpWork::fp8_gemm_forward: return n.flops / c.fp8_gemm_forward_flops_per_s;
    case OpWork::fp8_gemm_backward: return n.flops / c.fp8_gemm_backward_flops_per_s;
    case OpWork::fp8_block_gemm: return n.flops / c.fp8_block_gemm_flops_per_s;
    case OpWork::attention_forward: return n.flops / c.attention_forward_flops_per_s;
    case OpWork::attention_backward: return n.flops / c.attention_backward_flops_per_s;
    case OpWork::lm_head: return n.flops / c.lm_head_flops_per_s;
    case OpWork::elementwise:
    case OpWork::fp8_cast:
    case OpWork::fp8_weight_cast: return n.bytes / (c.elementwise_hbm_efficiency * in.gpu.hbm_bytes_per_s);
    case OpWork::count: break;
  }
  return 0;
}

StageWork stage_work(const PlanInput& in, const GpuShard& g, const MicroBatchShape& micro, int64_t s) {
  const PlanConstants& c = in.constants;
  const double t = static_cast<double>(g.tokens), seq = static_cast<double>(g.seq_tokens);
  const double layers = static_cast<double>(g.stage_layers[static_cast<size_t>(s)]);
  const double h = static_cast<double>(g.hidden);
  const double keep = 1.0 - c.comm_overlap;
  StageWork w;

  // The work: the real model's ops on one micro-batch (plan/dry_run.h), what recompute redoes
  // in a term of its own.
  const StageOps ops = stage_ops(in, micro, s);
  for (size_t k = 0; k < static_cast<size_t>(OpWork::count); ++k) {
    const auto work = static_cast<OpWork>(k);
    const double redone = op_seconds(in, work, ops.recompute.by_class[k]);
    const double seconds = op_seconds(in, work, ops.pass.by_class[k]) - redone;
    w.recompute += redone;
    switch (work) {
      case OpWork::gemm_forward:
      case OpWork::gemm_backward:
      case OpWork::fp8_gemm_forward:
      case OpWork::fp8_gemm_backward:
      case OpWork::fp8_block_gemm: w.gemm += seconds; break;
      case OpWork::attention_forward:
      case OpWork::attention_backward: w.attention += seconds; break;
      case OpWork::lm_head: w.lm_head += seconds; break;
      case OpWork::elementwise: w.elementwise += seconds; break;
      case OpWork::fp8_cast: w.fp8_casts += seconds; break;
      case OpWork::fp8_weight_cast: w.fp8_weight_casts += seconds; break;
      case OpWork::count: break;
    }
  }
  const double n = static_cast<double>(micro.row_tokens);

  const int64_t per_node = in.gpus_per_node;
  auto link = [&](int64_t span) {
    return span <= per_node ? c.nvlink_bytes_per_s : c.internode_bytes_per_s_per_gpu;
  };
  if (g.tp > 1) {
    // One activation of the layer's width, the whole micro-batch: what a collective moves.
    const double bytes = t * h * 2.0;
    const double ring = static_cast<double>(g.tp - 1) / static_cast<double>(g.tp);
    double transfers = 0;
    if (g.sp) {
      // Forward: all-gather before qkv and gate_up, reduce-scatter after o_proj and down;
      // backward the conjugates, and the norms gathered again for the weight gradients.
      transfers = layers * (4.0 + 4.0 + (c.sp_regather_in_backward ? 2.0 : 0.0)) * ring;
      if (g.last(s)) transfers += 2.0 * ring;  // the final norm's gather and its gradient's scatter
    } else {
      transfers = layers * 4.0 * 2.0 * ring;  // 2 all-reduces each way; an all-reduce moves 2×
      if (g.last(s)) transfers += 2.0 * ring;
    }
    // The backward's bulk overlap (docs/parallel.md, "What overlaps compute"): for qkv and
    // gate_up, the SP re-gather runs beside the input-gradient GEMM and the input gradient's
    // reduce-scatter (an all-reduce, two transfers, without SP) beside the weight-gradient
    // GEMM, each hidden up to that GEMM's time. The rest of the collectives are exposed.
    const double transfer = ring * bytes / link(g.tp);
    double hidden = 0;
    for (const double out_dim : {static_cast<double>(g.qkv_dim), 2.0 * static_cast<double>(g.ffn)}) {
      const double gemm = 2.0 * t * h * out_dim / c.gemm_backward_flops_per_s;  // either of the two
      const double regather = g.sp && c.sp_regather_in_backward ? transfer : 0.0;
      const double reduce = g.sp ? transfer : 2.0 * transfer;
      hidden += std::min(regather, gemm) + std::min(reduce, gemm);
    }
    w.tp_comm = keep * (transfers * bytes / link(g.tp) - layers * hidden);
  }
  if (g.cp > 1) {
    // Per layer, of the whole rows' n tokens (bf16; the heads are this GPU's TP share). A
    // layer whose attention recompute runs again (full or selective) moves its forward's part
    // again.
    const double cp = static_cast<double>(g.cp), rows = static_cast<double>(g.rows);
    const bool redone = in.layout.recompute.enabled;
    const double forwards = redone ? 2.0 : 1.0;
    if (in.layout.cp_comm == "ring") {
      // The ring (docs/parallel.md, "The ring form"): cp − 1 K/V blocks of the whole rows' n / cp
      // tokens a forward; in the backward cp − 1 blocks again and cp of their dK/dV. Each block's
      // transfer runs beside the attention of the block before it, so only what the layer's
      // attention does not cover is exposed (the design's overlap: no GPU kernel runs it yet).
      const double block = rows * n / cp * 2.0 * static_cast<double>(g.kv_heads * g.head_dim) * 2.0;
      const double moved = layers * (forwards * (cp - 1.0) + (cp - 1.0) + cp) * block / link(g.tp * g.cp);
      w.cp_comm = keep * std::max(0.0, moved - w.attention);
    } else {
      // The all-gather: every rank's qkv gathered in the forward and again in the backward,
      // the whole rows' K/V gradients reduce-scattered back; (cp − 1) / cp of each leaves the GPU.
      const double qkv = rows * n * static_cast<double>(g.qkv_dim) * 2.0;
      w.cp_comm = keep * layers * (forwards + 2.0) * (cp - 1.0) / cp * qkv / link(g.tp * g.cp);
    }
  }
  if (g.ep > 1) {
    // Each sparse layer's rows to their experts' ranks and back, forward and backward: four
    // all-to-alls of the stream's T·k rows, (ep − 1) / ep of them leaving the GPU when the
    // router spreads them evenly. The EP group's ranks are tp apart.
    const double rows = seq * static_cast<double>(g.top_k);
    const double away = static_cast<double>(g.ep - 1) / static_cast<double>(g.ep);
    const double sparse = static_cast<double>(g.stage_sparse_layers[static_cast<size_t>(s)]);
    // Full recompute runs each layer's forward again, its two exchanges with it.
    const bool redone = in.layout.recompute.enabled && in.layout.recompute.granularity == "full";
    w.ep_comm = keep * sparse * (redone ? 6.0 : 4.0) * away * rows * h * 2.0 / link(g.tp * g.ep);
  }
  if (ops.offloaded_inputs > 0) {
    // layout.activation_offload: each chunk input goes to the host beside the next chunk's
    // forward and comes back beside the backward of the chunk after it (recompute included);
    // a copy longer than that chunk's work shows. The work is split as a forward of a third
    // of the layers' work and a backward of two thirds, evenly over the stage's chunks.
    const double copy = static_cast<double>(ops.offloaded_input_bytes) / c.activation_offload_bytes_per_s;
    const double chunks = static_cast<double>(ops.offloaded_inputs + 1);
    const double layer_work = w.gemm + w.attention + w.elementwise + w.fp8_casts;
    const double forward = layer_work / 3.0 / chunks,
                 backward = (2.0 * layer_work / 3.0 + w.recompute) / chunks;
    w.activation_offload = static_cast<double>(ops.offloaded_inputs) *
                           (std::max(0.0, copy - forward) + std::max(0.0, copy - backward));
  }
  if (g.pp > 1) {
    // The activation forward and its gradient back, each way of a middle stage.
    const double bytes = seq * h * 2.0;
    const double transfers = (g.first(s) || g.last(s)) ? 2.0 : 4.0;
    w.pp_comm = keep * transfers * bytes / link(in.layout.world_size());
  }
  return w;
}

}  // namespace

TimePlan plan_time(const PlanInput& in, const MicroBatchShape& micro) {
  const PlanConstants& c = in.constants;
  const GpuShard g = gpu_shard(in.model, in.layout, micro, in.lora);
  const double m = static_cast<double>(micro.micro_batches);
  const double pp = static_cast<double>(g.pp);

  int64_t slowest = 0;
  StageWork work = stage_work(in, g, micro, 0);
  for (int64_t s = 1; s < g.pp; ++s) {
    StageWork w = stage_work(in, g, micro, s);
    if (w.total() > work.total()) {
      work = w;
      slowest = s;
    }
  }
  TimePlan plan;
  plan.micro_batch_s = work.total();
  plan.bubble_fraction = (pp - 1.0) / (m + pp - 1.0);
  const std::string per = " (" + std::to_string(micro.micro_batches) + " micro-batches on stage " +
                          std::to_string(slowest) + ", the slowest)";
  auto add = [&](std::string name, std::string what, double seconds) {
    plan.terms.push_back({std::move(name), std::move(what), seconds});
  };
  add("gemm", "layer GEMMs forward + backward" + per, m * work.gemm);
  add("attention", "cuDNN SDPA forward + backward" + per, m * work.attention);
  if (work.lm_head > 0)
    add("lm_head_loss", "chunked lm_head + loss, forward + backward" + per, m * work.lm_head);
  add("elementwise", "norms, q/k-norm + RoPE, SwiGLU (HBM-bound)" + per, m * work.elementwise);
  if (work.fp8_casts + work.fp8_weight_casts > 0)
    add("fp8_casts",
        "FP8 amax and casts of the linear layers' operands (HBM-bound)" + per + ", and of the weights once",
        m * work.fp8_casts + work.fp8_weight_casts);
  if (work.recompute > 0) add("recompute", "forward work redone in backward" + per, m * work.recompute);
  if (in.layout.activation_offload)
    add("activation_offload",
        "chunk inputs to pinned host memory and back (PCIe, a copy stream), what the neighbouring chunks' "
        "compute does not hide" +
            per,
        m * work.activation_offload);
  if (work.tp_comm > 0)
    add("tp_comm",
        std::string(g.sp ? "TP all-gathers / reduce-scatters (SP)" : "TP all-reduces") +
            ", less what the backward hides behind qkv's and gate_up's GEMMs" + per,
        m * work.tp_comm);
  if (work.cp_comm > 0)
    add("cp_comm",
        std::string(in.layout.cp_comm == "ring"
                        ? "CP ring of K/V blocks and their gradients, less what the blocks' attention hides"
                        : "CP all-gathers of qkv and reduce-scatter of the K/V gradients") +
            per,
        m * work.cp_comm);
  if (work.pp_comm > 0) add("pp_comm", "PP activation and gradient sends" + per, m * work.pp_comm);
  if (work.ep_comm > 0)
    add("ep_comm", "EP all-to-alls of the sparse layers' rows, to the experts and back, evenly routed" + per,
        m * work.ep_comm);
  if (g.pp > 1)
    add("pipeline_bubble", "(pp - 1) idle micro-batch slots of 1F1B", (pp - 1.0) * plan.micro_batch_s);

  // The optimizer's and the grads' passes cover the trained parameters (LoRA's adapters alone).
  const int64_t n = g.stage_trained_params(slowest);
  const double params = static_cast<double>(n);
  const double hbm = c.optimizer_hbm_efficiency * in.gpu.hbm_bytes_per_s;
  const double keep = 1.0 - c.comm_overlap;
  auto link = [&](int64_t span) {
    return span <= in.gpus_per_node ? c.nvlink_bytes_per_s : c.internode_bytes_per_s_per_gpu;
  };
  if (g.dp > 1) {
    // Distributed optimizer: reduce-scatter the fp32 grads, all-gather the bf16 weights; under
    // EP the experts' over their EDP group (dp / ep ranks) alone.
    const double experts = g.ep > 1 ? static_cast<double>(g.stage_expert_params(slowest)) : 0.0;
    const double ring = static_cast<double>(g.dp - 1) / static_cast<double>(g.dp);
    const int64_t edp = g.dp / g.ep;
    const double edp_ring = static_cast<double>(edp - 1) / static_cast<double>(edp);
    add("dp_comm",
        std::string("DP reduce-scatter of fp32 grads + all-gather of bf16 weights") +
            (g.ep > 1 ? " (the experts' over EDP)" : ""),
        keep * (ring * 6.0 * (params - experts) / link(g.tp * g.cp * g.dp) +
                (edp > 1 ? edp_ring * 6.0 * experts / link(g.tp * g.cp * g.dp) : 0.0)));
  }
  if (g.pp > 1 && g.tied)
    add("embedding_comm", "all-reduce of the tied embedding's grads between first and last stage",
        keep * 4.0 * static_cast<double>(g.vocab * g.hidden) / link(in.layout.world_size()));
  // Zero the grads (4 B a parameter), scale them (8 B), their norm (4 B).
  add("grad_finalize", "zero, scale and norm of the fp32 grads (HBM-bound)", 16.0 * params / hbm);
  const double shard =
      g.ep > 1 ? (params - static_cast<double>(g.stage_expert_params(slowest))) / static_cast<double>(g.dp) +
                     static_cast<double>(g.stage_expert_params(slowest)) / static_cast<double>(g.dp / g.ep)
               : params / static_cast<double>(g.dp);
  const double offload = in.layout.offload.enabled ? in.layout.offload.optimizer_fraction : 0.0;
  // Adam reads weight bits, remainder, grad, m, v (16 B) and writes all but the grad (12 B).
  add("optimizer_gpu", "precision-aware AdamW on the GPU share (28 B a parameter, HBM-bound)",
      28.0 * shard * (1.0 - offload) / hbm);
  if (offload > 0) {
    const double pcie = 6.0 * shard * offload / c.pcie_bytes_per_s;  // fp32 grads down, bf16 weights up
    const double host = 28.0 * shard * offload / c.host_optimizer_bytes_per_s;
    add("optimizer_offload",
        std::string("CPU AdamW of the offloaded share: PCIe copies and host memory, ") +
            (in.layout.offload.overlap ? "overlapped" : "in turn"),
        in.layout.offload.overlap ? std::max(pcie, host) : pcie + host);
  }

  for (const TimeTerm& t : plan.terms) plan.step_s += t.seconds;
  const double tokens = static_cast<double>(in.workload.global_batch * in.workload.row_tokens);
  plan.tokens_per_s_per_gpu = tokens / static_cast<double>(in.layout.world_size()) / plan.step_s;
  plan.mfu = 6.0 * static_cast<double>(mfu_params(in.model, in.lora)) * plan.tokens_per_s_per_gpu /
             in.gpu.peak_bf16_flops;
  return plan;
}

}  // namespace loom
