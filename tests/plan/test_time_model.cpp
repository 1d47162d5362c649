// The step-time model: the pipeline bubble, the cost of recompute, offload and DP, MFU's
// definition, and the measured H200 steps.
#include <gtest/gtest.h>

#include "plan/dry_run.h"
#include "plan/plan.h"
#include "plan_test_util.h"

namespace loom {
namespace {

using test::builtin_input;
using test::time_term;

TEST(PlanTime, TermsAddUpToTheStepAndDefineThroughputAndMfu) {
  const Plan plan = plan_layout(builtin_input("Qwen3-4B", 2, 8192, 8));
  double sum = 0;
  for (const TimeTerm& t : plan.time.terms) {
    EXPECT_GE(t.seconds, 0) << t.name;
    sum += t.seconds;
  }
  EXPECT_DOUBLE_EQ(sum, plan.time.step_s);
  EXPECT_NEAR(plan.time.tokens_per_s_per_gpu, 8 * 8192 / plan.time.step_s, 1e-6);
  EXPECT_NEAR(
      plan.time.mfu,
      6.0 * static_cast<double>(plan.input.model.matmul_params()) * plan.time.tokens_per_s_per_gpu / 989e12,
      1e-12);
  EXPECT_EQ(plan.time.bubble_fraction, 0.0);
  EXPECT_EQ(time_term(plan.time, "pipeline_bubble"), 0.0);
  EXPECT_EQ(time_term(plan.time, "dp_comm"), 0.0);
  EXPECT_EQ(time_term(plan.time, "tp_comm"), 0.0);
}

// train.eval: forward-only micro-batches of the held-out rows split over DP, pipelined, a
// third of a micro-batch's forward + backward each; outside the step.
TEST(PlanTime, EvalIsCountedOnItsOwn) {
  PlanInput in = builtin_input("Qwen3-4B", 2, 8192, 8);
  const Plan without = plan_layout(in);
  EXPECT_EQ(without.time.eval_s, 0.0);
  in.eval_rows = 64;
  in.eval_every = 50;
  in.layout.dp = 2;
  const Plan with = plan_layout(in);
  // 32 rows per DP rank in micro-batches of 2 rows: 16 forwards.
  EXPECT_NEAR(with.time.eval_s, 16.0 * with.time.micro_batch_s / 3.0, 1e-12);
  EXPECT_NE(plan_to_text(with).find("eval (train.eval): 64 rows every 50 steps"), std::string::npos);
  EXPECT_EQ(plan_to_json(with)["eval"]["rows"], 64);
}

// FP8 block scaling: its GEMMs at the block-scaled rate (below tensor scaling's), its output
// gradients cast twice (more bytes than tensor scaling, whose producers write nearly every
// amax), and its scales counted in memory (small beside the FP8 weights).
TEST(PlanTime, Fp8BlockScalingHasItsOwnRateCastsAndScales) {
  PlanInput in = builtin_input("Qwen3-1.7B", 2, 8192, 8);
  in.workload.precision = "fp8";
  const Plan tensor = plan_layout(in);
  in.workload.fp8.scaling = "block";
  const Plan block = plan_layout(in);
  EXPECT_GT(time_term(block.time, "gemm"), time_term(tensor.time, "gemm"));
  EXPECT_GT(time_term(block.time, "fp8_casts"), time_term(tensor.time, "fp8_casts"));
  EXPECT_GT(time_term(tensor.time, "fp8_casts"), 0.0);
  // The FP8 weight cache holds the block scales beside the weights: 4 B a 128 × 128 block
  // of each orientation, against tensor scaling's one scale and amax a weight.
  const int64_t scales =
      test::term(block.memory.stages[0], "fp8.weights") - test::term(tensor.memory.stages[0], "fp8.weights");
  EXPECT_GT(scales, 0);
  EXPECT_LT(scales, test::term(block.memory.stages[0], "fp8.weights") / 100);
  EXPECT_EQ(plan_to_json(block)["constants"]["fp8_block_gemm_flops_per_s"], 1089e12);
}

// Full recompute redoes an FP8 layer's forward in FP8: its GEMMs at the FP8 forward rate and
// its input casts, less than bf16's recomputed GEMMs at Qwen3-8B's shapes, more than the GEMMs
// alone.
TEST(PlanTime, Fp8RecomputeRedoesTheForwardInFp8) {
  PlanInput in = builtin_input("Qwen3-8B", 1, 8192, 8);
  in.layout.recompute.enabled = true;
  const Plan bf16 = plan_layout(in);
  in.workload.precision = "fp8";
  const Plan fp8 = plan_layout(in);
  EXPECT_LT(time_term(fp8.time, "recompute"), time_term(bf16.time, "recompute"));
  const PlanConstants& c = in.constants;
  const double gemm_forward_bf16 =
      time_term(bf16.time, "gemm") /
      (1 + 2 * c.gemm_forward_flops_per_s / c.gemm_backward_flops_per_s);  // the forward's third in time
  const double gemm_forward_fp8 =
      gemm_forward_bf16 * c.gemm_forward_flops_per_s / c.fp8_gemm_forward_flops_per_s;
  const double without_casts = time_term(bf16.time, "recompute") - gemm_forward_bf16 + gemm_forward_fp8;
  EXPECT_GT(time_term(fp8.time, "recompute"), without_casts);
}

// The time model's work is the dry run's record of the model's ops: its layer GEMMs are
// those of every matmul parameter, 2 FLOPs a token forward and 4 backward (6 in all), in
// bf16 or in FP8 by the precision; full recompute redoes the forward's 2; the FP8 casts move
// bytes only under FP8.
TEST(PlanTime, TheDryRunRecordsEveryGemmAndCastsOnlyUnderFp8) {
  PlanInput in = builtin_input("Qwen3-1.7B", 2, 8192);
  const MicroBatchShape micro = plan_micro_batches(in.workload, in.layout);
  const ModelConfig& m = in.model;
  const double layer_params = static_cast<double>(m.matmul_params() - m.vocab_size * m.hidden_size);
  const double forward = 2.0 * static_cast<double>(micro.tokens) * layer_params;
  const auto gemm_flops = [](const OpCounts& c) {
    return c[OpWork::gemm_forward].flops + c[OpWork::gemm_backward].flops +
           c[OpWork::fp8_gemm_forward].flops + c[OpWork::fp8_gemm_backward].flops +
           c[OpWork::fp8_block_gemm].flops;
  };
  const auto cast_bytes = [](const OpCounts& c) {
    return c[OpWork::fp8_cast].bytes + c[OpWork::fp8_weight_cast].bytes;
  };
  const StageOps bf16 = stage_ops(in, micro, 0);
  EXPECT_DOUBLE_EQ(gemm_flops(bf16.pass), 3.0 * forward);
  EXPECT_DOUBLE_EQ(bf16.pass[OpWork::gemm_forward].flops, forward);
  EXPECT_EQ(cast_bytes(bf16.pass), 0.0);
  EXPECT_EQ(gemm_flops(bf16.recompute), 0.0);

  in.layout.recompute.enabled = true;
  const StageOps recomputed = stage_ops(in, micro, 0);
  EXPECT_DOUBLE_EQ(gemm_flops(recomputed.pass), 4.0 * forward);
  EXPECT_DOUBLE_EQ(recomputed.recompute[OpWork::gemm_forward].flops, forward);
  EXPECT_GT(recomputed.recompute[OpWork::attention_forward].flops, 0.0);
  EXPECT_EQ(recomputed.recompute[OpWork::attention_backward].flops, 0.0);

  in.layout.recompute = RecomputeSpec{};
  in.workload.precision = "fp8";
  for (const char* scaling : {"tensor", "block"}) {
    SCOPED_TRACE(scaling);
    in.workload.fp8.scaling = scaling;
    const StageOps fp8 = stage_ops(in, micro, 0);
    EXPECT_DOUBLE_EQ(gemm_flops(fp8.pass), 3.0 * forward);
    EXPECT_EQ(fp8.pass[OpWork::gemm_forward].flops, 0.0);  // every layer's GEMMs in FP8
    EXPECT_GT(fp8.pass[OpWork::fp8_cast].bytes, 0.0);
    EXPECT_GT(fp8.pass[OpWork::fp8_weight_cast].bytes, 0.0);
  }
}

TEST(PlanTime, PipelineBubbleIsPpMinusOneOverMPlusPpMinusOne) {
  PlanInput in = builtin_input("Qwen3-8B", 1, 8192, 8);
  in.layout.pp = 4;
  const Plan plan = plan_layout(in);
  EXPECT_EQ(plan.micro.micro_batches, 8);
  EXPECT_DOUBLE_EQ(plan.time.bubble_fraction, 3.0 / 11.0);
  EXPECT_NEAR(time_term(plan.time, "pipeline_bubble"), 3.0 * plan.time.micro_batch_s, 1e-12);
  EXPECT_GT(time_term(plan.time, "pp_comm"), 0.0);
  // More micro-batches, a smaller bubble share.
  in.workload.global_batch = 64;
  EXPECT_LT(plan_layout(in).time.bubble_fraction, plan.time.bubble_fraction);
}

TEST(PlanTime, RecomputeCostsTimeAndOffloadAddsTheHostStep) {
  PlanInput in = builtin_input("Qwen3-8B", 2, 8192, 64);
  const Plan base = plan_layout(in);
  in.layout.recompute.enabled = true;
  in.layout.recompute.granularity = "selective";
  const Plan selective = plan_layout(in);
  in.layout.recompute.granularity = "full";
  const Plan full = plan_layout(in);
  EXPECT_GT(selective.time.step_s, base.time.step_s);
  EXPECT_GT(full.time.step_s, selective.time.step_s);
  // Full recompute redoes the forward: its GEMMs (a third of the GEMM FLOPs, at the
  // forward rate), its attention and its elementwise kernels.
  const PlanConstants& c = in.constants;
  const double forward_share =
      (1 / c.gemm_forward_flops_per_s) / (1 / c.gemm_forward_flops_per_s + 2 / c.gemm_backward_flops_per_s);
  const double gemm_forward = forward_share * time_term(base.time, "gemm");
  EXPECT_GT(time_term(full.time, "recompute"), gemm_forward);
  EXPECT_LT(time_term(full.time, "recompute"),
            gemm_forward + time_term(base.time, "attention") / 2 + time_term(base.time, "elementwise") / 2);

  in.layout.recompute = RecomputeSpec{};
  in.layout.offload.enabled = true;
  const Plan offload = plan_layout(in);
  EXPECT_EQ(time_term(offload.time, "optimizer_gpu"), 0.0);
  EXPECT_GT(time_term(offload.time, "optimizer_offload"), time_term(base.time, "optimizer_gpu"));
  in.layout.offload.overlap = false;
  EXPECT_GT(time_term(plan_layout(in).time, "optimizer_offload"),
            time_term(offload.time, "optimizer_offload"));
}

// layout.activation_offload: each of Qwen3-8B's 35 chunk inputs past the stage input (a row
// of 32,768 tokens, 256 MiB) goes to the host and back at 50 GB/s a direction, 5.4 ms a copy,
// under a layer's forward and backward of far longer: nothing shows. At 0.1 GB/s a copy takes
// 2.7 s, more than a layer's work either way: the copies show, beyond the layers' work.
TEST(PlanTime, ActivationOffloadCopiesHideUnderTheNeighbouringLayers) {
  PlanInput in = builtin_input("Qwen3-8B", 1, 32768, 1);
  in.layout.recompute.enabled = true;
  in.layout.recompute.granularity = "full";
  const Plan kept = plan_layout(in);
  in.layout.activation_offload = true;
  const Plan offloaded = plan_layout(in);
  EXPECT_EQ(time_term(offloaded.time, "activation_offload"), 0.0);
  EXPECT_EQ(offloaded.time.step_s, kept.time.step_s);
  in.constants.activation_offload_bytes_per_s = 0.1e9;
  const Plan slow = plan_layout(in);
  const double copy = 32768.0 * 4096 * 2 / 0.1e9;
  EXPECT_GT(time_term(slow.time, "activation_offload"), 0.0);
  EXPECT_LT(time_term(slow.time, "activation_offload"), 35 * 2 * copy);
  EXPECT_GT(time_term(slow.time, "activation_offload"), 35 * 2 * copy - kept.time.micro_batch_s);
  EXPECT_GT(slow.time.step_s, kept.time.step_s);
}

TEST(PlanTime, ParallelismAddsCommunication) {
  PlanInput in = builtin_input("Qwen3-8B", 2, 8192, 16);
  in.layout.dp = 2;
  const Plan dp = plan_layout(in);
  EXPECT_GT(time_term(dp.time, "dp_comm"), 0.0);
  in.layout.dp = 1;
  in.layout.tp = 2;
  in.layout.sequence_parallel = true;
  const Plan tp = plan_layout(in);
  EXPECT_GT(time_term(tp.time, "tp_comm"), 0.0);
  // TP halves the GEMM work of each GPU.
  const Plan one = plan_layout(builtin_input("Qwen3-8B", 2, 8192, 16));
  EXPECT_NEAR(time_term(tp.time, "gemm") / time_term(one.time, "gemm"), 0.5, 0.01);
  // A TP group across nodes is slower than one inside a node.
  in.gpus_per_node = 1;
  EXPECT_GT(time_term(plan_layout(in).time, "tp_comm"), 5 * time_term(tp.time, "tp_comm"));
}

// Context parallelism (docs/parallel.md, docs/plan.md): the dry run runs the CP attention of
// either form, so a CP rank's attention work is a cp-th of the whole rows' (up to the
// diagonal's n / 2 pairs a row: 1/n) in both forms; each form its own communication term, the
// all-gather's by hand: per layer (forward gather, backward gather, reduce-scatter) of
// (cp − 1) / cp of the whole rows' bf16 qkv over NVLink.
TEST(PlanTime, ContextParallelSplitsTheAttentionAndPricesEachFormsTransfers) {
  const int64_t row = 32768;
  const Plan one = plan_layout(builtin_input("Qwen3-8B", 1, row, 4));
  PlanInput in = builtin_input("Qwen3-8B", 1, row, 4);
  in.layout.cp = 4;
  in.layout.max_tokens_per_gpu = row / 4;
  const Plan gathered = plan_layout(in);
  in.layout.cp_comm = "ring";
  const Plan ring = plan_layout(in);
  EXPECT_EQ(gathered.micro.rows, 1);
  EXPECT_NEAR(4.0 * time_term(gathered.time, "attention") / time_term(one.time, "attention"), 1.0, 1e-3);
  EXPECT_NEAR(time_term(ring.time, "attention") / time_term(gathered.time, "attention"), 1.0, 1e-9);
  EXPECT_EQ(time_term(one.time, "cp_comm"), 0.0);
  const PlanConstants& c = in.constants;
  const double layers = static_cast<double>(in.model.num_hidden_layers);
  const double qkv = static_cast<double>(row) * (32 + 2 * 8) * 128 * 2.0;  // Qwen3-8B: 32 + 2·8 heads of 128
  const double m = 4;                                                      // 4 rows a step, one a micro-batch
  EXPECT_NEAR(time_term(gathered.time, "cp_comm"),
              m * (1.0 - c.comm_overlap) * layers * 3.0 * 0.75 * qkv / c.nvlink_bytes_per_s,
              1e-9 * time_term(gathered.time, "cp_comm"));
  // The ring moves K and V alone, 3·cp − 2 blocks of a quarter of the rows a layer, beside the
  // blocks' attention: far less is exposed.
  EXPECT_LT(time_term(ring.time, "cp_comm"), 0.5 * time_term(gathered.time, "cp_comm"));
  EXPECT_GT(ring.time.tokens_per_s_per_gpu, gathered.time.tokens_per_s_per_gpu);
}

// The backward runs the SP re-gathers and the input gradients' reduce-scatters (all-reduces
// without SP) of qkv and gate_up beside their GEMMs (docs/parallel.md): with a link fast
// enough for each to fit beside its GEMM, the exposed TP time is that of the other
// collectives; with a slow one, at most the GEMMs' time is hidden.
TEST(PlanTime, TheBackwardHidesItsOverlappedTpCollectivesUpToTheirGemms) {
  PlanInput in = builtin_input("Qwen3-8B", 2, 8192, 16);
  in.layout.tp = 2;
  const PlanConstants& c = in.constants;
  const double layers = static_cast<double>(in.model.num_hidden_layers);
  const double bytes = 16384.0 * 4096.0 * 2.0, ring = 0.5, m = 8;  // 16 rows, 2 a micro-batch
  const auto unhidden = [&](double transfers_a_layer, double link) {
    return m * (layers * transfers_a_layer + 2.0) * ring * bytes / link;
  };
  for (const bool sp : {true, false}) {
    in.layout.sequence_parallel = sp;
    in.gpus_per_node = 8;
    // SP: 10 transfers a layer, 4 hidden; TP alone: 4 all-reduces (8 transfers), 2 hidden.
    const double all = sp ? 10.0 : 8.0, exposed = sp ? 6.0 : 4.0;
    SCOPED_TRACE(sp ? "tp2 + sp" : "tp2");
    EXPECT_NEAR(time_term(plan_layout(in).time, "tp_comm"), unhidden(exposed, c.nvlink_bytes_per_s),
                1e-9 * unhidden(all, c.nvlink_bytes_per_s));
    // Across slow nodes a collective outlasts its GEMM: only the GEMMs' time is taken off,
    // both of qkv's and gate_up's backward GEMMs under SP, the weight-gradient one without.
    in.gpus_per_node = 1;
    in.constants.internode_bytes_per_s_per_gpu = 10e9;
    const double gemm_pair = m * layers * 2.0 * 16384.0 * 4096.0 * (3072.0 + 2.0 * 6144.0) /
                             c.gemm_backward_flops_per_s;  // one GEMM of qkv and one of gate_up
    EXPECT_NEAR(time_term(plan_layout(in).time, "tp_comm"),
                unhidden(all, 10e9) - (sp ? 2.0 : 1.0) * gemm_pair, 1e-9 * unhidden(all, 10e9));
    in.constants = PlanConstants{};
  }
}

// Measured steps on one H200 (docs/plan.md): Qwen3-1.7B at 2 × 8,192 tokens, median 0.4261 s
// (MFU 0.401, bench/results/2026-12-03-qwen3-4b-1.7b-h200.json; the elementwise rate comes
// from it), and Qwen3-8B with the optimizer offloaded, 32 micro-batches, 50.09 s (MFU 0.481,
// bench/results/2026-12-03-qwen3-8b-offload-full-h200.json; the matmul and host rates come
// from it). This pins how the rates are put together.
TEST(PlanTime, MatchesTheMeasuredSteps) {
  const Plan small = plan_layout(builtin_input("Qwen3-1.7B", 2));
  EXPECT_NEAR(small.time.step_s, 0.4261, 0.03 * 0.4261);
  EXPECT_NEAR(small.time.mfu, 0.401, 0.03 * 0.401);
  PlanInput eight = builtin_input("Qwen3-8B", 2, 8192, 64);
  eight.layout.offload.enabled = true;
  eight.layout.offload.optimizer_fraction = 1.0;
  const Plan offloaded = plan_layout(eight);
  EXPECT_NEAR(offloaded.time.step_s, 50.09, 0.03 * 50.09);
  EXPECT_NEAR(offloaded.time.mfu, 0.481, 0.03 * 0.481);
}

}  // namespace
}  // namespace loom
