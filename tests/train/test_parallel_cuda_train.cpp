// The parallel CUDA engine (train/engine.h parallel_cuda_engine_create) on one GPU, its ranks
// threads sharing it (label gpu; skipped with a message where no GPU is visible). NCCL
// refuses two ranks on one device, so the device groups are HostStagedComm over the threads'
// InProcessComm: every transfer goes through host memory, summed in rank order. What is
// checked is the engine: the shard, the schedule, the reductions and the distributed
// optimizer on GPU tensors in bf16, against the single-GPU CudaEngine trained on the same
// rows (tests/train/parallel_train_util.h): every layout of the CPU engine's test equals it
// within bf16's rounding, recompute under TP2 × PP2 is bit for bit, the state saved on one
// layout resumes on another, and offloading half the optimizer under DP2 changes no bit.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "parallel/host_staged_comm.h"
#include "parallel_train_util.h"

namespace loom {
namespace {

// The single GPU runs each row's ops over the whole sequence in one call and sums every
// GEMM over K in fp32; TP splits heads and FFN columns and adds the row-parallel partial
// sums in bf16 (as Megatron does), and PP hands bf16 activations over; each changes
// roundings in the bf16 activations. Bounds: the observed worst over both models and
// every layout (printed by each run, docs/parallel.md) times a few.
constexpr double kLossRel = 2e-3, kNormRel = 2e-2, kGradsRelL2 = 5e-2;
constexpr double kWeightsRelL2 = 2e-2;

struct DeviceGroups {
  std::unique_ptr<Comm> world;
  Groups groups;
};

// One GPU rank: its device groups over its host world, staged through host memory.
EngineFactory cuda_ranks(const Model& m, double offload_fraction = 0.0) {
  return [&m, offload_fraction](const EngineOptions& options, Groups& g) {
    auto device = std::make_shared<DeviceGroups>();
    device->world = host_staged_comm_create(*g.world);
    device->groups = groups_create(*device->world, g.layout, kTimeout);
    EngineOptions mine = options;
    mine.offload.fraction = offload_fraction;
    ArrayParamSource source(m.params);
    std::unique_ptr<TrainEngine> e =
        parallel_cuda_engine_create(m.config, m.table, source, mine, g, device->groups);
    return RankEngine{device, std::move(e)};
  };
}

Trace train_one_gpu(const Model& m) {
  ArrayParamSource source(m.params);
  return train_single(m, *cuda_engine_create(m.config, m.table, source, EngineOptions{}));
}

void expect_close(const std::string& name, const Trace& t, const Trace& ref,
                  const std::vector<float>& initial) {
  ASSERT_EQ(t.loss.size(), ref.loss.size());
  ASSERT_EQ(t.grads.size(), ref.grads.size());
  const double loss = worst_rel(t.loss, ref.loss), norm = worst_rel(t.norm, ref.norm);
  const double grads = rel_l2(t.grads, ref.grads), weights = rel_l2(t.masters, ref.masters);
  std::printf("%-18s loss %.2g  grad norm %.2g  step-1 grads %.2g  weights %.2g  Adam m %.2g  v %.2g\n",
              name.c_str(), loss, norm, grads, weights, rel_l2(t.state.adam_m, ref.state.adam_m),
              rel_l2(t.state.adam_v, ref.state.adam_v));
  EXPECT_LE(loss, kLossRel);
  EXPECT_LE(norm, kNormRel);
  EXPECT_LE(grads, kGradsRelL2) << "step 1's grads";
  EXPECT_LE(weights, kWeightsRelL2) << "final weights";
  // The weights must have moved as far as one GPU's did: a layout that trained nothing
  // would still be "close" in relative terms.
  EXPECT_GT(rel_l2(t.masters, initial), rel_l2(ref.masters, initial) / 2);
}

class ParallelCudaTrainTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_engine_available(&why)) GTEST_SKIP() << "the parallel CUDA engine test did not run: " << why;
  }
};

