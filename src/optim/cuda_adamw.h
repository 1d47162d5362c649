// CudaAdamW: the precision-aware AdamW of a GPU run (docs/numerics.md; TE FusedAdam with
// store_param_remainders), with a share of its state offloaded to the CPU (optim/offload.h).
//
// Of the flat parameter buffer [0, n) (bf16 weights and fp32 main grads, device memory the
// caller owns), the GPU share [cpu_numel, n) keeps its int16 remainders and fp32 m, v in
// device memory and is stepped by ops/cuda/adam.cu's kernel on the caller's stream; the
// offloaded share [0, cpu_numel) keeps them, with a mirror of its bf16 weight bits, in pinned
// host memory and is stepped on CPU threads by adamw_step_bf16_remainder. Both give the same
// bits for every element: the kernel spells each fp32 operation with a round-to-nearest
// intrinsic (no FMA contraction) in the CPU reference's order, and loom_optim is built with
// -ffp-contract=off; so any offload fraction gives the bits of fraction 0.
//
// The copies of the offloaded share go on two streams of their own: fp32 grads down in chunks
// into two pinned staging slots, the new bf16 weights up from the pinned mirror. With
// overlap, the GPU share's kernel, the copies down, the CPU step and the copies up run at
// once (chunk k+1 down while chunk k is stepped and chunk k−1 goes up); the caller's stream
// waits for the last copy up, so the next forward reads the new weights. Without overlap, the
// GPU share finishes first and each chunk's copies finish before the next chunk's start.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ops/cuda/device_arena.h"
#include "ops/cuda/kernels.h"
#include "optim/adamw.h"
#include "optim/offload.h"

namespace loom {

struct CudaAdamWOptions {
  double offload_fraction = 0.0;  // layout.offload.optimizer_fraction; 0: all on the GPU
  bool overlap = true;            // layout.offload.overlap
  // Elements per staging slot: 4 Mi fp32 grads (16 MiB) take ~0.3 ms over PCIe 5, long
  // against a copy's launch, short against a 1.7B model's 6.8 GB of grads.
  int64_t chunk_numel = int64_t{1} << 22;
  // Elements per piece of load_masters and of the GPU share's host staging in load and save:
  // 16 Mi (64 MiB of fp32 staging), few enough copies for an 8B model's 8.2 G elements, small
  // beside a host that holds the offloaded state.
  int64_t piece_numel = int64_t{1} << 24;
};

// Fills dst[0, count) with the fp32 values (masters, or a moment) [begin, begin + count) of
// the flat buffer.
using CudaRangeRead = std::function<void(int64_t begin, int64_t count, float* dst)>;

// The kernel's chunk table of `ranges` (one block per ≤ 64 Ki elements of a range).
std::vector<cuda::AdamChunk> cuda_adam_chunks(const std::vector<ParamRange>& ranges);
// AdamScalars of one step: adamw_step_scalars (the CPU reference's) and the weight decay.
cuda::AdamScalars cuda_adam_scalars(const AdamWConfig& cfg, float lr, int64_t step);

class CudaAdamW {
 public:
  // `ranges`: the tensors of the flat buffer of `numel` elements (offload_plan's rules).
  // param_bits[numel], grads[numel]: device memory the caller owns and keeps alive. The state
  // starts empty: call load() before the first step.
  CudaAdamW(const std::vector<ParamRange>& ranges, int64_t numel, uint16_t* param_bits, const float* grads,
            cudaStream_t stream, const CudaAdamWOptions& options);
  ~CudaAdamW();
  CudaAdamW(const CudaAdamW&) = delete;
  CudaAdamW& operator=(const CudaAdamW&) = delete;

  // Full host tensors of numel elements, whatever the split (layout-independent state):
  // masters are split into the weights and remainders; m, v null: zeros. Waits for the
  // stream's work first.
  void load(const float* master, const float* m, const float* v);
  // The same with each read piece by piece (at most piece_numel elements each, in order of
  // the flat buffer; the offloaded share's moments straight into their pinned state), an
  // empty m or v: zeros. No host array of numel elements: a resume streamed from a checkpoint
  // beside the pinned offloaded state (an 8B model's fp32 state is 98 GB). load() is this
  // over its arrays.
  void load_pieces(const CudaRangeRead& master, const CudaRangeRead& m, const CudaRangeRead& v);
  // The masters alone, the moments zero: the first load of a run.
  void load_masters(const CudaRangeRead& read);
  // After the grads are final on the stream. Returns when the CPU share is stepped; the GPU
  // share and the last copies up are ordered on the stream. Both shares update with
  // grad[i] · grad_scale (rounded to fp32), bit for bit the grads scaled by a pass of their
  // own first: the engine's grad clip factor, without that pass (8 B a parameter). The grads
  // in device memory are left as they are.
  void step(const AdamWConfig& cfg, float lr, int64_t step, float grad_scale = 1.0f);
  // The masters (rebuilt from weights + remainders, bit for bit) and moments, into host
  // arrays of numel elements; a null one is skipped. Waits for the stream's work first.
  void save(float* master, float* m, float* v);
  // The masters [begin, begin + count) into dst[0, count), bit for bit as save's, for a caller
  // that writes them out a piece at a time. Waits for the stream's work first.
  void save_masters(int64_t begin, int64_t count, float* dst);
  // The moments [begin, begin + count) into m[0, count) and v[0, count), bit for bit as
  // save's; a null one is skipped. Waits for the stream's work first.
  void save_moments(int64_t begin, int64_t count, float* m, float* v);

  const OffloadPlan& plan() const { return plan_; }
  // Pinned host bytes of the offloaded share (state, mirror, staging).
  int64_t host_bytes() const;

 private:
  class Copies;
  struct Pinned;

  void synchronize();
  // piece(begin, count) gives the masters [begin, begin + count), valid until its next call;
  // split into the weights and remainders, piece by piece.
  void split_masters(const std::function<const float*(int64_t begin, int64_t count)>& piece);
  // Moments read piece by piece through `staging` (piece_numel elements), or zeros where empty.
  void load_moments(const CudaRangeRead& m, const CudaRangeRead& v, std::vector<float>& staging);
  void rebuild_masters(int64_t begin, int64_t count, float* dst);

  OffloadPlan plan_;
  CudaAdamWOptions options_;
  uint16_t* param_bits_;
  const float* grads_;
  cudaStream_t stream_;
  // The GPU share's state.
  DeviceArena arena_{"optimizer state"};
  int16_t* remainders_ = nullptr;
  float *m_ = nullptr, *v_ = nullptr;
  cuda::AdamChunk* chunks_ = nullptr;
  int64_t chunk_count_ = 0;
  // The offloaded share's.
  std::unique_ptr<Pinned> pinned_;
  OffloadHostState host_;
  cudaStream_t down_ = nullptr, up_ = nullptr;
  cudaEvent_t grads_ready_ = nullptr, up_done_ = nullptr, down_done_[2] = {nullptr, nullptr};
};

}  // namespace loom
