// A step's micro-batches through one pipeline stage of the engine: the 1F1B schedule
// (parallel/pipeline.h) calling DecoderModel's stage_forward and stage_backward, with each
// micro-batch's activations, received input and received output gradient in memory the
// parameter store provides (host memory for the CPU store, the GPU for the CUDA one).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/allocator.h"
#include "model/decoder.h"
#include "parallel/comm.h"

namespace loom {

// Where a micro-batch's tensors live from its first use (its input arriving, or its
// forward) until it is released.
class MicroBatchArenas {
 public:
  virtual ~MicroBatchArenas() = default;
  // The arena of micro-batch mb; the first call for mb starts it afresh.
  virtual TensorAllocator& of(int mb) = 0;
  // mb's tensors are dead (its input gradient has been sent on).
  virtual void release(int mb) = 0;
  // Where backward(mb)'s gradient buffers (and a recomputed chunk's activations) go: mb's
  // own arena, or one arena that every backward reuses, since only one runs at a time and
  // nothing of it outlives the call but the input gradient, which `sendable` takes.
  virtual TensorAllocator& backward_scratch(int mb) { return of(mb); }
  // What backward(mb) hands the Comm for its input gradient `d_input` (a tensor of mb's
  // arena): d_input itself, or a copy in memory of the engine's when mb's arena may be
  // reused before the send has read it (the CUDA store's arenas are slots, reused as the
  // next micro-batch's input arrives in the same exchange that sends this gradient).
  virtual const void* sendable(int mb, Tensor d_input) {
    (void)mb;
    return d_input.data;
  }
};

struct StagePipelineRun {
  DecoderModel* model = nullptr;
  const ModelTensors* tensors = nullptr;
  std::vector<int64_t> tokens;  // per micro-batch
  // mb's ids, targets and rows, in (or viewing host memory beside) the arena.
  std::function<MicroBatch(int mb, TensorAllocator& arena)> batch;
  MicroBatchArenas* arenas = nullptr;
  DType activation_dtype = DType::f32;
  int64_t hidden = 0;
  // Called before an activation or gradient the stage computed is handed to the Comm (the
  // CUDA store waits for its stream: a device Comm reads the buffer on its own stream).
  std::function<void()> before_send;
  // Called before each backward (the CUDA store orders the grads' zeroing before it).
  std::function<void()> before_backward;
};

// Runs the schedule over `pp`; returns this stage's Σ nll (nonzero on the last stage only).
double stage_pipeline_run(const StagePipelineRun& run, Comm& pp, CommTimeout timeout);
// Forward only (held-out evaluation, pipeline_run_forward): each micro-batch's activations
// are released once its output is sent on; returns this stage's Σ nll (last stage only).
// before_backward is not called.
double stage_pipeline_eval(const StagePipelineRun& run, Comm& pp, CommTimeout timeout);

}  // namespace loom
