// The parallel CPU engine (train/engine.h parallel_cpu_engine_create) on threads as ranks
// (run_in_process): a tiny random Qwen3 trained a few steps under TP, TP + SP, DP, PP and
// their combinations equals the one-rank CpuEngine up to fp32 rounding (the sums run in
// another order), recompute under TP × PP changes nothing bit for bit, and the state a
// layout saves resumes on another.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/hf_checkpoint.h"
#include "io/init.h"
#include "model/param_table.h"
#include "optim/grad_clip.h"
#include "parallel/in_process_comm.h"
#include "parallel/micro_batching.h"
#include "recipe/recipe.h"
#include "train/engine.h"
#include "train/metrics.h"
#include "train/rows.h"
#include "train/trainer.h"

namespace loom {
namespace {

constexpr int64_t kSteps = 3, kGlobalBatch = 4;
constexpr float kLr = 1e-2f;
constexpr CommTimeout kTimeout{std::chrono::seconds(60)};
const AdamWConfig kAdam{0.9f, 0.98f, 1e-8f, 0.1f};

// Observed (x86-64, this tree), worst over both models and every layout below: loss rel
// 2.8e-7, grad norm rel 5.2e-6, step-1 grads rel L2 5.6e-7. The weights after 3 steps
// differ more: Adam divides by sqrt(v) + eps, so an element whose grad is near 0 (|g| ~ eps)
// turns a rounding difference of its grad into one of up to lr in its update. Observed:
// rel L2 5.1e-4, max |Δ| 1.6e-2 = 1.6 lr (one embedding element), Adam m, v rel L2 4e-5.
// The bounds are a few times these.
constexpr double kLossRel = 2e-6, kNormRel = 2e-5, kGradsRelL2 = 2e-6;
constexpr double kWeightsRelL2 = 2e-3, kWeightsMaxAbs = 3.0 * kLr;

struct Trace {
  std::vector<double> loss, norm;
  std::vector<float> grads;  // step 1's, scaled by 1/Σn, before clipping
  std::vector<float> masters;
  TrainState state;
};

struct Model {
  Qwen3Config config;
  ParamTable table;
  std::vector<float> params;
  RowSet rows;
};

// The golden tiny models: untied with 4 q / 2 kv heads (KV heads split under TP2, shared by
// two ranks under TP4), tied with 4 q / 1 kv head (replicated under TP2 and TP4); four
// layers so that PP2 splits them.
Model tiny(const std::string& name) {
  Model m;
  m.config = hf_checkpoint_read_config("golden/" + name + "/model");
  m.config.num_hidden_layers = 4;
  m.table = param_table_build(m.config);
  m.params.resize(static_cast<size_t>(m.table.total_numel));
  init_random_params(m.config, m.table, 11, m.params.data());
  m.rows =
      rows_load_jsonl("golden/" + name + "/rows.jsonl", name == "tiny_tied" ? 20 : 24, m.config.vocab_size);
  return m;
}

int64_t denominator(const RowSet& data, const std::vector<int64_t>& rows) {
  int64_t n = 0;
  for (int64_t r : rows) n += data.row_denominator(r);
  return n;
}

// One step on `engine` of the rows this DP rank runs, one row per micro-batch (so that PP2
// has several in flight); returns (loss, grad norm) and, when asked, the grads.
std::pair<double, double> step(TrainEngine& e, const Model& m, int64_t step, int dp, int dp_rank,
                               std::vector<float>* grads = nullptr) {
  e.zero_grads();
  const std::vector<int64_t> rows = step_rows(m.rows, step, kGlobalBatch);
  const MicroBatchPlan plan =
      micro_batches_plan(std::vector<int64_t>(rows.size(), m.rows.row_tokens), m.rows.row_tokens, 1, dp);
  std::vector<MicroBatchData> batches;
  for (const std::vector<int64_t>& mb : plan.per_rank[static_cast<size_t>(dp_rank)]) {
    std::vector<int64_t> picked;
    for (int64_t i : mb) picked.push_back(rows[static_cast<size_t>(i)]);
    batches.push_back(micro_batch_build(m.rows, picked));
  }
  const int64_t n = denominator(m.rows, rows);
  const double nll = e.micro_batches(batches);
  e.scale_grads(static_cast<float>(1.0 / static_cast<double>(n)));
  const double norm = std::sqrt(e.grad_sum_squares());
  if (grads) *grads = e.grads_to_host();
  const float clip = grad_clip_coefficient(norm, 1.0);
  if (clip < 1.0f) e.scale_grads(clip);
  e.optimizer_step(kAdam, kLr, step);
  return {nll / static_cast<double>(n), norm};
}

Trace train_one_rank(const Model& m, const RecomputePolicy& recompute = {}) {
  EngineOptions options;
  options.recompute = recompute;
  std::unique_ptr<TrainEngine> e = cpu_engine_create(m.config, m.table, m.params, options);
  Trace t;
  for (int64_t s = 1; s <= kSteps; ++s) {
    auto [loss, norm] = step(*e, m, s, 1, 0, s == 1 ? &t.grads : nullptr);
    t.loss.push_back(loss);
    t.norm.push_back(norm);
  }
  t.masters = e->master_params();
  e->state_to_host(t.state);
  return t;
}

struct Layout {
  std::string name;
  ParallelLayout layout;
  bool sequence_parallel = false;
  std::vector<int64_t> layer_split;
};

// Runs steps [first, last] on every rank of `l`, from `resume` when given; rank 0's trace.
Trace train_parallel(const Model& m, const Layout& l, const RecomputePolicy& recompute = {},
                     const TrainState* resume = nullptr, int64_t first = 1, int64_t last = kSteps) {
  EngineOptions options;
  options.recompute = recompute;
  options.sequence_parallel = l.sequence_parallel;
  options.layer_split = l.layer_split;
  options.comm_timeout = kTimeout;
  Trace out;
  std::mutex mutex;
  run_in_process(l.layout.world_size(), [&](Comm& world) {
    Groups g = groups_create(world, l.layout, kTimeout);
    std::unique_ptr<TrainEngine> e = parallel_cpu_engine_create(m.config, m.table, m.params, options, g);
    if (resume) e->state_from_host(*resume);
    Trace t;
    for (int64_t s = first; s <= last; ++s) {
      auto [loss, norm] = step(*e, m, s, l.layout.dp, g.coords.dp, s == 1 ? &t.grads : nullptr);
      t.loss.push_back(loss);
      t.norm.push_back(norm);
    }
    t.masters = e->master_params();
    e->state_to_host(t.state);
    if (world.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      out = std::move(t);
    }
  });
  return out;
}

double rel(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::abs(static_cast<double>(a[i]) - b[i]));
  return most;
}

double worst_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, rel(a[i], b[i]));
  return most;
}

