// What the parallel engine tests share (test_parallel_train on CPU ranks,
// test_parallel_cuda_train on GPU ranks): the tiny models, a step as the trainer runs it,
// the layouts, a run of a layout on threads as ranks (its state read streamed, as the
// trainer writes checkpoints and final/), the state written streamed and gathered, and the
// error measures.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "io/hf_checkpoint.h"
#include "io/init.h"
#include "model/param_table.h"
#include "optim/grad_clip.h"
#include "parallel/in_process_comm.h"
#include "train/engine.h"
#include "train/engine_inspect.h"
#include "train/nonfinite.h"
#include "train/rank_shard.h"
#include "train/rows.h"
#include "train/train_step.h"

namespace loom {

constexpr int64_t kSteps = 3, kGlobalBatch = 4;
constexpr float kLr = 1e-2f;
constexpr CommTimeout kTimeout{std::chrono::seconds(60)};
const AdamWConfig kAdam{0.9f, 0.98f, 1e-8f, 0.1f};

struct Trace {
  std::vector<double> loss, norm;
  std::vector<float> grads;  // step 1's, scaled by 1/Σn, before clipping
  std::vector<float> masters;
  TrainState state;
};

struct Model {
  ModelConfig config;
  ParamTable table;
  std::vector<float> params;
  RowSet rows;
};

// The golden tiny models: untied with 4 q / 2 kv heads (KV heads split under TP2, shared by
// two ranks under TP4), tied with 4 q / 1 kv head (replicated under TP2 and TP4), Llama's
// block (no q/k norm, llama3 RoPE) and Qwen2's (q/k/v biases, tied), both 4 q / 2 kv heads;
// four layers so that PP2 splits them.
inline Model tiny(const std::string& name) {
  Model m;
  m.config = hf_checkpoint_read_config("golden/" + name + "/model");
  m.config.num_hidden_layers = 4;
  m.table = param_table_build(m.config);
  m.params.resize(static_cast<size_t>(m.table.total_numel));
  init_random_params(m.config, m.table, 11, m.params.data());
  // Biases start at 0, as HF's: values of their own show where a rank's rows of them land.
  for (const ParamSpec& p : m.table.params)
    if (p.kind == ParamKind::qkv_bias)
      for (int64_t i = 0; i < p.numel(); ++i)
        m.params[static_cast<size_t>(p.offset + i)] = 0.1f * std::sin(static_cast<float>(p.offset + i));
  std::ifstream recipe("golden/" + name + "/recipe.json");
  const int64_t row_tokens = nlohmann::json::parse(recipe).at("row_tokens").get<int64_t>();
  m.rows = rows_load_jsonl("golden/" + name + "/rows.jsonl", row_tokens, m.config.vocab_size);
  return m;
}

// The sample-isolated rows (tests/golden/isolated: several samples a row, position_ids) a tiny
// model trains on: its own fixture, or one of its row length and vocabulary (tiny_qwen2:
// tiny_tied's). False where there is none (tiny_llama's vocabulary, 112, has none yet).
inline bool load_isolated_rows(Model& m, const std::string& name) {
  const std::string fixture = name == "tiny_qwen2" ? "tiny_tied" : name;
  if (!std::filesystem::exists("golden/isolated/" + fixture)) return false;
  m.rows =
      rows_load_jsonl("golden/isolated/" + fixture + "/rows.jsonl", m.rows.row_tokens, m.config.vocab_size);
  return true;
}

// The granule step_spec() builds its micro-batches' loss rows with (decoder.h MicroBatch); 0 keeps
// micro_batch_build's, which makes none of rows this short. Set it with LossRowsGranule.
inline int64_t& loss_rows_granule() {
  static int64_t granule = 0;
  return granule;
}
struct LossRowsGranule {
  explicit LossRowsGranule(int64_t granule) { loss_rows_granule() = granule; }
  ~LossRowsGranule() { loss_rows_granule() = 0; }
};

// The load-balancing loss step_spec() and the engines train a mixture of experts with (none
// unless set with MoeAuxLossSetting).
inline MoeAuxLoss& moe_aux_loss() {
  static MoeAuxLoss aux;
  return aux;
}
struct MoeAuxLossSetting {
  explicit MoeAuxLossSetting(MoeAuxLoss aux) { moe_aux_loss() = aux; }
  ~MoeAuxLossSetting() { moe_aux_loss() = {}; }
};

// The engine of one rank of `m` on `device` (host null: a world of one).
inline std::unique_ptr<TrainEngine> make_engine(const Model& m, EngineDevice device,
                                                const EngineOptions& options = {}, Groups* host = nullptr,
                                                Groups* data = nullptr) {
  OwnedParamSource source(m.params);
  EngineOptions with_aux = options;
  with_aux.moe_aux_loss = moe_aux_loss();
  return engine_create(m.config, m.table, source, device, with_aux, host, data);
}

// The step settings of these tests: one row per micro-batch (so that PP2 has several in
// flight), clip at 1.
inline StepSpec step_spec(const Model& m, int dp, int dp_rank, int cp = 1, int cp_rank = 0) {
  StepSpec spec;
  spec.global_batch = kGlobalBatch;
  spec.max_tokens_per_gpu = m.rows.row_tokens / cp;
  spec.cp = cp;
  spec.cp_rank = cp_rank;
  spec.dp = dp;
  spec.dp_rank = dp_rank;
  spec.adam = kAdam;
  spec.clip_grad = 1.0;
  spec.loss_rows_granule = loss_rows_granule();
  spec.routing_census = m.config.num_experts > 0;
  spec.aux_loss = moe_aux_loss();
  return spec;
}

// Step `step` on `engine` as the trainer runs it (train_step); returns (loss, grad norm) and,
// when asked, the grads scaled by 1/Σn before the clip.
inline std::pair<double, double> step(TrainEngine& e, const Model& m, int64_t step, int dp, int dp_rank,
                                      std::vector<float>* grads = nullptr, int cp = 1, int cp_rank = 0) {
  const StepResult r =
      train_step(e, m.rows, step, kLr, step_spec(m, dp, dp_rank, cp, cp_rank), nullptr, m.table, [&] {
        if (grads) *grads = engine_grads(e);
      });
  return {r.loss, r.grad_norm};
}

struct Layout {
  std::string name;
  ParallelLayout layout;
  bool sequence_parallel = false;
  std::vector<int64_t> layer_split;
  ContextComm context_comm = ContextComm::all_gather;  // layout.cp_comm
};

// One rank's shard of a model for a forward and backward of DecoderModel itself (no engine):
// its weights cut from the full ones, and zeroed grads.
struct RankWeights {
  RankShard shard;
  std::vector<float> params, grads;
  ModelTensors tensors() {
    return {param_views(shard.table, params.data()), param_views(shard.table, grads.data())};
  }
};
inline RankWeights rank_weights(const Model& m, const Layout& l, const RankCoords& at) {
  EngineOptions options;
  options.sequence_parallel = l.sequence_parallel;
  options.layer_split = l.layer_split;
  options.context_comm = l.context_comm;
  RankWeights w{rank_shard(m.config, m.table, l.layout, at, options), {}, {}};
  w.params.resize(static_cast<size_t>(w.shard.table.total_numel));
  w.grads.assign(w.params.size(), 0.0f);
  full_to_local(w.shard, m.table, m.params.data(), w.params.data());
  return w;
}

// The layouts each parallel engine is checked on, against one rank.
inline std::vector<Layout> layouts() {
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

// The expert-parallel layouts of a mixture of experts (tiny_qwen3_moe: 8 experts), against
// one rank: EP alone, with TP + SP for the attention, with PP across layers, and with EDP
// groups of two ranks (dp4_ep2) and of one (ep = dp: the experts' slice is their grads).
inline std::vector<Layout> ep_layouts() {
  return {{"ep2", {1, 1, 2, 1, 2}, false, {}},
          {"tp2_sp_ep2", {2, 1, 2, 1, 2}, true, {}},
          {"pp2_ep2", {1, 1, 2, 2, 2}, false, {}},
          {"dp4_ep2", {1, 1, 4, 1, 2}, false, {}},
          {"dp4_ep4", {1, 1, 4, 1, 4}, false, {}}};
}

// Host point-to-point traffic a rank received while `on`: f32 elements by sending world rank,
// messages, and the largest message.
struct Received {
  bool on = false;
  std::map<int, int64_t> from;
  int64_t messages = 0;
  int64_t largest = 0;
};

// A Comm that forwards to another and counts what this rank receives point to point into
// `received`; the groups split from it count into the same one.
class CountingComm final : public Comm {
 public:
  CountingComm(Comm& inner, Received& received, std::unique_ptr<Comm> owned = nullptr)
      : Comm(inner.name(), inner.rank(), inner.world_ranks()),
        inner_(inner),
        received_(received),
        owned_(std::move(owned)) {}
  void all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) override {
    inner_.all_reduce_sum(data, count, dtype, timeout);
  }
  void reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                          CommTimeout timeout) override {
    inner_.reduce_scatter_sum(send, recv, recv_count, dtype, timeout);
  }
  void all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                  CommTimeout timeout) override {
    inner_.all_gather(send, recv, send_count, dtype, timeout);
  }
  void broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) override {
    inner_.broadcast(data, count, dtype, root, timeout);
  }
  void barrier(CommTimeout timeout) override { inner_.barrier(timeout); }
  void exchange(std::span<const P2POp> ops, CommTimeout timeout) override {
    inner_.exchange(ops, timeout);
    if (!received_.on) return;
    for (const P2POp& op : ops) {
      if (op.kind != P2POp::Kind::recv || op.dtype != DType::f32) continue;
      received_.from[world_rank_of(op.peer)] += static_cast<int64_t>(op.count);
      ++received_.messages;
      received_.largest = std::max(received_.largest, static_cast<int64_t>(op.count));
    }
  }
  std::unique_ptr<Comm> split(const std::vector<int>& members, const std::string& name,
                              CommTimeout timeout) override {
    std::unique_ptr<Comm> group = inner_.split(members, name, timeout);
    if (!group) return nullptr;
    Comm& inner = *group;
    return std::make_unique<CountingComm>(inner, received_, std::move(group));
  }

 private:
  Comm& inner_;
  Received& received_;
  std::unique_ptr<Comm> owned_;
};

