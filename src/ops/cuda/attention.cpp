#include "ops/cuda/attention.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>

#include "core/env.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cudnn_check.h"
#include "ops/cuda/device_arena.h"

namespace loom {
namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  // THD: per-sequence lengths and ragged offsets, one graph tensor per use (several read
  // the same device array).
  kSeqLenQ,
  kSeqLenKV,
  kOffsetQ,
  kOffsetK,
  kOffsetV,
  kOffsetO,
  kOffsetStats,
  kOffsetDO,
  kOffsetDQ,
  kOffsetDK,
  kOffsetDV
};

std::string describe(const AttentionShape& s) {
  return (s.ragged ? "THD: up to " + std::to_string(s.rows) + " sequences of up to " +
                         std::to_string(s.row_tokens) + " tokens in " + std::to_string(s.tokens) + ", "
                   : "rows " + std::to_string(s.rows) + " × " + std::to_string(s.row_tokens) + " tokens, ") +
         std::to_string(s.q_heads) + " q / " + std::to_string(s.kv_heads) + " kv heads of " +
         std::to_string(s.head_dim);
}

// The variant pack's THD entries.
void add_ragged(std::unordered_map<int64_t, void*>& pointers, const RaggedSpans& r, bool backward) {
  auto p = [](const int32_t* x) { return static_cast<void*>(const_cast<int32_t*>(x)); };
  pointers[kSeqLenQ] = p(r.seq_len);
  pointers[kSeqLenKV] = p(r.seq_len);
  pointers[kOffsetQ] = p(r.qkv_offset);
  pointers[kOffsetK] = p(r.qkv_offset);
  pointers[kOffsetV] = p(r.qkv_offset);
  pointers[kOffsetO] = p(r.out_offset);
  pointers[kOffsetStats] = p(r.lse_offset);
  if (!backward) return;
  pointers[kOffsetDO] = p(r.out_offset);
  pointers[kOffsetDQ] = p(r.qkv_offset);
  pointers[kOffsetDK] = p(r.qkv_offset);
  pointers[kOffsetDV] = p(r.qkv_offset);
}

}  // namespace

struct AttentionRunner::Graphs {
  fe::graph::Graph forward, backward;
  int64_t forward_workspace = 0, backward_workspace = 0;
  int64_t backward_rows = 0;  // rows a backward call takes
  bool forward_tuned = false, backward_tuned = false;
};

AttentionRunner::AttentionRunner(cudaStream_t stream)
    : stream_(stream),
      deterministic_(!env_flag("LOOM_SDPA_NONDETERMINISTIC")),
      autotune_(env_flag("LOOM_SDPA_AUTOTUNE")),
      report_workspace_(env_flag("LOOM_OP_PROFILE")) {
  cudnnHandle_t handle = nullptr;
  cudnn_check(cudnnCreate(&handle), "cudnnCreate");
  cudnn_check(cudnnSetStream(handle, stream), "cudnnSetStream");
  handle_ = handle;
}

