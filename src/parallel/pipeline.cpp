#include "parallel/pipeline.h"

#include <algorithm>
#include <vector>

#include "core/error.h"

namespace loom {

int pipeline_warmup_microbatches(int stages, int stage, int num_microbatches) {
  return std::min(stages - stage - 1, num_microbatches);
}

namespace {

// The point-to-point steps of the schedule; each names its micro-batch(es) and skips the
// legs that have no neighbour.
class StageLinks {
 public:
  StageLinks(Comm& pp, const PipelineStage& stage, CommTimeout timeout)
      : pp_(pp),
        stage_(stage),
        timeout_(timeout),
        first_(pp.rank() == 0),
        last_(pp.rank() == pp.size() - 1) {}

  void recv_forward(int mb) {
    if (!first_) run({recv_input(mb)});
  }
  void send_forward(const void* output, int mb) {
    if (!last_) run({send_output(output, mb)});
  }
  void send_forward_recv_backward(const void* output, int fwd_mb, int bwd_mb) {
    if (!last_) run({send_output(output, fwd_mb), recv_output_grad(bwd_mb)});
  }
  void send_backward_recv_forward(const void* input_grad, int bwd_mb, int fwd_mb) {
    if (!first_) run({send_input_grad(input_grad, bwd_mb), recv_input(fwd_mb)});
  }
  void send_backward(const void* input_grad, int mb) {
    if (!first_) run({send_input_grad(input_grad, mb)});
  }
  void recv_backward(int mb) {
    if (!last_) run({recv_output_grad(mb)});
  }

 private:
  P2POp recv_input(int mb) const {
    return {P2POp::Kind::recv, stage_.input_buffer(mb), stage_.activation_count(mb), stage_.dtype,
            pp_.rank() - 1};
  }
  P2POp send_output(const void* output, int mb) const {
    LOOM_ASSERT(output != nullptr, "a pipeline stage's forward returned no output to send");
    return {P2POp::Kind::send, const_cast<void*>(output), stage_.activation_count(mb), stage_.dtype,
            pp_.rank() + 1};
  }
  P2POp recv_output_grad(int mb) const {
    return {P2POp::Kind::recv, stage_.output_grad_buffer(mb), stage_.activation_count(mb), stage_.dtype,
            pp_.rank() + 1};
  }
  P2POp send_input_grad(const void* input_grad, int mb) const {
    LOOM_ASSERT(input_grad != nullptr, "a pipeline stage's backward returned no input gradient to send");
    return {P2POp::Kind::send, const_cast<void*>(input_grad), stage_.activation_count(mb), stage_.dtype,
            pp_.rank() - 1};
  }
  void run(std::initializer_list<P2POp> ops) {
    pp_.exchange(std::span<const P2POp>(ops.begin(), ops.size()), timeout_);
  }

  Comm& pp_;
  const PipelineStage& stage_;
  CommTimeout timeout_;
  bool first_;
  bool last_;
};

}  // namespace

void pipeline_run_1f1b(Comm& pp, const PipelineStage& stage, int num_microbatches, CommTimeout timeout) {
  LOOM_ASSERT(num_microbatches >= 1, "the pipeline needs at least one micro-batch");
  StageLinks links(pp, stage, timeout);
  const int warmup = pipeline_warmup_microbatches(pp.size(), pp.rank(), num_microbatches);
  const int remaining = num_microbatches - warmup;

  for (int i = 0; i < warmup; ++i) {
    links.recv_forward(i);
    links.send_forward(stage.forward(i), i);
  }
  if (remaining > 0) links.recv_forward(warmup);

  for (int i = 0; i < remaining; ++i) {
    const int fwd_mb = warmup + i;
    links.send_forward_recv_backward(stage.forward(fwd_mb), fwd_mb, i);
    const void* input_grad = stage.backward(i);
    if (i == remaining - 1)
      links.send_backward(input_grad, i);
    else
      links.send_backward_recv_forward(input_grad, i, fwd_mb + 1);
  }

  for (int i = remaining; i < num_microbatches; ++i) {
    links.recv_backward(i);
    links.send_backward(stage.backward(i), i);
  }
}

void pipeline_run_forward(Comm& pp, const PipelineStage& stage, int num_microbatches, CommTimeout timeout) {
  StageLinks links(pp, stage, timeout);
  for (int mb = 0; mb < num_microbatches; ++mb) {
    links.recv_forward(mb);
    links.send_forward(stage.forward(mb), mb);
  }
}

}  // namespace loom
