// The 1F1B pipeline schedule (one forward, one backward), as Megatron core's
// forward_backward_pipelining_without_interleaving (pipeline_parallel/schedules.py). It
// knows nothing of the model: it calls the stage's callbacks and moves the activations and
// their gradients between neighbouring stages with the PP group's Comm.
//
// Stage s of p (the PP group's rank), M micro-batches, w = min(p − s − 1, M) warm-up ones:
//
//   warm-up    for i in [0, w):      recv_fwd(i); F(i); send_fwd(i)
//              if M > w:             recv_fwd(w)
//   steady     for i in [0, M − w):  F(w + i); send_fwd(w + i) + recv_bwd(i);  B(i);
//                                    last i: send_bwd(i)
//                                    else:   send_bwd(i) + recv_fwd(w + i + 1)
//   cool-down  for i in [M − w, M):  recv_bwd(i); B(i); send_bwd(i)
//
// "a + b" is one batched exchange (Megatron's send_forward_recv_backward and
// send_backward_recv_forward). recv_fwd and send_bwd are skipped on the first stage,
// send_fwd and recv_bwd on the last. Backward runs in micro-batch order 0, 1, ..., so
// gradients accumulate in the same order as an unpipelined loop over the micro-batches;
// the first stage holds at most p in flight, the last one. With p = 1 it is F(0), B(0),
// F(1), B(1), ..., Megatron's forward_backward_no_pipelining.
#pragma once

#include <functional>

#include "parallel/comm.h"

namespace loom {

// The callbacks of one stage. Buffers are memory the stage owns, of the kind its Comm
// moves (host for InProcessComm, device for NcclComm).
struct PipelineStage {
  // The activation passed to the next stage for micro-batch mb, and its gradient passed
  // back, are `activation_count(mb)` elements of `dtype` (micro-batches may differ in size).
  std::function<size_t(int mb)> activation_count;
  DType dtype = DType::f32;
  // Where mb's input activation is received (not called on the first stage). The schedule
  // fills it before forward(mb).
  std::function<void*(int mb)> input_buffer;
  // Forward of mb. Returns the output activation to send on (ignored on the last stage);
  // it must stay valid until the next forward or backward call.
  std::function<const void*(int mb)> forward;
  // Where the gradient of mb's output is received (not called on the last stage). The
  // schedule fills it before backward(mb).
  std::function<void*(int mb)> output_grad_buffer;
  // Backward of mb (from its loss on the last stage). Returns the gradient of its input to
  // send back (ignored on the first stage); valid until the next forward or backward call.
  std::function<const void*(int mb)> backward;
};

// Runs forward and backward of micro-batches 0..num_microbatches-1 on this stage, the
// stage being pp.rank() of pp.size(). Every rank of `pp` calls it with the same count.
// `timeout` bounds each transfer; a neighbour that does not take part throws
// RuntimeFailure (from the Comm) naming it.
void pipeline_run_1f1b(Comm& pp, const PipelineStage& stage, int num_microbatches, CommTimeout timeout);

// Forward only (held-out evaluation): for each micro-batch in order, recv_fwd(i); F(i);
// send_fwd(i). stage.backward and output_grad_buffer are not called.
void pipeline_run_forward(Comm& pp, const PipelineStage& stage, int num_microbatches, CommTimeout timeout);

// w above: the warm-up forwards of stage `stage` of `stages`.
int pipeline_warmup_microbatches(int stages, int stage, int num_microbatches);

}  // namespace loom
