// The numbers the plan is made of that are not read from the model, the recipe or loom's
// own code: GPU specs, measured rates, and guesses. Each is named, says where it comes
// from, and appears in `loom plan --json` ("constants"), so a calibration against
// measured runs can see and replace them one by one (docs/plan.md, "Calibration").
//
// Sizes that loom's code fixes outside the model's pass (the 8,192-token loss chunk the
// engine builds its CudaOps with, the 32 MiB cuBLASLt workspace, the Adam chunk table) are
// constants here too, each saying which file it mirrors: the plan library does not link the
// CUDA backend. What the model's pass allocates is not restated: the dry run (dry_run.h)
// counts it, the kernels' workspace by their own sizing functions (ops/op_workspace.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

// One GPU model.
struct GpuSpec {
  std::string name;             // "H200", as a recipe's gpu.type writes it
  double vendor_memory_gb = 0;  // the datasheet figure a recipe's gpu.memory_gb states
  int64_t usable_bytes = 0;     // what cudaMemGetInfo reports as total: the planning capacity
  double peak_bf16_flops = 0;   // dense bf16, the denominator of MFU (docs/numerics.md)
  double hbm_bytes_per_s = 0;   // datasheet HBM bandwidth
  int64_t multiprocessors = 0;  // SMs: the CUDA kernels' fixed grids are blocks a multiprocessor
};

// H100 SXM 80 GB and H200 SXM 141 GB. usable_bytes: the H200's is nvidia-smi's 143,771 MiB
// (bench/results/2026-12-02-*.json) less ~500 MiB the driver keeps back (the H100's 81,559
// MiB shows 81,090 MiB in cudaMemGetInfo); GUESS for the H200 until a run logs it.
const std::vector<GpuSpec>& gpu_table();
// The entry whose name equals `name` (case-insensitive; "NVIDIA H200" and "H200 SXM" match
// too), or nullptr.
const GpuSpec* gpu_find(const std::string& name);

// Rates and sizes of the memory and time models. The defaults are what loom's H200 runs
// measured, the GEMMs' ceilings, and guesses marked GUESS.
struct PlanConstants {
  // ---- memory: sizes loom's code fixes -------------------------------------------------
  // src/ops/cuda/cuda_ops.h CudaOps(loss_chunk_tokens = 8192): lm_head logits per chunk.
  int64_t loss_chunk_tokens = 8192;
  // src/ops/cuda/gemm.h: cuBLASLt's workspace, its own cudaMalloc (outside the arenas).
  int64_t cublas_workspace_bytes = 32 * kMiB;
  // src/optim/cuda_adamw.cpp kAdamChunk and sizeof(cuda::AdamChunk): the chunk table.
  int64_t adam_chunk_elements = int64_t{1} << 16;
  int64_t adam_chunk_record_bytes = 24;
  // src/optim/cuda_adamw.h CudaAdamWOptions: the offload's grad staging chunk and the
  // weights' load / save piece (elements).
  int64_t offload_chunk_elements = int64_t{1} << 22;
  int64_t weight_piece_elements = int64_t{1} << 24;
  // src/io/safetensors.h kSafetensorsPieceNumel: a streamed checkpoint's piece (elements).
  int64_t checkpoint_piece_elements = int64_t{1} << 22;

  // ---- memory: guesses -----------------------------------------------------------------
  // GUESS: the CUDA context with lazy module loading plus cuBLASLt's and cuDNN's handles
  // and loaded kernels (~500-700 MiB on Hopper in PyTorch's experience); outside the arenas.
  int64_t cuda_context_bytes = 600 * kMiB;
  // GUESS: cuDNN's deterministic SDPA backward workspace, in units of the fp32 dQ
  // accumulator of what one call is given (rows · q_heads · row_tokens · head_dim · 4 bytes;
  // one row a call when PlanInput::attention_backward_by_row). 33 is what the Qwen3-1.7B run
  // (2 × 8,192 tokens, bench/results/2026-12-02-qwen3-1.7b-h200-engine-2.json:
  // max_mem_gib 68.35) left unexplained once every other arena term was counted (4.1 GiB).
  // It equals 1 + 8,192 / 256, as if the deterministic kernel kept a dQ partial per
  // 256-key tile besides the accumulator, which would grow with the row length: unverified.
  // LOOM_OP_PROFILE=1 prints the size cuDNN reports at graph build: replace this with it.
  // Isolated rows' THD call (8 spans bucketed × 8,192) asked 17.00 GiB on an H100
  // (2026-12-06), 34 units of its dQ. Heads narrower than 128 count as 128 wide
  // (ops/shape/shape_ops.h sdpa_backward_workspace_bytes, fitted to Llama-3.2-1B's peak).
  double sdpa_backward_workspace_dq_units = 33.0;
  // GUESS: cuDNN's SDPA forward workspace (the flash forward needs none at head_dim 128).
  int64_t sdpa_forward_workspace_bytes = 0;
  // GUESS: NCCL's buffers and channels per communicator of more than one rank (NCCL's
  // default 4 MiB buffers × protocols × channels); outside the arenas.
  int64_t nccl_bytes_per_communicator = 256 * kMiB;
  // GUESS: what cudaMalloc's 2 MiB pages and fragmentation add to the arenas' count.
  double allocator_slack_fraction = 0.01;
  // With sequence parallelism every layer's norm outputs are all-gathered into one shared
  // [T, H] buffer (decoder.h Activations::gathered) and gathered again in backward for the
  // weight gradients, as Megatron does: one transient gathered copy (measured:
  // docs/performance.md, "Memory").
  bool sp_regather_in_backward = true;

