// The numbers the plan is made of that are not read from the model, the recipe or loom's
// own code: GPU specs, measured rates, and guesses. Each is named, says where it comes
// from, and appears in `loom plan --json` ("constants"), so a calibration against
// measured runs can see and replace them one by one (docs/plan.md, "Calibration").
//
// Sizes that loom's code fixes (the 8,192-token loss chunk, the 32 MiB cuBLASLt workspace,
// the Adam chunk table) are constants here too, each saying which file it mirrors: the
// plan library does not link the CUDA backend, so it cannot ask it.
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
  double peak_bf16_flops = 0;   // dense bf16, the denominator of MFU (SEMANTICS.md)
  double hbm_bytes_per_s = 0;   // datasheet HBM bandwidth
};

// H100 SXM 80 GB and H200 SXM 141 GB. usable_bytes: the H200's is nvidia-smi's 143,771 MiB
// (bench/results/2026-12-02-*.json) less ~500 MiB the driver keeps back (the H100's 81,559
// MiB shows 81,090 MiB in cudaMemGetInfo); GUESS for the H200 until a run logs it.
const std::vector<GpuSpec>& gpu_table();
// The entry whose name equals `name` (case-insensitive; "NVIDIA H200" and "H200 SXM" match
// too), or nullptr.
const GpuSpec* gpu_find(const std::string& name);

// Rates and sizes of the memory and time models. The defaults are what loom's H200 runs
// measured, BENCHMARKS.md's ceilings, and guesses marked GUESS.
struct PlanConstants {
  // ---- memory: sizes loom's code fixes -------------------------------------------------
  // src/ops/cuda/cuda_ops.h CudaOps(loss_chunk_tokens = 8192): lm_head logits per chunk.
  int64_t loss_chunk_tokens = 8192;
  // src/ops/cuda/gemm.h: cuBLASLt's workspace, its own cudaMalloc (outside the arenas).
  int64_t cublas_workspace_bytes = 32 * kMiB;
  // src/train/cuda_engine.cpp kAdamChunk and sizeof(cuda::AdamChunk): the chunk table.
  int64_t adam_chunk_elements = int64_t{1} << 16;
  int64_t adam_chunk_record_bytes = 24;
  // src/ops/cuda/rmsnorm.cu and qk_norm_rope.cu kWeightGradBlocks: weight-grad partials.
  int64_t weight_grad_blocks = 1056;
  // src/ops/cuda/device_arena.cpp kAlignment: every arena allocation is rounded up to it.
  int64_t arena_alignment = 256;

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
  double sdpa_backward_workspace_dq_units = 33.0;
  // GUESS: cuDNN's SDPA forward workspace (the flash forward needs none at head_dim 128).
  int64_t sdpa_forward_workspace_bytes = 0;
  // GUESS: NCCL's buffers and channels per communicator of more than one rank (NCCL's
  // default 4 MiB buffers × protocols × channels); outside the arenas.
  int64_t nccl_bytes_per_communicator = 256 * kMiB;
  // GUESS: what cudaMalloc's 2 MiB pages and fragmentation add to the arenas' count.
  double allocator_slack_fraction = 0.01;
  // ASSUMED for the TP engine (not yet written): with sequence parallelism the norm
  // outputs are kept sharded and all-gathered again in backward (Megatron), so only a
  // transient gathered copy exists.
  bool sp_regather_in_backward = true;

  // ---- time: measured rates ------------------------------------------------------------
  // Qwen3-1.7B, 2 × 8,192 tokens, one H200 (bench/results/2026-12-02-qwen3-1.7b-h200-engine-2.json
  // op profile over 8 steps): linear_forward 73 ms/step for 4.62e13 FLOPs, linear_backward
  // 127 ms for 9.24e13, lm_head_loss 59 ms for 3.06e13 (its in-place softmax included),
  // attention_backward 95 ms for 3.85e13. cuBLASLt's ceiling is 822e12 (8192³, BENCHMARKS.md).
  double gemm_forward_flops_per_s = 632e12;
  double gemm_backward_flops_per_s = 728e12;
  double lm_head_flops_per_s = 518e12;
  double attention_backward_flops_per_s = 405e12;
  // The same run's attention_forward less step 1's graph builds (~1.2 s): ~30 ms for
  // 1.54e13 FLOPs. BENCHMARKS.md's cuDNN anchor at 64 heads is 642e12.
  double attention_forward_flops_per_s = 513e12;
  // The same run's norms, q/k-norm + RoPE and SwiGLU kernels: 65 ms/step for the 94 GB this
  // model counts as their traffic: 30% of the H200's 4.8 TB/s. Scaled by HBM bandwidth on
  // other GPUs.
  double elementwise_hbm_efficiency = 0.30;
  // GUESS: the Adam step and the grad scale / norm / zeroing stream at this share of HBM.
  double optimizer_hbm_efficiency = 0.80;

  // ---- time: links (GUESSES until loom's NCCL path is measured) ------------------------
  // NCCL ring bus bandwidth over NVLink 4 (900 GB/s bidirectional per GPU), NVLS off.
  double nvlink_bytes_per_s = 360e9;
  // Inter-node per GPU: p5en's 3.2 Tb/s EFA per 8 GPUs is 50 GB/s; 80% of it.
  double internode_bytes_per_s_per_gpu = 40e9;
  // Pinned host <-> GPU over PCIe Gen5 x16 (64 GB/s raw).
  double pcie_bytes_per_s = 40e9;
  // The CPU Adam of offloaded parameters: host memory traffic per GPU (a node's DDR5
  // bandwidth shared by its 8 GPUs' optimizer threads).
  double host_optimizer_bytes_per_s = 40e9;
  // Share of the communication hidden behind compute: loom's Comm calls return once their
  // stream has run them (docs/parallel.md), so none.
  double comm_overlap = 0.0;
  // GPUs per node when the recipe has no gpu.per_node.
  int64_t default_gpus_per_node = 8;
};

}  // namespace loom
