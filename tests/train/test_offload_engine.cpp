// The CUDA engine with layout.offload (EngineOptions.offload): offloading any share of the
// optimizer state changes no bit of training, and the engine's state functions see the
// offloaded state as full tensors (label gpu; skipped with a message where no GPU is
// visible), a range at a time too (a checkpoint streamed). Three steps of the golden tiny
// model: the forward after each step reads the weights the copies up brought, so a missing
// wait shows as a different loss.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_checkpoint.h"
#include "io/init.h"
#include "model/param_table.h"
#include "support/bitwise_diff.h"
#include "train/cuda_device.h"
#include "train/engine.h"
#include "train/engine_inspect.h"
#include "train/rows.h"
#include "train/train_step.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

constexpr AdamWConfig kAdam{0.9f, 0.98f, 1e-8f, 0.1f};

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Trace {
  std::vector<double> nll, sum_squares;
  std::vector<float> grads;  // the last step's, before the optimizer step
  TrainState state;          // after the last step
};

class OffloadEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_engine_available(&why)) GTEST_SKIP() << "the CUDA offload engine test did not run: " << why;
    config_ = hf_checkpoint_read_config("golden/tiny_untied/model");
    table_ = param_table_build(config_);
    params_.resize(static_cast<size_t>(table_.total_numel));
    init_random_params(config_, table_, 7, params_.data());
    rows_ = rows_load_jsonl("golden/tiny_untied/rows.jsonl", 24, config_.vocab_size);
  }

  std::unique_ptr<TrainEngine> engine(double fraction, bool overlap) {
    EngineOptions options;
    options.offload = {fraction, overlap};
    OwnedParamSource source(params_);
    return engine_create(config_, table_, source, EngineDevice::cuda, options);
  }

  // zero_grads, then step `step`'s two micro-batches of two rows each, their Σ nll into trace.
  void zero_and_forward_backward(TrainEngine& e, int64_t step, Trace& trace) {
    e.zero_grads();
    StepSpec spec;
    spec.max_tokens_per_gpu = 2 * rows_.row_tokens;
    trace.nll.push_back(e.micro_batches(step_micro_batches(rows_, step_rows(rows_, step, 4), spec, step)));
  }

  // Steps [first, last] of two micro-batches of two rows each.
  void train(TrainEngine& e, int64_t first, int64_t last, Trace& trace) {
    for (int64_t step = first; step <= last; ++step) {
      zero_and_forward_backward(e, step, trace);
      e.scale_grads(1.0f / 40.0f);
      trace.sum_squares.push_back(e.grad_sum_squares());
      if (step == last) trace.grads = engine_grads(e);
      e.optimizer_step(kAdam, 1e-3f, step);
    }
    e.state_to_host(trace.state);
  }

  void expect_equal(const Trace& got, const Trace& want, const std::string& what) {
    std::string d;
    EXPECT_EQ(d = first_difference(got.nll, want.nll), "") << what << ": Σ nll per step differs, " << d;
    EXPECT_EQ(d = first_difference(got.sum_squares, want.sum_squares), "")
        << what << ": grad Σ² differs, " << d;
    EXPECT_EQ(d = first_difference(got.grads, want.grads), "") << what << ": the grads differ, " << d;
    EXPECT_EQ(d = first_difference(got.state.master, want.state.master), "")
        << what << ": masters differ, " << d;
    EXPECT_EQ(d = first_difference(got.state.adam_m, want.state.adam_m), "")
        << what << ": Adam m differs, " << d;
    EXPECT_EQ(d = first_difference(got.state.adam_v, want.state.adam_v), "")
        << what << ": Adam v differs, " << d;
  }

  ModelConfig config_;
  ParamTable table_;
  std::vector<float> params_;
  RowSet rows_;
};

TEST_F(OffloadEngineTest, AnyFractionTrainsTheSameBits) {
  Trace want;
  train(*engine(0.0, true), 1, 3, want);
  for (double fraction : {0.5, 1.0})
    for (bool overlap : {true, false}) {
      Trace got;
      train(*engine(fraction, overlap), 1, 3, got);
      expect_equal(
          got, want,
          "offload " + std::to_string(fraction) + (overlap ? " overlapped" : " in turn") + " vs offload 0");
    }
}

