// The backward's started TP collectives (TpCollectives::start_* and wait, run on a stream of
// their own by the CUDA engine over NCCL) keep their contract in the model: between start and
// wait no op reads a collective's output or writes its tensors. Checked on CPU ranks with a
// TpCollectives that holds each started collective back until wait and poisons its output
// meanwhile: a model breaking the contract would compute other bits than with plain calls.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "core/allocator.h"
#include "ops/cpu/cpu_ops.h"
#include "parallel/comm_tp_collectives.h"
#include "parallel_train_util.h"

namespace loom {
namespace {

void poison(Tensor t) {
  std::fill_n(t.as<float>(), t.numel(), std::numeric_limits<float>::quiet_NaN());
}

class DeferringTpCollectives final : public TpCollectives {
 public:
  explicit DeferringTpCollectives(TpCollectives& plain) : plain_(plain) {}
  ~DeferringTpCollectives() override { EXPECT_EQ(held_, 0) << "a started collective was never waited for"; }

  void all_reduce(Tensor x) override { plain_.all_reduce(x); }
  void all_gather(Tensor full, Tensor part) override { plain_.all_gather(full, part); }
  void reduce_scatter(Tensor part, Tensor full) override { plain_.reduce_scatter(part, full); }

  // x is input and output: its values are kept aside and x poisoned until wait.
  TpPending start_all_reduce(Tensor x) override {
    Deferred d{Kind::all_reduce, x, Tensor{}, std::vector<float>(x.as<float>(), x.as<float>() + x.numel())};
    poison(x);
    return hold(std::move(d));
  }
  TpPending start_all_gather(Tensor full, Tensor part) override {
    poison(full);
    return hold({Kind::all_gather, full, part, {}});
  }
  TpPending start_reduce_scatter(Tensor part, Tensor full) override {
    poison(part);
    return hold({Kind::reduce_scatter, part, full, {}});
  }
  void wait(TpPending pending) override {
    if (pending.slot < 0) return;
    Deferred& d = deferred_[static_cast<size_t>(pending.slot)];
    switch (d.kind) {
      case Kind::all_reduce:
        std::memcpy(d.out.data, d.kept.data(), d.kept.size() * 4);
        plain_.all_reduce(d.out);
        break;
      case Kind::all_gather: plain_.all_gather(d.out, d.in); break;
      case Kind::reduce_scatter: plain_.reduce_scatter(d.out, d.in); break;
    }
    --held_;
  }
  int started() const { return static_cast<int>(deferred_.size()); }

 private:
  enum class Kind { all_reduce, all_gather, reduce_scatter };
  struct Deferred {
    Kind kind;
    Tensor out, in;
    std::vector<float> kept;
  };
  TpPending hold(Deferred d) {
    deferred_.push_back(std::move(d));
    ++held_;
    return {static_cast<int>(deferred_.size()) - 1};
  }
  TpCollectives& plain_;
  std::vector<Deferred> deferred_;
  int held_ = 0;
};

struct RankResult {
  double nll = 0;
  std::vector<float> grads;
  int started = 0;
};

// One forward and backward of two rows on every rank of a TP layout; rank 0's result.
RankResult forward_backward(const Model& m, const Layout& l, const RecomputePolicy& recompute, bool defer) {
  RankResult out;
  std::mutex mutex;
  run_in_process(l.layout.world_size(), [&](Comm& world) {
    Groups g = groups_create(world, l.layout, kTimeout);
    RankWeights w = rank_weights(m, l, g.coords);
    CpuOps ops;
    CommTpCollectives plain(*g.tp, kTimeout);
    DeferringTpCollectives deferring(plain);
    TpCollectives* tp = defer ? static_cast<TpCollectives*>(&deferring) : &plain;
    DecoderModel model(m.config, w.shard.table, ops, recompute, w.shard.model, tp);
    MicroBatchData batch = micro_batch_build(m.rows, {0, 1});
    HostArena scratch;
    const double nll = model.forward_backward(w.tensors(), batch.view(), scratch, 1.0f);
    if (world.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      out = {nll, w.grads, deferring.started()};
    }
  });
  return out;
}

class TpOverlapTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TpOverlapTest, StartedCollectivesHeldBackUntilWaitGiveThePlainBits) {
  const Model m = tiny(GetParam());
  using G = RecomputePolicy::Granularity;
  for (const Layout& l : {Layout{"tp2", {2, 1, 1, 1}, false, {}}, Layout{"tp2_sp", {2, 1, 1, 1}, true, {}},
                          Layout{"tp4_sp", {4, 1, 1, 1}, true, {}}})
    for (const RecomputePolicy& recompute :
         {RecomputePolicy{}, RecomputePolicy{G::full, false, 1}, RecomputePolicy{G::selective, false, 1}}) {
      SCOPED_TRACE(l.name + " recompute " + std::to_string(static_cast<int>(recompute.granularity)));
      const RankResult plain = forward_backward(m, l, recompute, false);
      const RankResult deferred = forward_backward(m, l, recompute, true);
      // Two column-parallel linears a layer, each starting its input gradient's reduction
      // and, under SP, its input's re-gather.
      EXPECT_EQ(deferred.started,
                static_cast<int>(m.config.num_hidden_layers) * 2 * (l.sequence_parallel ? 2 : 1));
      EXPECT_TRUE(std::isfinite(plain.nll));
      EXPECT_EQ(deferred.nll, plain.nll);
      ASSERT_EQ(deferred.grads.size(), plain.grads.size());
      EXPECT_EQ(std::memcmp(deferred.grads.data(), plain.grads.data(), plain.grads.size() * 4), 0);
    }
}

INSTANTIATE_TEST_SUITE_P(Tiny, TpOverlapTest,
                         ::testing::Values("tiny_untied", "tiny_tied", "tiny_llama", "tiny_qwen2"));

}  // namespace
}  // namespace loom