void expect_close(const Trace& t, const Trace& ref) {
  ASSERT_EQ(t.loss.size(), ref.loss.size());
  for (size_t i = 0; i < t.loss.size(); ++i) {
    EXPECT_LE(rel(t.loss[i], ref.loss[i]), kLossRel)
        << "step " << i + 1 << " loss " << t.loss[i] << " vs " << ref.loss[i];
    EXPECT_LE(rel(t.norm[i], ref.norm[i]), kNormRel)
        << "step " << i + 1 << " grad norm " << t.norm[i] << " vs " << ref.norm[i];
  }
  ASSERT_EQ(t.grads.size(), ref.grads.size());
  EXPECT_LE(rel_l2(t.grads, ref.grads), kGradsRelL2) << "step 1's grads";
  ASSERT_EQ(t.masters.size(), ref.masters.size());
  EXPECT_LE(rel_l2(t.masters, ref.masters), kWeightsRelL2) << "final weights";
  EXPECT_LE(max_abs(t.masters, ref.masters), kWeightsMaxAbs) << "final weights";
  EXPECT_LE(rel_l2(t.state.adam_m, ref.state.adam_m), kWeightsRelL2) << "Adam m";
  EXPECT_LE(rel_l2(t.state.adam_v, ref.state.adam_v), kWeightsRelL2) << "Adam v";
  if (std::getenv("LOOM_PRINT_ERRORS"))
    std::printf("loss %.2g norm %.2g grads %.2g weights %.2g (max %.2g) m %.2g v %.2g\n",
                worst_rel(t.loss, ref.loss), worst_rel(t.norm, ref.norm), rel_l2(t.grads, ref.grads),
                rel_l2(t.masters, ref.masters), max_abs(t.masters, ref.masters),
                rel_l2(t.state.adam_m, ref.state.adam_m), rel_l2(t.state.adam_v, ref.state.adam_v));
  // The weights must have moved: a layout that trained nothing would still be "close".
  EXPECT_GT(rel_l2(t.masters, std::vector<float>(t.masters.size(), 0.0f)), 0.0);
}