TEST_P(ParallelCudaTrainTest, EveryLayoutEqualsOneGpu) {
  const Model m = tiny(GetParam());
  const Trace reference = train_one_gpu(m);
  for (const Layout& l : layouts()) {
    SCOPED_TRACE(l.name);
    expect_close(GetParam() + " " + l.name, train_layout(m, l, cuda_ranks(m)), reference, m.params);
  }
}

// The ops of a recomputed chunk are the ones the forward ran, collectives included; and a
// layout run twice gives the same bits (cuDNN's deterministic backward, rank-order sums).
TEST_P(ParallelCudaTrainTest, RecomputeUnderTp2Pp2IsBitForBit) {
  const Model m = tiny(GetParam());
  using G = RecomputePolicy::Granularity;
  const Layout l{"tp2_pp2", {2, 1, 1, 2}, true, {}};
  const Trace keep = train_layout(m, l, cuda_ranks(m));
  for (const RecomputePolicy& policy :
       {RecomputePolicy{}, RecomputePolicy{G::full, false, 1}, RecomputePolicy{G::full, true, 1},
        RecomputePolicy{G::selective, false, 1}}) {
    const Trace t = train_layout(m, l, cuda_ranks(m), policy);
    EXPECT_EQ(t.loss, keep.loss);
    EXPECT_EQ(t.norm, keep.norm);
    EXPECT_EQ(std::memcmp(t.masters.data(), keep.masters.data(), t.masters.size() * sizeof(float)), 0);
  }
}

// The state is the full model's whatever the layout: saved on TP2 × PP2 after two steps, it
// loads bit for bit on DP2 × PP2, and the run resumed on DP2 ends where one GPU does.
TEST_P(ParallelCudaTrainTest, StateSavedOnOneLayoutResumesOnAnother) {
  const Model m = tiny(GetParam());
  const Trace reference = train_one_gpu(m);
  const Trace first = train_layout(m, {"tp2_pp2", {2, 1, 1, 2}, true, {}}, cuda_ranks(m), {}, nullptr, 1, 2);
  const Trace again =
      train_layout(m, {"dp2_pp2", {1, 1, 2, 2}, false, {}}, cuda_ranks(m), {}, &first.state, 3, 2);
  EXPECT_EQ(again.state.master, first.state.master);
  EXPECT_EQ(again.state.adam_m, first.state.adam_m);
  EXPECT_EQ(again.state.adam_v, first.state.adam_v);
  const Trace resumed =
      train_layout(m, {"dp2", {1, 1, 2, 1}, false, {}}, cuda_ranks(m), {}, &first.state, 3, 3);
  ASSERT_EQ(resumed.loss.size(), 1u);
  EXPECT_LE(rel(resumed.loss[0], reference.loss[2]), kLossRel);
  EXPECT_LE(rel_l2(resumed.masters, reference.masters), kWeightsRelL2);
}

// Each DP rank's CudaAdamW steps its slice; offloading half of it to the CPU gives its bits.
TEST_P(ParallelCudaTrainTest, OffloadUnderDp2ChangesNoBit) {
  const Model m = tiny(GetParam());
  const Layout l{"tp2_dp2", {2, 1, 2, 1}, true, {}};
  const Trace gpu = train_layout(m, l, cuda_ranks(m));
  const Trace half = train_layout(m, l, cuda_ranks(m, 0.5));
  EXPECT_EQ(half.loss, gpu.loss);
  EXPECT_EQ(half.state.master, gpu.state.master);
  EXPECT_EQ(half.state.adam_m, gpu.state.adam_m);
  EXPECT_EQ(half.state.adam_v, gpu.state.adam_v);
}

INSTANTIATE_TEST_SUITE_P(Tiny, ParallelCudaTrainTest, ::testing::Values("tiny_untied", "tiny_tied"));

}  // namespace
}  // namespace loom