// The engine defers scale_grads into the next pass over the grads (the Σ g² kernel, the
// AdamW update on both shares); engine_grads applies a pending factor first. So a run whose
// every factor is forced into a pass of its own by engine_grads (the step as it was before
// the deferral: a scale pass, a plain Σ g², a clip pass, the update) is the reference for the
// deferred run, which reads its grads only after the optimizer step. Steps 1 and 3 also scale
// twice before the norm (the first factor must be applied, not folded into the second); every
// step clips, and zero_grads must drop the clip factor left pending (steps 2 and 3 would
// differ otherwise) and be waited for by the next reader (its memset has a stream of its own).
TEST_F(OffloadEngineTest, DeferredScaleAndClipAreBitwiseExplicitPasses) {
  const auto run = [&](TrainEngine& e, bool explicit_passes, Trace& trace) {
    const auto scale = [&](float factor) {
      e.scale_grads(factor);
      if (explicit_passes) engine_grads(e);
    };
    for (int64_t step = 1; step <= 3; ++step) {
      zero_and_forward_backward(e, step, trace);
      if (step == 2) {
        scale(1.0f / 40.0f);
      } else {
        scale(0.3f);
        scale(1.0f / 12.0f);
      }
      trace.sum_squares.push_back(e.grad_sum_squares());
      scale(0.37f);  // a clip factor
      e.optimizer_step(kAdam, 1e-3f, step);
      if (step == 3) trace.grads = engine_grads(e);  // the clipped grads
    }
    e.state_to_host(trace.state);
    // zero_grads' memset runs on a stream of its own: a reader waits for it.
    e.zero_grads();
    const std::vector<float> zeroed = engine_grads(e);
    EXPECT_EQ(std::count(zeroed.begin(), zeroed.end(), 0.0f), static_cast<std::ptrdiff_t>(zeroed.size()))
        << "the grads right after zero_grads";
  };
  for (double fraction : {0.0, 0.5, 1.0}) {
    const std::string name = "offload " + std::to_string(fraction);
    Trace want, got;
    run(*engine(fraction, true), true, want);
    run(*engine(fraction, true), false, got);
    expect_equal(got, want,
                 name + ": scale and clip deferred into the norm and the update vs passes of their own");
  }
}

// A checkpoint's state is full tensors: saved at one fraction, it resumes at another.
TEST_F(OffloadEngineTest, StateResumesAtAnotherFraction) {
  Trace want;
  train(*engine(0.0, true), 1, 3, want);
  Trace first;
  train(*engine(0.5, true), 1, 2, first);
  for (double fraction : {0.0, 1.0}) {
    std::unique_ptr<TrainEngine> e = engine(fraction, true);
    e->state_from_host(first.state);
    Trace got = first;
    train(*e, 3, 3, got);
    expect_equal(got, want,
                 "saved at offload 0.5 after step 2, resumed at offload " + std::to_string(fraction));
  }
}

// A checkpoint streamed beside the pinned offloaded state (TrainEngine::state_source and
// state_load, through CudaAdamW::save_masters, save_moments and load_pieces): the state file
// written from the engine at each fraction is the full copy's bytes, and read a range at a time
// it resumes at every fraction with the bits of the uninterrupted run.
TEST_F(OffloadEngineTest, StreamedStateIsTheFullCopysBytesAndResumesAtAnyFraction) {
  Trace want;
  train(*engine(0.0, true), 1, 3, want);
  const fs::path dir = fs::temp_directory_path() / ("loom-offload-state-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (double saved_at : {0.0, 0.5, 1.0}) {
    const std::string name = "saved at offload " + std::to_string(saved_at);
    std::unique_ptr<TrainEngine> e = engine(saved_at, true);
    Trace first;
    train(*e, 1, 2, first);
    checkpoint_state_write((dir / "whole.safetensors").string(), table_, first.state);
    checkpoint_state_write((dir / "streamed.safetensors").string(), table_, *e->state_source());
    EXPECT_TRUE(file_bytes(dir / "whole.safetensors") == file_bytes(dir / "streamed.safetensors"))
        << name << ": the streamed state file differs from the full copy's";
    for (double fraction : {0.0, 0.5, 1.0}) {
      std::unique_ptr<TrainEngine> resumed = engine(fraction, true);
      CheckpointStateFile file((dir / "streamed.safetensors").string(), table_);
      resumed->state_load(file);
      Trace got = first;
      train(*resumed, 3, 3, got);
      expect_equal(got, want,
                   name + " after step 2, streamed, resumed at offload " + std::to_string(fraction));
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