std::vector<Layout> layouts() {
  return {{"tp2", {2, 1, 1, 1}, false, {}},
          {"tp2_sp", {2, 1, 1, 1}, true, {}},
          {"tp4_sp", {4, 1, 1, 1}, true, {}},  // KV heads replicated over 2 (untied) or 4 (tied) ranks
          {"dp2", {1, 1, 2, 1}, false, {}},
          {"pp2", {1, 1, 1, 2}, false, {}},
          {"pp2_split_3_1", {1, 1, 1, 2}, false, {3, 1}},
          {"tp2_pp2", {2, 1, 1, 2}, true, {}},
          {"tp2_pp2_dp2", {2, 1, 2, 2}, true, {}},
          {"tp2_nosp_pp2_dp2", {2, 1, 2, 2}, false, {1, 3}}};
}

class ParallelTrainTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ParallelTrainTest, EveryLayoutEqualsOneRank) {
  const Model m = tiny(GetParam());
  const Trace reference = train_one_rank(m);
  for (const Layout& l : layouts()) {
    SCOPED_TRACE(l.name);
    expect_close(train_parallel(m, l), reference);
  }
}

// The ops of a recomputed chunk are the ones the forward ran, collectives included.
TEST_P(ParallelTrainTest, RecomputeUnderTp2Pp2IsBitForBit) {
  const Model m = tiny(GetParam());
  using G = RecomputePolicy::Granularity;
  const Layout l{"tp2_pp2", {2, 1, 1, 2}, true, {}};
  const Trace keep = train_parallel(m, l);
  for (const RecomputePolicy& policy : {RecomputePolicy{G::full, false, 1}, RecomputePolicy{G::full, true, 1},
                                        RecomputePolicy{G::selective, false, 1}}) {
    const Trace t = train_parallel(m, l, policy);
    EXPECT_EQ(t.loss, keep.loss);
    EXPECT_EQ(t.norm, keep.norm);
    EXPECT_EQ(std::memcmp(t.masters.data(), keep.masters.data(), t.masters.size() * sizeof(float)), 0);
  }
}

// The state is the full model's, whatever the layout: saved on TP2 × PP2 after two steps,
// it resumes on DP2 (and on one rank) for the third, as if the run had not stopped.
TEST_P(ParallelTrainTest, StateSavedOnOneLayoutResumesOnAnother) {
  const Model m = tiny(GetParam());
  const Trace reference = train_one_rank(m);
  const Trace first = train_parallel(m, {"tp2_pp2", {2, 1, 1, 2}, true, {}}, {}, nullptr, 1, 2);
  // Restoring what state_to_host gave is bit for bit.
  const Trace again = train_parallel(m, {"dp2_pp2", {1, 1, 2, 2}, false, {}}, {}, &first.state, 3, 2);
  EXPECT_EQ(again.state.master, first.state.master);
  EXPECT_EQ(again.state.adam_m, first.state.adam_m);
  EXPECT_EQ(again.state.adam_v, first.state.adam_v);
  const Trace resumed = train_parallel(m, {"dp2", {1, 1, 2, 1}, false, {}}, {}, &first.state, 3, 3);
  ASSERT_EQ(resumed.loss.size(), 1u);
  EXPECT_LE(rel(resumed.loss[0], reference.loss[2]), kLossRel);
  EXPECT_LE(rel_l2(resumed.masters, reference.masters), kWeightsRelL2);
}

INSTANTIATE_TEST_SUITE_P(Tiny, ParallelTrainTest, ::testing::Values("tiny_untied", "tiny_tied"));

namespace fs = std::filesystem;