AttentionRunner::~AttentionRunner() {
  cache_.clear();
  cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

AttentionRunner::Graphs& AttentionRunner::graphs(const AttentionShape& s) {
  auto found = cache_.find(s);
  if (found != cache_.end()) return *found->second;
  auto g = std::make_unique<Graphs>();
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  const int64_t b = s.rows, n = s.row_tokens, d = s.head_dim, hq = s.q_heads, hk = s.kv_heads;
  const int64_t nh = hq + 2 * hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // [rows, heads, row_tokens, hd] views of the token-major activations.
  const std::vector<int64_t> qkv_stride{n * nh * d, d, nh * d, 1};
  const std::vector<int64_t> out_stride{n * hq * d, d, hq * d, 1};
  const std::vector<int64_t> q_dim{b, hq, n, d}, kv_dim{b, hk, n, d};
  // The backward's graph takes the rows of one call (THD: all of them).
  const int64_t bb = backward_by_row_ && !s.ragged ? 1 : b;
  g->backward_rows = bb;
  const std::vector<int64_t> q_row_dim{bb, hq, n, d}, kv_row_dim{bb, hk, n, d};
  // lse: packed [rows, nq, row_tokens] (ops.h), what cuDNN before 9.26 requires of Stats.
  // THD: token-major within each sequence (the ragged offsets move each one's base).
  const std::vector<int64_t> stats_dim{b, hq, n, 1}, stats_row_dim{bb, hq, n, 1},
      stats_stride =
          s.ragged ? std::vector<int64_t>{hq * n, 1, hq, 1} : std::vector<int64_t>{hq * n, n, 1, 1};
  // THD's int32 index tensors: [b + 1] ragged offsets, [b] sequence lengths.
  auto index = [&](fe::graph::Graph& graph, const char* name, int64_t uid, int64_t count) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({count, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
  };
  auto ragged = [&](fe::graph::Graph& graph, std::shared_ptr<fe::graph::Tensor_attributes> tensor,
                    const char* name, int64_t uid) {
    if (s.ragged) tensor->set_ragged_offset(index(graph, name, uid, b + 1));
  };
  auto padding = [&](fe::graph::Graph& graph, auto& options) {
    if (!s.ragged) return;
    options.set_padding_mask(true)
        .set_seq_len_q(index(graph, "seq_len_q", kSeqLenQ, b))
        .set_seq_len_kv(index(graph, "seq_len_kv", kSeqLenKV, b))
        .set_max_total_seq_len_q(s.tokens)
        .set_max_total_seq_len_kv(s.tokens);
  };

  auto prepare = [&](fe::graph::Graph& graph) {
    graph.set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
  };
  auto input = [](fe::graph::Graph& graph, const char* name, int64_t uid, const std::vector<int64_t>& dim,
                  const std::vector<int64_t>& stride) {
    return graph.tensor(
        fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
  };
  auto finish = [&](fe::graph::Graph& graph, int64_t* workspace, const char* which) {
    fe_check(graph.validate(), std::string(which) + " graph for " + describe(s));
    fe_check(graph.build_operation_graph(handle), std::string(which) + " operation graph");
    fe_check(graph.create_execution_plans({fe::HeurMode_t::A}), std::string(which) + " execution plans");
    fe_check(graph.check_support(handle), std::string(which) + " not supported for " + describe(s));
    if (autotune_) {
      fe_check(graph.build_plans(handle, fe::BuildPlanPolicy_t::ALL), std::string(which) + " plans");
      *workspace = graph.get_autotune_workspace_size();
      std::fprintf(stderr, "loom: %s for %s: %lld plans to autotune\n", which, describe(s).c_str(),
                   static_cast<long long>(graph.get_execution_plan_count()));
    } else {
      fe_check(graph.build_plans(handle), std::string(which) + " plans");
      fe_check(graph.get_workspace_size(*workspace), std::string(which) + " workspace size");
    }
    if (report_workspace_)
      std::fprintf(stderr, "loom: %s for %s: cuDNN workspace %.3f GiB a call\n", which, describe(s).c_str(),
                   static_cast<double>(*workspace) / (1024.0 * 1024.0 * 1024.0));
  };

  {
    fe::graph::Graph& graph = g->forward;
    prepare(graph);
    auto q = input(graph, "q", kQ, q_dim, qkv_stride);
    auto k = input(graph, "k", kK, kv_dim, qkv_stride);
    auto v = input(graph, "v", kV, kv_dim, qkv_stride);
    ragged(graph, q, "offset_q", kOffsetQ);
    ragged(graph, k, "offset_k", kOffsetK);
    ragged(graph, v, "offset_v", kOffsetV);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("sdpa_forward")
                       .set_generate_stats(true)
                       .set_attn_scale(scale)
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0);
    padding(graph, options);
    auto [o, stats] = graph.sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim(q_dim).set_stride(out_stride);
    ragged(graph, o, "offset_o", kOffsetO);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
    ragged(graph, stats, "offset_stats", kOffsetStats);
    finish(graph, &g->forward_workspace, "SDPA forward");
  }
  {
    fe::graph::Graph& graph = g->backward;
    prepare(graph);
    auto q = input(graph, "q", kQ, q_row_dim, qkv_stride);
    auto k = input(graph, "k", kK, kv_row_dim, qkv_stride);
    auto v = input(graph, "v", kV, kv_row_dim, qkv_stride);
    auto o = input(graph, "o", kO, q_row_dim, out_stride);
    auto d_o = input(graph, "dO", kDO, q_row_dim, out_stride);
    auto stats = input(graph, "stats", kStats, stats_row_dim, stats_stride);
    stats->set_data_type(fe::DataType_t::FLOAT);
    ragged(graph, q, "offset_q", kOffsetQ);
    ragged(graph, k, "offset_k", kOffsetK);
    ragged(graph, v, "offset_v", kOffsetV);
    ragged(graph, o, "offset_o", kOffsetO);
    ragged(graph, d_o, "offset_do", kOffsetDO);
    ragged(graph, stats, "offset_stats", kOffsetStats);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("sdpa_backward")
                       .set_attn_scale(scale)
                       .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                       .set_diagonal_band_right_bound(0)
                       .set_deterministic_algorithm(deterministic_);
    padding(graph, options);
    auto [dq, dk, dv] = graph.sdpa_backward(q, k, v, o, d_o, stats, options);
    dq->set_output(true).set_uid(kDQ).set_dim(q_row_dim).set_stride(qkv_stride);
    dk->set_output(true).set_uid(kDK).set_dim(kv_row_dim).set_stride(qkv_stride);
    dv->set_output(true).set_uid(kDV).set_dim(kv_row_dim).set_stride(qkv_stride);
    ragged(graph, dq, "offset_dq", kOffsetDQ);
    ragged(graph, dk, "offset_dk", kOffsetDK);
    ragged(graph, dv, "offset_dv", kOffsetDV);
    finish(graph, &g->backward_workspace,
           backward_by_row_ ? "SDPA backward (one row a call)" : "SDPA backward");
  }
  return *cache_.emplace(s, std::move(g)).first->second;
}

void AttentionRunner::forward(void* out, float* lse, const void* qkv, const AttentionShape& s,
                              DeviceArena& scratch, const RaggedSpans* ragged) {
  LOOM_ASSERT(s.ragged == (ragged != nullptr), "a THD shape needs its ragged spans, and only it");
  Graphs& g = graphs(s);
  const size_t elem = 2;  // bf16
  auto* base = static_cast<uint8_t*>(const_cast<void*>(qkv));
  std::unordered_map<int64_t, void*> pointers{
      {kQ, base},
      {kK, base + static_cast<size_t>(s.q_heads * s.head_dim) * elem},
      {kV, base + static_cast<size_t>((s.q_heads + s.kv_heads) * s.head_dim) * elem},
      {kO, out},
      {kStats, lse}};
  if (ragged) add_ragged(pointers, *ragged, /*backward=*/false);
  void* workspace = g.forward_workspace > 0
                        ? scratch.allocate_bytes(g.forward_workspace, "SDPA forward workspace")
                        : nullptr;
  if (autotune_ && !g.forward_tuned) {
    fe_check(g.forward.autotune(static_cast<cudnnHandle_t>(handle_), pointers, workspace),
             "SDPA forward autotune");
    g.forward_tuned = true;
  }
  fe_check(g.forward.execute(static_cast<cudnnHandle_t>(handle_), pointers, workspace),
           "SDPA forward execute");
}

void AttentionRunner::backward(void* d_qkv, const void* d_out, const void* out, const float* lse,
                               const void* qkv, const AttentionShape& s, DeviceArena& scratch,
                               const RaggedSpans* ragged) {
  LOOM_ASSERT(s.ragged == (ragged != nullptr), "a THD shape needs its ragged spans, and only it");
  Graphs& g = graphs(s);
  const size_t elem = 2;
  const size_t k_offset = static_cast<size_t>(s.q_heads * s.head_dim) * elem;
  const size_t v_offset = static_cast<size_t>((s.q_heads + s.kv_heads) * s.head_dim) * elem;
  // A row's bytes in the token-major qkv (and d_qkv) and out (and d_out), its floats in lse.
  const size_t qkv_row = static_cast<size_t>(s.row_tokens * (s.q_heads + 2 * s.kv_heads) * s.head_dim) * elem;
  const size_t out_row = static_cast<size_t>(s.row_tokens * s.q_heads * s.head_dim) * elem;
  const size_t lse_row = static_cast<size_t>(s.q_heads * s.row_tokens);
  void* workspace = g.backward_workspace > 0
                        ? scratch.allocate_bytes(g.backward_workspace, "SDPA backward workspace")
                        : nullptr;
  for (int64_t r = 0; r < s.rows; r += g.backward_rows) {
    const size_t row = static_cast<size_t>(r);
    auto* base = static_cast<uint8_t*>(const_cast<void*>(qkv)) + row * qkv_row;
    auto* d_base = static_cast<uint8_t*>(d_qkv) + row * qkv_row;
    std::unordered_map<int64_t, void*> pointers{
        {kQ, base},
        {kK, base + k_offset},
        {kV, base + v_offset},
        {kO, static_cast<uint8_t*>(const_cast<void*>(out)) + row * out_row},
        {kDO, static_cast<uint8_t*>(const_cast<void*>(d_out)) + row * out_row},
        {kStats, const_cast<float*>(lse) + row * lse_row},
        {kDQ, d_base},
        {kDK, d_base + k_offset},
        {kDV, d_base + v_offset}};
    if (ragged) add_ragged(pointers, *ragged, /*backward=*/true);  // one call: r = 0
    if (autotune_ && !g.backward_tuned) {
      fe_check(g.backward.autotune(static_cast<cudnnHandle_t>(handle_), pointers, workspace),
               "SDPA backward autotune");
      g.backward_tuned = true;
    }
    fe_check(g.backward.execute(static_cast<cudnnHandle_t>(handle_), pointers, workspace),
             "SDPA backward execute");
  }
}

}  // namespace loom