  // ---- time: measured rates ------------------------------------------------------------
  // Qwen3-8B, 32 micro-batches of 2 × 8,192 tokens, one H200, offload 1.0
  // (bench/results/2026-12-03-qwen3-8b-offload-full-h200.json, op profile of step 2, step 1
  // left out): linear_forward 689.9 TFLOP/s, linear_backward 690.4, lm_head_loss 656.6
  // (its in-place softmax included), attention_backward 395.2 (as 2.5 × the forward's
  // FLOPs), attention_forward 512.0: the GEMMs' sustained rate under the power cap
  // (docs/performance.md). cuBLASLt's short-run ceiling is 822e12 (8192³ at boost clocks), cuDNN's
  // attention anchor at 64 heads 642e12.
  double gemm_forward_flops_per_s = 690e12;
  double gemm_backward_flops_per_s = 690e12;
  // FP8 linear layers (workload.precision fp8): cuBLASLt's sustained FP8 rates under the cap
  // at Qwen3-8B's layer shapes (e4m3 with fast accumulation for the forward,
  // e5m2 × e4m3 with exact accumulation for the backward).
  double fp8_gemm_forward_flops_per_s = 1269e12;
  double fp8_gemm_backward_flops_per_s = 1216e12;
  // workload.fp8.scaling block: cuBLAS 13's block-scaled FP8 GEMM (1 × 128 by 128 × 128
  // scales, full accumulation) at 16,384 × 4,096 × 4,096 on the H200 (issue 24), for all three
  // GEMMs of a layer: not yet measured in loom's layers.
  double fp8_block_gemm_flops_per_s = 1089e12;
  double lm_head_flops_per_s = 657e12;
  double attention_backward_flops_per_s = 395e12;
  double attention_forward_flops_per_s = 512e12;
  // The norms, q/k-norm + RoPE and SwiGLU kernels: 31 ms a step at Qwen3-1.7B for the 94 GB
  // the hand count of their traffic gave (bench/results/2026-12-03-qwen3-4b-1.7b-h200.json,
  // steps 2-8), 63% of the H200's 4.8 TB/s; the 8B run above agrees (75 ms a micro-batch
  // measured, 74 modelled). The dry run's ops count 91 GB at 1.7B, adds and embedding
  // included (docs/plan.md, "Calibration"). Scaled by HBM bandwidth on other GPUs.
  double elementwise_hbm_efficiency = 0.63;
  // The Adam step and the grad scale / norm / zeroing stream at this share of HBM. Measured
  // for the AdamW kernel with 16-byte accesses: 28 B a parameter for 1e9 parameters in 7.57
  // ms, 3.70 TB/s = 0.77 of 4.8 (bench/results/2026-12-03-adamw-vectorised-h200.json); the
  // fused scale + norm pass: 16.3 GB in 5.1 ms = 0.67 at 1.7B. The Adam step dominates.
  double optimizer_hbm_efficiency = 0.77;

  // ---- time: links (GUESSES until loom's NCCL path is measured) ------------------------
  // NCCL ring bus bandwidth over NVLink 4 (900 GB/s bidirectional per GPU), NVLS off.
  double nvlink_bytes_per_s = 360e9;
  // Inter-node per GPU: p5en's 3.2 Tb/s EFA per 8 GPUs is 50 GB/s; 80% of it.
  double internode_bytes_per_s_per_gpu = 40e9;
  // Pinned host <-> GPU over PCIe Gen5 x16 (64 GB/s raw).
  double pcie_bytes_per_s = 40e9;
  // GUESS: layout.activation_offload's copies, each direction on a copy engine of its own
  // (device to host in the forward, back in the backward): ~50 GB/s a direction on an H100
  // or H200 over PCIe Gen5 x16 with pinned memory; unmeasured in loom.
  double activation_offload_bytes_per_s = 50e9;
  // The CPU Adam of offloaded parameters: host memory traffic per GPU. Measured on the
  // H200 device, 16 host cores for its one GPU: the 8B run above spends 2.54 s outside the
  // GPU's ops for 229 GB of state traffic (28 B a parameter), 90 GB/s. A GPU whose host
  // share is smaller (fewer cores or channels a GPU) gets less: unmeasured.
  double host_optimizer_bytes_per_s = 90e9;
  // Share of the communication hidden behind compute beyond the backward's TP overlap, which
  // the time model counts on its own (time_model.cpp): none.
  double comm_overlap = 0.0;
  // GPUs per node when the recipe has no gpu.per_node.
  int64_t default_gpus_per_node = 8;
};

}  // namespace loom
