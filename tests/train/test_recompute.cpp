// Activation recompute (full uniform, full block, selective) runs the same ops on the same
// inputs as keeping every activation, so two steps of training give the same Σ nll, grad
// norm and updated masters bit for bit, while the activations' peak goes down; so does full
// recompute with its chunk inputs offloaded to host memory (layout.activation_offload), and a
// resume of it. On the CPU engine always (whose offload twin poisons a slot each time it hands
// it out again); on the CUDA engine where a GPU is visible.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "io/hf_checkpoint.h"
#include "io/init.h"
#include "model/param_table.h"
#include "train/cuda_device.h"
#include "train/engine.h"
#include "train/engine_inspect.h"
#include "train/rows.h"
#include "train/train_step.h"

namespace loom {
namespace {

struct Case {
  std::string name;
  RecomputePolicy policy;
  bool saves_memory;  // one chunk of every layer holds what keeping everything holds
};

std::vector<Case> cases() {
  using G = RecomputePolicy::Granularity;
  return {{"full_uniform_1", {G::full, false, 1}, true},
          {"full_uniform_2", {G::full, false, 2}, true},
          {"full_uniform_all", {G::full, false, 5}, false},
          {"full_block_2", {G::full, true, 2}, true},
          {"full_block_more_than_layers", {G::full, true, 9}, true},
          {"selective", {G::selective, false, 1}, true}};
}

struct Trace {
  std::vector<double> loss, grad_norm;
  std::vector<float> masters;
  int64_t peak_bytes = 0;
};

class RecomputeTest : public ::testing::TestWithParam<std::string> {
 protected:
  // The golden tiny model with five layers, so chunks of 1, 2 and all layers differ.
  void SetUp() override {
    config_ = hf_checkpoint_read_config("golden/tiny_untied/model");
    config_.num_hidden_layers = 5;
    table_ = param_table_build(config_);
    params_.resize(static_cast<size_t>(table_.total_numel));
    init_random_params(config_, table_, 7, params_.data());
    rows_ = rows_load_jsonl("golden/tiny_untied/rows.jsonl", 24, config_.vocab_size);
  }

  std::unique_ptr<TrainEngine> engine(const RecomputePolicy& policy, bool activation_offload = false) {
    EngineOptions options;
    options.recompute = policy;
    options.activation_offload = activation_offload;
    OwnedParamSource source(params_);
    return engine_create(config_, table_, source,
                         GetParam() == "cuda" ? EngineDevice::cuda : EngineDevice::cpu, options);
  }

  static StepSpec step_spec(int64_t row_tokens) {
    StepSpec spec;
    spec.global_batch = 4;
    spec.max_tokens_per_gpu = 2 * row_tokens;
    spec.adam = AdamWConfig{0.9f, 0.98f, 1e-8f, 0.1f};
    return spec;
  }

  // Steps [first, last] of two micro-batches of two rows each, on `e`.
  void steps(TrainEngine& e, int64_t first, int64_t last, Trace& trace) {
    for (int64_t step = first; step <= last; ++step) {
      const StepResult r = train_step(e, rows_, step, 1e-3f, step_spec(rows_.row_tokens), nullptr, table_);
      trace.loss.push_back(r.loss);
      trace.grad_norm.push_back(r.grad_norm);
    }
  }

  // Two steps.
  Trace train(const RecomputePolicy& policy, bool activation_offload = false) {
    std::unique_ptr<TrainEngine> e = engine(policy, activation_offload);
    Trace trace;
    steps(*e, 1, 2, trace);
    trace.masters = engine_masters(*e);
    trace.peak_bytes = e->peak_bytes();
    return trace;
  }

  static void expect_same(const Trace& t, const Trace& reference) {
    ASSERT_EQ(t.loss.size(), reference.loss.size());
    for (size_t i = 0; i < t.loss.size(); ++i) EXPECT_EQ(t.loss[i], reference.loss[i]) << "step " << i + 1;
    for (size_t i = 0; i < t.grad_norm.size(); ++i)
      EXPECT_EQ(t.grad_norm[i], reference.grad_norm[i]) << "step " << i + 1;
    ASSERT_EQ(t.masters.size(), reference.masters.size());
    EXPECT_EQ(std::memcmp(t.masters.data(), reference.masters.data(), t.masters.size() * sizeof(float)), 0)
        << "the masters after two steps differ";
  }

