#include "train/stage_pipeline.h"

#include "parallel/pipeline.h"

namespace loom {

double stage_pipeline_run(const StagePipelineRun& run, Comm& pp, CommTimeout timeout) {
  const int count = static_cast<int>(run.tokens.size());
  DecoderModel& model = *run.model;
  std::vector<MicroBatch> batches(static_cast<size_t>(count));
  std::vector<Tensor> inputs(batches.size()), output_grads(batches.size());
  std::vector<DecoderModel::Activations> acts(batches.size());
  auto stream = [&](int mb) { return model.stream_tokens(run.tokens[static_cast<size_t>(mb)]); };
  auto stream_tensor = [&](int mb, const char* what) {
    return run.arenas->of(mb).allocate({stream(mb), run.hidden}, run.activation_dtype, what);
  };
  auto batch = [&](int mb) -> const MicroBatch& {
    MicroBatch& b = batches[static_cast<size_t>(mb)];
    if (!b.ids.data) b = run.batch(mb, run.arenas->of(mb));
    return b;
  };
  double nll = 0;
  Tensor d_input;
  PipelineStage stage;
  stage.dtype = run.activation_dtype;
  stage.activation_count = [&](int mb) { return static_cast<size_t>(stream(mb) * run.hidden); };
  stage.input_buffer = [&](int mb) -> void* {
    Tensor& in = inputs[static_cast<size_t>(mb)];
    in = stream_tensor(mb, "stage input");
    return in.data;
  };
  stage.output_grad_buffer = [&](int mb) -> void* {
    Tensor& g = output_grads[static_cast<size_t>(mb)];
    g = stream_tensor(mb, "stage output gradient");
    return g.data;
  };
  stage.forward = [&](int mb) -> const void* {
    const size_t i = static_cast<size_t>(mb);
    acts[i] = model.stage_forward(*run.tensors, batch(mb), inputs[i], run.arenas->of(mb));
    if (run.before_send) run.before_send();
    return acts[i].output.data;
  };
  stage.backward = [&](int mb) -> const void* {
    const size_t i = static_cast<size_t>(mb);
    // The previous backward's input gradient has been sent: its tensors can go.
    if (mb > 0) run.arenas->release(mb - 1);
    if (run.before_backward) run.before_backward();
    nll += model.stage_backward(*run.tensors, batch(mb), acts[i], output_grads[i],
                                run.arenas->backward_scratch(mb), 1.0f, &d_input);
    acts[i] = {};
    const void* send = d_input.data ? run.arenas->sendable(mb, d_input) : nullptr;
    if (run.before_send) run.before_send();
    return send;
  };
  pipeline_run_1f1b(pp, stage, count, timeout);
  if (count > 0) run.arenas->release(count - 1);
  return nll;
}

double stage_pipeline_eval(const StagePipelineRun& run, Comm& pp, CommTimeout timeout) {
  const int count = static_cast<int>(run.tokens.size());
  DecoderModel& model = *run.model;
  std::vector<Tensor> inputs(static_cast<size_t>(count));
  DecoderModel::Activations acts;
  double nll = 0;
  PipelineStage stage;
  stage.dtype = run.activation_dtype;
  auto stream = [&](int mb) { return model.stream_tokens(run.tokens[static_cast<size_t>(mb)]); };
  stage.activation_count = [&](int mb) { return static_cast<size_t>(stream(mb) * run.hidden); };
  stage.input_buffer = [&](int mb) -> void* {
    Tensor& in = inputs[static_cast<size_t>(mb)];
    in = run.arenas->of(mb).allocate({stream(mb), run.hidden}, run.activation_dtype, "stage input");
    return in.data;
  };
  stage.forward = [&](int mb) -> const void* {
    // The previous micro-batch's output has been sent: its tensors can go.
    if (mb > 0) run.arenas->release(mb - 1);
    TensorAllocator& arena = run.arenas->of(mb);
    const MicroBatch batch = run.batch(mb, arena);
    acts = model.stage_forward(*run.tensors, batch, inputs[static_cast<size_t>(mb)], arena);
    nll += model.stage_loss(*run.tensors, batch, acts, arena);
    if (run.before_send) run.before_send();
    return acts.output.data;
  };
  pipeline_run_forward(pp, stage, count, timeout);
  if (count > 0) run.arenas->release(count - 1);
  return nll;
}

}  // namespace loom