// Reads in pieces of 777 elements, which cut tensors and their rows anywhere: any range
// works, not only the io/ writers' tensor pieces.
constexpr int64_t kOddPiece = 777;

inline std::vector<float> read_in_pieces(int64_t numel,
                                         const std::function<void(int64_t, int64_t, float*)>& read) {
  std::vector<float> all(static_cast<size_t>(numel));
  for (int64_t at = 0; at < numel; at += kOddPiece)
    read(at, std::min(kOddPiece, numel - at), all.data() + at);
  return all;
}

// The engine's state and masters as world rank 0 reads them streamed (state_source,
// master_source; every other rank serving), in odd pieces; empty elsewhere.
inline void read_streamed(TrainEngine& e, int world_rank, TrainState& state, std::vector<float>& masters) {
  if (world_rank != 0) {
    e.state_serve();
    e.state_serve();
    return;
  }
  {
    std::unique_ptr<StateSource> source = e.state_source();
    const int64_t n = source->numel();
    for (auto [group, values] :
         {std::pair{StateGroup::master, &state.master}, std::pair{StateGroup::adam_m, &state.adam_m},
          std::pair{StateGroup::adam_v, &state.adam_v}})
      *values =
          read_in_pieces(n, [&, group](int64_t b, int64_t c, float* d) { source->read(group, b, c, d); });
    masters.clear();
  }
  std::unique_ptr<ParamSource> source = e.master_source();
  masters = read_in_pieces(static_cast<int64_t>(state.master.size()),
                           [&](int64_t b, int64_t c, float* d) { source->read(b, c, d); });
}

