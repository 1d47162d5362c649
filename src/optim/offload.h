// CPU optimizer offload (recipe layout.offload, Megatron's --optimizer-cpu-offload with
// --optimizer-offload-fraction): the precision-aware AdamW state of a share of the parameters
// (fp32 m and v, int16 remainders, and a mirror of their bf16 weight bits) lives in host
// memory and is stepped on CPU threads; the rest stays on the GPU. This file is the CPU part,
// which knows nothing of CUDA: the split, the chunking, the host step and the pipeline of
// copies, run against an OffloadCopies that a GPU optimizer (optim/cuda_adamw.h) implements
// with CUDA streams and a test implements with memcpy.
//
// The split. Of the flat parameter buffer [0, n), elements [0, cpu_numel) are offloaded,
// cpu_numel = round(fraction · n); [cpu_numel, n) stays on the GPU. Megatron splits at tensor
// granularity; AdamW is elementwise, so splitting inside a tensor gives the same bits and
// hits the fraction exactly. Each share keeps its own arrays: the GPU share's start at
// element cpu_numel, so its ranges are rebased (offset − cpu_numel).
//
// The step of the offloaded share, chunk by chunk (chunks of chunk_numel elements of the
// share, cut regardless of tensor boundaries; each chunk carries the parts of the ranges it
// holds, rebased to the chunk):
//   grads of chunk k come down into staging slot k mod 2;
//   the CPU steps chunk k from that slot (adamw_step_bf16_remainder: the same function, so the
//     same bits, as the reference; the GPU kernel matches it bit for bit, ops/cuda/adam.cu);
//   the chunk's new bf16 bits go up from the host mirror (pinned on a GPU, so the mirror is
//     its own upload staging and needs no second buffer).
// Overlapped, chunk k+1's grads come down while the CPU steps chunk k and chunk k−1's weights
// go up; slot (k+1) mod 2 is free then, since the CPU finished chunk k−1 before chunk k+1's
// copy starts. In turn (overlap false), each chunk's copies finish before the next starts.
#pragma once

#include <cstdint>
#include <vector>

#include "optim/adamw.h"

namespace loom {

struct OffloadChunk {
  int64_t offset = 0;  // first element, in the offloaded share (= in the flat buffer)
  int64_t numel = 0;
  std::vector<ParamRange> ranges;  // the ranges' elements in this chunk, offsets from `offset`
};

struct OffloadPlan {
  int64_t numel = 0;      // n: the whole flat buffer
  int64_t cpu_numel = 0;  // [0, cpu_numel) offloaded
  int64_t chunk_numel = 0;
  std::vector<ParamRange> gpu_ranges;  // the ranges' elements in [cpu_numel, n), offsets from cpu_numel
  std::vector<OffloadChunk> chunks;    // cover [0, cpu_numel) in order
  int64_t gpu_numel() const { return numel - cpu_numel; }
};

// `ranges`: the tensors of the flat buffer of `numel` elements (sorted, disjoint, inside it;
// elements in no range are not stepped, as in adamw_step). fraction in [0, 1]
// (layout.offload.optimizer_fraction; InputError naming that field otherwise); chunk_numel ≥ 1.
OffloadPlan offload_plan(const std::vector<ParamRange>& ranges, int64_t numel, double fraction,
                         int64_t chunk_numel);

// The host state of the offloaded share: views of plan.cpu_numel elements each (the first
// offloaded element at index 0), and two staging slots of plan.chunk_numel grads. The owner
// allocates them (pinned memory on a GPU).
struct OffloadHostState {
  uint16_t* param_bits = nullptr;  // mirror of the GPU's bf16 weights of the share
  int16_t* remainder = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  float* grad_staging[2] = {nullptr, nullptr};
};

// The copies between the device's buffers and the host, by chunk. start_* may return before
// the copy is done; wait_* block until it is. A slot is reused only after its wait and the
// CPU step that reads it, and a chunk's mirror bits are written only before its upload starts.
class OffloadCopies {
 public:
  virtual ~OffloadCopies() = default;
  // Begins the copy of the device's grads of `chunk` into `staging` (slot 0 or 1). The first
  // call of a step also orders it after the work that made the grads.
  virtual void start_grads_down(const OffloadChunk& chunk, float* staging, int slot) = 0;
  virtual void wait_grads_down(int slot) = 0;
  // Begins the copy of `bits` (the mirror's bits of `chunk`) into the device's weights.
  virtual void start_weights_up(const OffloadChunk& chunk, const uint16_t* bits) = 0;
  virtual void wait_weights_up() = 0;
  // Orders the device's later work (the next forward) after every upload of this step.
  virtual void finish() = 0;
};

// One AdamW step of the offloaded share: the copies and the CPU step per chunk, pipelined
// when `overlap`. Blocks until every chunk is stepped; the last uploads may still be in
// flight, ordered before the device's later work by copies.finish(). The device's grads are
// multiplied by grad_scale as they are stepped (adamw_step_bf16_remainder's grad_scale): the
// grad clip factor the device did not apply in a pass of its own.
void offload_step(const OffloadPlan& plan, const OffloadHostState& state, OffloadCopies& copies,
                  const AdamWConfig& cfg, float lr, int64_t step, bool overlap, float grad_scale = 1.0f);

}  // namespace loom