  ModelConfig config_;
  ParamTable table_;
  std::vector<float> params_;
  RowSet rows_;
};

TEST_P(RecomputeTest, EveryPolicyEqualsKeepingEverythingBitForBit) {
  std::string why;
  if (GetParam() == "cuda" && !cuda_engine_available(&why))
    GTEST_SKIP() << "the CUDA recompute test did not run: " << why;
  const Trace reference = train({});
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Trace t = train(c.policy);
    expect_same(t, reference);
    // The CUDA engine reports the process's peak of reserved GPU memory, which a process
    // running several engines one after another cannot lower: there the memory saved is
    // measured by whole runs (bench/results/2026-12-03-recompute-h200.json).
    if (GetParam() != "cpu") continue;
    if (c.saves_memory)
      EXPECT_LT(t.peak_bytes, reference.peak_bytes) << "recompute kept as much memory as keeping everything";
    else
      EXPECT_LE(t.peak_bytes, reference.peak_bytes);
  }
}

// layout.activation_offload moves full recompute's chunk inputs to host memory and back:
// the same bits as keeping them, with chunks of one and two layers and with block recompute
// (whose last chunk's successor is a kept layer).
TEST_P(RecomputeTest, ActivationOffloadEqualsKeepingTheChunkInputsBitForBit) {
  std::string why;
  if (GetParam() == "cuda" && !cuda_engine_available(&why))
    GTEST_SKIP() << "the CUDA activation offload test did not run: " << why;
  using G = RecomputePolicy::Granularity;
  const Trace reference = train({});
  for (const RecomputePolicy& policy :
       {RecomputePolicy{G::full, false, 1}, RecomputePolicy{G::full, false, 2},
        RecomputePolicy{G::full, true, 3}}) {
    SCOPED_TRACE("num_layers " + std::to_string(policy.num_layers) + (policy.block ? " block" : " uniform"));
    expect_same(train(policy, /*activation_offload=*/true), reference);
  }
}

// A run with its chunk inputs offloaded resumes from its state bit for bit: step 2 of an
// engine restored from step 1's state equals step 2 of the straight run.
TEST_P(RecomputeTest, ActivationOffloadResumesTheSame) {
  std::string why;
  if (GetParam() == "cuda" && !cuda_engine_available(&why))
    GTEST_SKIP() << "the CUDA activation offload test did not run: " << why;
  const RecomputePolicy policy{RecomputePolicy::Granularity::full, false, 1};
  const Trace straight = train(policy, true);
  Trace resumed;
  TrainState saved;
  {
    std::unique_ptr<TrainEngine> first = engine(policy, true);
    steps(*first, 1, 1, resumed);
    first->state_to_host(saved);
  }
  std::unique_ptr<TrainEngine> second = engine(policy, true);
  second->state_from_host(saved);
  steps(*second, 2, 2, resumed);
  resumed.masters = engine_masters(*second);
  expect_same(resumed, straight);
}

// Fewer layers per chunk keep fewer activations at once: chunks of one layer hold less than
// chunks of two, which hold less than one chunk of all five.
// On the CPU engine, whose peak is this engine's own (see above).
TEST_P(RecomputeTest, SmallerChunksHoldLessMemory) {
  if (GetParam() != "cpu") GTEST_SKIP() << "memory per engine is measured on the CPU engine only (see above)";
  using G = RecomputePolicy::Granularity;
  const int64_t one = train({G::full, false, 1}).peak_bytes;
  const int64_t two = train({G::full, false, 2}).peak_bytes;
  const int64_t all = train({G::full, false, 5}).peak_bytes;
  EXPECT_LT(one, two);
  EXPECT_LT(two, all);
}

// Named by the engine: CTest labels the cuda cases gpu (tests/train/CMakeLists.txt).
INSTANTIATE_TEST_SUITE_P(Engines, RecomputeTest, ::testing::Values("cpu", "cuda"),
                         [](const ::testing::TestParamInfo<std::string>& engine) { return engine.param; });

}  // namespace
}  // namespace loom