// Steps 1..kSteps on one engine (one rank).
inline Trace train_single(const Model& m, TrainEngine& e) {
  Trace t;
  for (int64_t s = 1; s <= kSteps; ++s) {
    auto [loss, norm] = step(e, m, s, 1, 0, s == 1 ? &t.grads : nullptr);
    t.loss.push_back(loss);
    t.norm.push_back(norm);
  }
  t.masters = engine_masters(e);
  e.state_to_host(t.state);
  return t;
}

// One rank's engine and what it needs kept alive beside it (the device groups of GPU ranks).
struct RankEngine {
  std::shared_ptr<void> keep;
  std::unique_ptr<TrainEngine> engine;  // destroyed before `keep`
};
// Makes one rank's engine of a layout over its groups.
using EngineFactory = std::function<RankEngine(const EngineOptions& options, Groups& groups)>;

// Runs steps [first, last] on every rank of `l`, from `resume` when given; rank 0's trace,
// its state and masters read streamed.
inline Trace train_layout(const Model& m, const Layout& l, const EngineFactory& make,
                          const RecomputePolicy& recompute = {}, const TrainState* resume = nullptr,
                          int64_t first = 1, int64_t last = kSteps) {
  EngineOptions options;
  options.recompute = recompute;
  options.sequence_parallel = l.sequence_parallel;
  options.layer_split = l.layer_split;
  options.context_comm = l.context_comm;
  options.comm_timeout = kTimeout;
  Trace out;
  std::mutex mutex;
  run_in_process(l.layout.world_size(), [&](Comm& world) {
    Groups g = groups_create(world, l.layout, kTimeout);
    RankEngine rank = make(options, g);
    TrainEngine* e = rank.engine.get();
    if (resume) e->state_from_host(*resume);
    Trace t;
    for (int64_t s = first; s <= last; ++s) {
      auto [loss, norm] =
          step(*e, m, s, l.layout.dp, g.coords.dp, s == 1 ? &t.grads : nullptr, l.layout.cp, g.coords.cp);
      t.loss.push_back(loss);
      t.norm.push_back(norm);
    }
    read_streamed(*e, world.rank(), t.state, t.masters);
    if (world.rank() == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      out = std::move(t);
    }
  });
  return out;
}

// The non-finite grads of a failing step, counted by the engine where they live
// (nonfinite_grad_counts: each rank its slice, summed over the world) and, the reference, in
// the grads gathered on world rank 0 (engine_grads), as the failure path counted them before.
// Step 1's grads (scaled by 1/Σn) are scaled by 1/threshold and then by FLT_MAX: those above
// the threshold in magnitude overflow to ±inf, the others stay finite; a further scale by 0
// turns each ±inf into NaN (and the rest into 0), which must count the same.
struct NonfiniteCounts {
  std::vector<std::vector<int64_t>> inf_by_rank, nan_by_rank;  // per world rank, per tensor
  std::vector<int64_t> gathered;                               // per tensor, of engine_grads
};

// Each tensor's values that are NaN or ±inf in full grads laid out by the table: the plain
// scan, independent of the code under test.
inline std::vector<int64_t> nonfinite_reference(const ParamTable& table, const std::vector<float>& grads) {
  std::vector<int64_t> counts;
  for (const ParamSpec& p : table.params) {
    int64_t count = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i)
      count += std::isfinite(grads[static_cast<size_t>(i)]) ? 0 : 1;
    counts.push_back(count);
  }
  return counts;
}

// One rank's part of NonfiniteCounts (every rank calls it together).
inline void count_nonfinite_grads(TrainEngine& e, const Model& m, int dp, int dp_rank, int world_rank,
                                  float threshold, NonfiniteCounts& out, std::mutex& mutex) {
  std::vector<int64_t> inf, nan;
  std::vector<float> grads;
  // Counted where train_step reads the grad norm; the update after it is of no interest.
  train_step(e, m.rows, 1, kLr, step_spec(m, dp, dp_rank), nullptr, m.table, [&] {
    e.scale_grads(1.0f / threshold);
    e.scale_grads(std::numeric_limits<float>::max());
    inf = e.nonfinite_grad_counts();
    grads = engine_grads(e);
    e.scale_grads(0.0f);
    nan = e.nonfinite_grad_counts();
  });
  std::lock_guard<std::mutex> lock(mutex);
  out.inf_by_rank[static_cast<size_t>(world_rank)] = std::move(inf);
  out.nan_by_rank[static_cast<size_t>(world_rank)] = std::move(nan);
  if (world_rank == 0) out.gathered = nonfinite_reference(m.table, grads);
}

inline NonfiniteCounts nonfinite_counts_single(const Model& m, TrainEngine& e, float threshold) {
  NonfiniteCounts out;
  out.inf_by_rank.resize(1);
  out.nan_by_rank.resize(1);
  std::mutex mutex;
  count_nonfinite_grads(e, m, 1, 0, 0, threshold, out, mutex);
  return out;
}

inline NonfiniteCounts nonfinite_counts_layout(const Model& m, const Layout& l, const EngineFactory& make,
                                               float threshold) {
  EngineOptions options;
  options.sequence_parallel = l.sequence_parallel;
  options.layer_split = l.layer_split;
  options.context_comm = l.context_comm;
  options.comm_timeout = kTimeout;
  NonfiniteCounts out;
  out.inf_by_rank.resize(static_cast<size_t>(l.layout.world_size()));
  out.nan_by_rank.resize(out.inf_by_rank.size());
  std::mutex mutex;
  run_in_process(l.layout.world_size(), [&](Comm& world) {
    Groups g = groups_create(world, l.layout, kTimeout);
    RankEngine rank = make(options, g);
    count_nonfinite_grads(*rank.engine, m, l.layout.dp, g.coords.dp, world.rank(), threshold, out, mutex);
  });
  return out;
}

// A threshold between two tensors' largest |grad| in the middle of their order, at the widest
// gap there (full grads, e.g. one rank's step-1 grads): about half the tensors have a grad
// above it, the others none, and a layout's rounding (a relative 1e-6) cannot move a tensor
// across it.
inline float nonfinite_threshold(const ParamTable& table, const std::vector<float>& grads) {
  std::vector<float> largest;
  for (const ParamSpec& p : table.params) {
    float most = 0;
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i)
      most = std::max(most, std::abs(grads[static_cast<size_t>(i)]));
    largest.push_back(most);
  }
  std::sort(largest.begin(), largest.end());
  const size_t n = largest.size();
  size_t best = n / 2;
  for (size_t i = n / 4 + 1; i <= 3 * n / 4; ++i)
    if (largest[i] / largest[i - 1] > largest[best] / largest[best - 1]) best = i;
  return std::sqrt(largest[best - 1] * largest[best]);
}

// Every rank's counts, ±inf and NaN alike, are the gathered grads' counts; and the report
// the failure path writes from them is the one it wrote from the gathered grads.
inline void expect_counts_as_gathered(const NonfiniteCounts& c, const ParamTable& table) {
  ASSERT_EQ(c.gathered.size(), table.params.size());
  for (size_t r = 0; r < c.inf_by_rank.size(); ++r) {
    SCOPED_TRACE("world rank " + std::to_string(r));
    EXPECT_EQ(c.inf_by_rank[r], c.gathered) << "±inf counted on the ranks vs in the gathered grads";
    EXPECT_EQ(c.nan_by_rank[r], c.gathered) << "NaN counted on the ranks vs in the gathered grads";
  }
  std::vector<NonfiniteTensor> want;
  for (size_t i = 0; i < table.params.size(); ++i)
    if (c.gathered[i] > 0) want.push_back({table.params[i].name, c.gathered[i], table.params[i].numel()});
  EXPECT_EQ(nonfinite_report(1, 0, 1.0, NAN, nonfinite_tensors(table, c.inf_by_rank[0])),
            nonfinite_report(1, 0, 1.0, NAN, want));
}

inline std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// What world rank 0 writes after kSteps of `l`, both ways: the state file and final/'s
// weights streamed (checkpoint_state_write and hf_checkpoint_save from state_source and
// master_source, the other ranks serving; what the trainer does) and from the gathered
// copies (state_to_host, engine_masters: the full tensors on rank 0); and what rank 0
// received point to point while streaming.
struct WrittenBothWays {
  std::string state_streamed, state_gathered, final_streamed, final_gathered;
  Received received;
};

inline WrittenBothWays write_both_ways(const Model& m, const Layout& l, const EngineFactory& make,
                                       const std::filesystem::path& dir) {
  EngineOptions options;
  options.sequence_parallel = l.sequence_parallel;
  options.layer_split = l.layer_split;
  options.context_comm = l.context_comm;
  options.comm_timeout = kTimeout;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  WrittenBothWays out;
  run_in_process(l.layout.world_size(), [&](Comm& inner) {
    Received mine;
    CountingComm world(inner, inner.rank() == 0 ? out.received : mine);
    Groups g = groups_create(world, l.layout, kTimeout);
    RankEngine rank = make(options, g);
    TrainEngine& e = *rank.engine;
    for (int64_t s = 1; s <= kSteps; ++s)
      step(e, m, s, l.layout.dp, g.coords.dp, nullptr, l.layout.cp, g.coords.cp);
    if (world.rank() == 0) {
      out.received.on = true;
      checkpoint_state_write((dir / "streamed.safetensors").string(), m.table, *e.state_source());
      hf_checkpoint_save((dir / "final_streamed").string(), m.config, m.table, *e.master_source(),
                         e.export_dtype(), 0);
      out.received.on = false;
    } else {
      e.state_serve();
      e.state_serve();
    }
    TrainState gathered;
    e.state_to_host(gathered);
    const std::vector<float> masters = engine_masters(e);
    if (world.rank() == 0) {
      checkpoint_state_write((dir / "gathered.safetensors").string(), m.table, gathered);
      hf_checkpoint_save((dir / "final_gathered").string(), m.config, m.table, masters.data(),
                         e.export_dtype(), 0);
    }
  });
  out.state_streamed = file_bytes(dir / "streamed.safetensors");
  out.state_gathered = file_bytes(dir / "gathered.safetensors");
  out.final_streamed = file_bytes(dir / "final_streamed" / "model.safetensors");
  out.final_gathered = file_bytes(dir / "final_gathered" / "model.safetensors");
  std::filesystem::remove_all(dir);
  return out;
}

// The streamed state file and final/ are the gathered ones' bytes, and world rank 0 received
// at most a tensor's worth in one message (the gather received each rank's whole shard).
inline void expect_streamed_as_gathered(const WrittenBothWays& w, const Model& m) {
  int64_t largest_tensor = 0;
  for (const ParamSpec& p : m.table.params) largest_tensor = std::max(largest_tensor, p.numel());
  ASSERT_FALSE(w.state_gathered.empty());
  ASSERT_FALSE(w.final_gathered.empty());
  EXPECT_TRUE(w.state_streamed == w.state_gathered)
      << "the streamed state file differs from the gathered one";
  EXPECT_TRUE(w.final_streamed == w.final_gathered) << "final/ streamed differs from final/ gathered";
  EXPECT_GT(w.received.messages, 0);
  EXPECT_LE(w.received.largest, largest_tensor) << "world rank 0 received more than a tensor at once";
}

inline double rel(double a, double b) {
  return std::abs(a - b) / std::max(std::abs(b), 1e-30);
}

inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff / norm);
}

inline double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::abs(static_cast<double>(a[i]) - b[i]));
  return most;
}

inline double worst_rel(const std::vector<double>& a, const std::vector<double>& b) {
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, rel(a[i], b[i]));
  return most;
}

}  // namespace loom
