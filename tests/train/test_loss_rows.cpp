// The lm_head on a micro-batch's loss rows alone (decoder.h MicroBatch): which rows
// loss_rows_build picks, and that the model's loss and grads are those of the lm_head on
// every position, on one rank and under TP (with and without sequence parallelism).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <mutex>
#include <string>

#include "core/allocator.h"
#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "parallel/comm_tp_collectives.h"
#include "parallel_train_util.h"

namespace loom {
namespace {

MicroBatchData with_targets(std::vector<int32_t> targets) {
  MicroBatchData b;
  b.ids.assign(targets.size(), 1);
  b.targets = std::move(targets);
  return b;
}

// A row's key written twice was once read as its last value: refused with the line.
TEST(RowsJsonl, AKeyWrittenTwiceIsRefusedWithItsLine) {
  const std::string path = ::testing::TempDir() + "loom-rows-duplicate.jsonl";
  std::ofstream(path) << "{\"tokens\": [1, 2], \"loss_mask\": [1, 1]}\n"
                      << "{\"tokens\": [1, 2], \"loss_mask\": [1, 1], \"tokens\": [3, 4]}\n";
  try {
    rows_load_jsonl(path, 2, 8);
    ADD_FAILURE() << "rows with a duplicate key were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(path + ":2: found the key 'tokens' a second time"),
              std::string::npos)
        << e.what();
  }
}

TEST(LossRows, PositionsWithATargetThenPaddingToTheGranule) {
  MicroBatchData b = with_targets({-1, 5, -1, -1, 7, 9, -1, -1, -1, -1, 3, -1});
  loss_rows_build(b, 3);
  EXPECT_EQ(b.loss_rows, 4);
  EXPECT_EQ(b.loss_positions, (std::vector<int32_t>{1, 4, 5, 10, 0, 0}));
  EXPECT_EQ(b.loss_targets, (std::vector<int32_t>{5, 7, 9, 3, -1, -1}));
  const MicroBatch view = b.view();
  EXPECT_EQ(view.loss_positions.numel(), 6);
  EXPECT_EQ(view.loss_targets.numel(), 6);
  EXPECT_EQ(view.loss_rows, 4);
}

TEST(LossRows, NoneWhenThePaddedRowsAreNotFewerThanThePositions) {
  MicroBatchData all = with_targets({4, 5, 6, 7, 8, -1});  // 5 targets, padded to 6 = T
  loss_rows_build(all, 3);
  EXPECT_TRUE(all.loss_positions.empty());
  EXPECT_EQ(all.view().loss_positions.data, nullptr);
  MicroBatchData every = with_targets({4, 5, 6, 7});
  loss_rows_build(every, 1);
  EXPECT_TRUE(every.loss_positions.empty());
  // micro_batch_build's granule (512) is more than a tiny row: no loss rows there.
  const Model m = tiny("tiny_untied");
  EXPECT_TRUE(micro_batch_build(m.rows, {0, 1}).loss_positions.empty());
}

TEST(LossRows, AMicroBatchWithoutTargetsKeepsOneGranuleOfPadding) {
  MicroBatchData b = with_targets(std::vector<int32_t>(10, -1));
  loss_rows_build(b, 4);
  EXPECT_EQ(b.loss_rows, 0);
  EXPECT_EQ(b.loss_positions, (std::vector<int32_t>{0, 0, 0, 0}));
  EXPECT_EQ(b.loss_targets, (std::vector<int32_t>{-1, -1, -1, -1}));
}

struct Result {
  double nll = 0;
  std::vector<float> grads;  // rank 0's
};

// Rows 0 and 1 of the tiny model with the targets of each row's first `masked` positions
// removed (a prompt under the loss mask), as one micro-batch; with loss rows of `granule`,
// or none when granule is 0.
MicroBatchData masked_batch(const Model& m, int64_t masked, int64_t granule) {
  MicroBatchData b = micro_batch_build(m.rows, {0, 1});
  for (size_t r = 0; r + 1 < b.rows.offsets.size(); ++r)
    for (int64_t p = 0; p < masked; ++p) b.targets[static_cast<size_t>(b.rows.offsets[r] + p)] = -1;
  // micro_batch_build's granule makes no loss rows of rows this short (tested above).
  if (granule > 0) loss_rows_build(b, granule);
  return b;
}

// One forward and backward of `batch` on every rank of `layout`: the nll and rank 0's grads.
Result forward_backward(const Model& m, const Layout& l, const MicroBatchData& batch) {
  Result out;
  std::mutex mutex;
  run_in_process(l.layout.world_size(), [&](Comm& world) {
    Groups g = groups_create(world, l.layout, kTimeout);
    RankWeights w = rank_weights(m, l, g.coords);
    CpuOps ops;
    std::unique_ptr<CommTpCollectives> tp;
    if (l.layout.tp > 1) tp = std::make_unique<CommTpCollectives>(*g.tp, kTimeout);
    DecoderModel model(m.config, w.shard.table, ops, {}, w.shard.model, tp.get());
    MicroBatchData copy = batch;
    HostArena scratch;
    const double nll = model.forward_backward(w.tensors(), copy.view(), scratch, 1.0f);
    if (world.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      out = {nll, w.grads};
    }
  });
  return out;
}

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double largest = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return largest / scale;
}

class LossRowsModel : public ::testing::TestWithParam<std::string> {};

TEST_P(LossRowsModel, TheLmHeadOnTheLossRowsGivesTheLossAndGradsOfEveryPosition) {
  const Model m = tiny(GetParam());
  const Layout one{"one rank", {1, 1, 1, 1}, false, {}};
  for (const int64_t masked : {0, 9}) {
    SCOPED_TRACE("first " + std::to_string(masked) + " positions of each row masked");
    const MicroBatchData everywhere = masked_batch(m, masked, 0);
    const MicroBatchData rows_only = masked_batch(m, masked, 4);
    ASSERT_FALSE(rows_only.loss_positions.empty());
    ASSERT_LT(rows_only.loss_positions.size(), rows_only.targets.size());
    const Result want = forward_backward(m, one, everywhere);
    for (const Layout& l :
         {one, Layout{"tp2", {2, 1, 1, 1}, false, {}}, Layout{"tp2_sp", {2, 1, 1, 1}, true, {}}}) {
      SCOPED_TRACE(l.name);
      const Result got = forward_backward(m, l, rows_only);
      EXPECT_NEAR(got.nll, want.nll, 1e-6 * std::fabs(want.nll));
      if (l.layout.tp == 1) {
        // One rank: the same per-token arithmetic; only the lm_head weight gradient's
        // additions over tokens may be grouped otherwise.
        ASSERT_EQ(got.grads.size(), want.grads.size());
        EXPECT_LT(max_relative_difference(got.grads, want.grads), 1e-6);
      }
    }
    // Under TP, against TP on every position: rank 0's shard of the grads.
    for (const Layout& l :
         {Layout{"tp2", {2, 1, 1, 1}, false, {}}, Layout{"tp2_sp", {2, 1, 1, 1}, true, {}}}) {
      SCOPED_TRACE(l.name + " against itself on every position");
      const Result got = forward_backward(m, l, rows_only), plain = forward_backward(m, l, everywhere);
      ASSERT_EQ(got.grads.size(), plain.grads.size());
      EXPECT_LT(max_relative_difference(got.grads, plain.grads), 1e-6);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, LossRowsModel,
                         ::testing::Values("tiny_untied", "tiny_tied", "tiny_llama", "tiny_qwen2"));

}  // namespace
}  // namespace loom