// `loom train` of the tiny recipe (tied embeddings) on a world of threads as ranks.
class ParallelTrainRun : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom_test_parallel_train_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs the recipe with `overrides` on tp·pp·dp ranks (one rank: no world).
  void train(const std::string& out, std::vector<std::string> overrides, int ranks, int64_t stop_at = 0) {
    overrides.insert(overrides.end(), {"train.output_dir=" + (dir_ / out).string(), "train.steps=4",
                                       "layout.max_tokens_per_gpu=64", "result.window=[2,4]"});
    const Recipe recipe = recipe_load(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/qwen3-tiny-cpu.yaml",
                                      overrides, RecipeUse::train);
    TrainOptions options;
    options.progress = false;
    options.stop_at_step = stop_at;
    if (ranks == 1) {
      train_run(recipe, options);
      return;
    }
    const ParallelLayout layout{static_cast<int>(recipe.layout.tp), static_cast<int>(recipe.layout.cp),
                                static_cast<int>(recipe.layout.dp), static_cast<int>(recipe.layout.pp)};
    run_in_process(ranks, [&](Comm& world) {
      Groups groups = groups_create(world, layout, kTimeout);
      TrainOptions mine = options;
      mine.groups = &groups;
      train_run(recipe, mine);
    });
  }
  std::vector<StepMetrics> metrics(const std::string& out) const {
    return metrics_read_jsonl((dir_ / out / "metrics.jsonl").string());
  }
  std::vector<float> final_weights(const std::string& out) const {
    const fs::path final_dir = dir_ / out / "final";
    const Qwen3Config config = hf_checkpoint_read_config(final_dir.string());
    const ParamTable table = param_table_build(config);
    std::vector<float> weights(static_cast<size_t>(table.total_numel));
    hf_checkpoint_load_params(final_dir.string(), config, table, weights.data());
    return weights;
  }
  fs::path dir_;
};

// TP2 + SP × PP2 × DP2 through train_run: rank 0 writes one metrics.jsonl (a line per step,
// tokens_per_s_per_gpu over 8 ranks), final/ and result.yaml; loss, grad norm and final
// weights are the one-rank run's up to fp32 rounding. Then a run stopped after step 2 with
// a checkpoint on TP2 × PP2 resumes on DP2 and ends where the one-rank run does.
TEST_F(ParallelTrainRun, TrainsResumesAcrossLayoutsAndEqualsOneRank) {
  train("one", {}, 1);
  train("par", {"layout.tp=2", "layout.pp=2", "layout.dp=2", "layout.sequence_parallel=true"}, 8);
  const std::vector<StepMetrics> one = metrics("one"), par = metrics("par");
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(par.size(), 4u);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(par[i].step, one[i].step);
    EXPECT_LE(rel(par[i].loss, one[i].loss), kLossRel) << "step " << i + 1;
    EXPECT_LE(rel(par[i].grad_norm, one[i].grad_norm), kNormRel) << "step " << i + 1;
    EXPECT_EQ(par[i].tokens, one[i].tokens);
  }
  EXPECT_TRUE(fs::exists(dir_ / "par" / "result.yaml"));
  const std::vector<float> reference = final_weights("one");
  EXPECT_LE(rel_l2(final_weights("par"), reference), kWeightsRelL2);

  train("resumed", {"layout.tp=2", "layout.pp=2", "layout.sequence_parallel=true"}, 4, 2);
  ASSERT_EQ(metrics("resumed").size(), 2u);
  EXPECT_FALSE(fs::exists(dir_ / "resumed" / "final"));
  train("resumed", {"layout.dp=2"}, 2);
  const std::vector<StepMetrics> resumed = metrics("resumed");
  ASSERT_EQ(resumed.size(), 4u);
  EXPECT_LE(rel(resumed[3].loss, one[3].loss), kLossRel);
  EXPECT_LE(rel_l2(final_weights("resumed"), reference), kWeightsRelL2);
}

// A layout that does not match the world, or context parallel, is refused up front.
TEST_F(ParallelTrainRun, RefusesAWorldOfAnotherSizeAndContextParallel) {
  try {
    train("bad", {"layout.tp=2"}, 1);
    FAIL() << "a tp=2 layout ran on one rank";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tp·pp·cp·dp = 2, but the run has 1 rank"), std::string::npos)
        << e.what();
  }
  try {
    train("bad_cp", {"layout.cp=2"}, 2);
    FAIL() << "a cp=2 layout ran";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("context parallel is not implemented"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom
