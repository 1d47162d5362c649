#include "ops/cuda/context_attention.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/env.h"
#include "core/error.h"
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
  kSeqLenQ,
  kSeqLenKV,
  // One graph tensor per use of a ragged offset (several read the same device array).
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

std::string describe(const ContextAttentionShape& s) {
  return "context attention: up to " + std::to_string(s.pieces) + " pieces of up to " +
         std::to_string(s.q_tokens) + " queries and " + std::to_string(s.kv_tokens) + " keys, " +
         std::to_string(s.q_total) + " queries against " + std::to_string(s.kv_total) + " key tokens, " +
         std::to_string(s.q_heads) + " q / " + std::to_string(s.kv_heads) + " kv heads of " +
         std::to_string(s.head_dim);
}

void* device_pointer(const void* p) {
  return const_cast<void*>(p);
}

// The variant pack's lengths and ragged offsets.
void add_pieces(std::unordered_map<int64_t, void*>& pointers, const ContextPieces& p, bool backward) {
  pointers[kSeqLenQ] = device_pointer(p.q_len);
  pointers[kSeqLenKV] = device_pointer(p.kv_len);
  pointers[kOffsetQ] = device_pointer(p.q_offset);
  // The forward reads K and V in whole (overlapping ranges), the backward its pieces' copies.
  pointers[kOffsetK] = device_pointer(backward ? p.dkv_offset : p.kv_offset);
  pointers[kOffsetV] = device_pointer(backward ? p.dkv_offset : p.kv_offset);
  pointers[kOffsetO] = device_pointer(p.out_offset);
  pointers[kOffsetStats] = device_pointer(p.lse_offset);
  if (!backward) return;
  pointers[kOffsetDO] = device_pointer(p.out_offset);
  pointers[kOffsetDQ] = device_pointer(p.q_offset);
  pointers[kOffsetDK] = device_pointer(p.dkv_offset);
  pointers[kOffsetDV] = device_pointer(p.dkv_offset);
}

}  // namespace

struct ContextAttentionRunner::Graphs {
  fe::graph::Graph forward, backward;
  int64_t forward_workspace = 0, backward_workspace = 0;
};

ContextAttentionRunner::ContextAttentionRunner(cudaStream_t stream)
    : deterministic_(!env_flag("LOOM_SDPA_NONDETERMINISTIC")),
      report_workspace_(env_flag("LOOM_OP_PROFILE")) {
  cudnnHandle_t handle = nullptr;
  cudnn_check(cudnnCreate(&handle), "cudnnCreate");
  cudnn_check(cudnnSetStream(handle, stream), "cudnnSetStream");
  handle_ = handle;
}

ContextAttentionRunner::~ContextAttentionRunner() {
  cache_.clear();
  cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

ContextAttentionRunner::Graphs& ContextAttentionRunner::graphs(const ContextAttentionShape& s) {
  auto found = cache_.find(s);
  if (found != cache_.end()) return *found->second;
  auto g = std::make_unique<Graphs>();
  cudnnHandle_t handle = static_cast<cudnnHandle_t>(handle_);
  const int64_t b = s.pieces, sq = s.q_tokens, skv = s.kv_tokens, d = s.head_dim, hq = s.q_heads,
                hk = s.kv_heads;
  const int64_t nh = hq + 2 * hk;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // [pieces, heads, tokens, hd] views of the token-major tensors; the ragged offsets stand in
  // for the batch stride.
  const std::vector<int64_t> q_dim{b, hq, sq, d}, kv_dim{b, hk, skv, d};
  const std::vector<int64_t> q_stride{sq * nh * d, d, nh * d, 1}, kv_stride{skv * nh * d, d, nh * d, 1};
  const std::vector<int64_t> out_stride{sq * hq * d, d, hq * d, 1};
  const std::vector<int64_t> dkv_stride{skv * 2 * hk * d, d, 2 * hk * d, 1};
  // lse token-major within each piece, so [T, nq] over this rank's queries (ops.h: the
  // backend's own layout; attention.h's THD calls write the same).
  const std::vector<int64_t> stats_dim{b, hq, sq, 1}, stats_stride{hq * sq, 1, hq, 1};

  auto index = [&](fe::graph::Graph& graph, const char* name, int64_t uid, int64_t count) {
    return graph.tensor(fe::graph::Tensor_attributes()
                            .set_name(name)
                            .set_uid(uid)
                            .set_dim({count, 1, 1, 1})
                            .set_stride({1, 1, 1, 1})
                            .set_data_type(fe::DataType_t::INT32));
  };
  auto ragged = [&](fe::graph::Graph& graph, const std::shared_ptr<fe::graph::Tensor_attributes>& tensor,
                    const char* name,
                    int64_t uid) { tensor->set_ragged_offset(index(graph, name, uid, b + 1)); };
  // Causal with the diagonal at the bottom right of each piece's own q × k lengths.
  auto mask = [&](fe::graph::Graph& graph, auto& options) {
    options.set_diagonal_alignment(fe::DiagonalAlignment_t::BOTTOM_RIGHT)
        .set_diagonal_band_right_bound(0)
        .set_padding_mask(true)
        .set_seq_len_q(index(graph, "seq_len_q", kSeqLenQ, b))
        .set_seq_len_kv(index(graph, "seq_len_kv", kSeqLenKV, b))
        .set_max_total_seq_len_q(s.q_total)
        .set_max_total_seq_len_kv(s.kv_total);
  };
  auto prepare = [](fe::graph::Graph& graph) {
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
    fe_check(graph.build_plans(handle), std::string(which) + " plans");
    fe_check(graph.get_workspace_size(*workspace), std::string(which) + " workspace size");
    if (report_workspace_)
      std::fprintf(stderr, "loom: %s for %s: cuDNN workspace %.3f GiB a call\n", which, describe(s).c_str(),
                   static_cast<double>(*workspace) / (1024.0 * 1024.0 * 1024.0));
  };

  {
    fe::graph::Graph& graph = g->forward;
    prepare(graph);
    auto q = input(graph, "q", kQ, q_dim, q_stride);
    auto k = input(graph, "k", kK, kv_dim, kv_stride);
    auto v = input(graph, "v", kV, kv_dim, kv_stride);
    ragged(graph, q, "offset_q", kOffsetQ);
    ragged(graph, k, "offset_k", kOffsetK);
    ragged(graph, v, "offset_v", kOffsetV);
    auto options = fe::graph::SDPA_attributes()
                       .set_name("context_sdpa_forward")
                       .set_generate_stats(true)
                       .set_attn_scale(scale);
    mask(graph, options);
    auto [o, stats] = graph.sdpa(q, k, v, options);
    o->set_output(true).set_uid(kO).set_dim(q_dim).set_stride(out_stride);
    ragged(graph, o, "offset_o", kOffsetO);
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
    ragged(graph, stats, "offset_stats", kOffsetStats);
    finish(graph, &g->forward_workspace, "context SDPA forward");
  }
  {
    fe::graph::Graph& graph = g->backward;
    prepare(graph);
    auto q = input(graph, "q", kQ, q_dim, q_stride);
    auto k = input(graph, "k", kK, kv_dim, dkv_stride);
    auto v = input(graph, "v", kV, kv_dim, dkv_stride);
    auto o = input(graph, "o", kO, q_dim, out_stride);
    auto d_o = input(graph, "dO", kDO, q_dim, out_stride);
    auto stats = input(graph, "stats", kStats, stats_dim, stats_stride);
    stats->set_data_type(fe::DataType_t::FLOAT);
    ragged(graph, q, "offset_q", kOffsetQ);
    ragged(graph, k, "offset_k", kOffsetK);
    ragged(graph, v, "offset_v", kOffsetV);
    ragged(graph, o, "offset_o", kOffsetO);
    ragged(graph, d_o, "offset_do", kOffsetDO);
    ragged(graph, stats, "offset_stats", kOffsetStats);
    auto options = fe::graph::SDPA_backward_attributes()
                       .set_name("context_sdpa_backward")
                       .set_attn_scale(scale)
                       .set_deterministic_algorithm(deterministic_);
    mask(graph, options);
    auto [dq, dk, dv] = graph.sdpa_backward(q, k, v, o, d_o, stats, options);
    dq->set_output(true).set_uid(kDQ).set_dim(q_dim).set_stride(q_stride);
    dk->set_output(true).set_uid(kDK).set_dim(kv_dim).set_stride(dkv_stride);
    dv->set_output(true).set_uid(kDV).set_dim(kv_dim).set_stride(dkv_stride);
    ragged(graph, dq, "offset_dq", kOffsetDQ);
    ragged(graph, dk, "offset_dk", kOffsetDK);
    ragged(graph, dv, "offset_dv", kOffsetDV);
    finish(graph, &g->backward_workspace, "context SDPA backward");
  }
  return *cache_.emplace(s, std::move(g)).first->second;
}

void ContextAttentionRunner::forward(void* out, float* lse, const void* qkv, const void* whole,
                                     const ContextAttentionShape& s, const ContextPieces& pieces,
                                     DeviceArena& scratch) {
  Graphs& g = graphs(s);
  const size_t elem = 2;  // bf16
  const size_t k_offset = static_cast<size_t>(s.q_heads * s.head_dim) * elem;
  const size_t v_offset = static_cast<size_t>((s.q_heads + s.kv_heads) * s.head_dim) * elem;
  auto* kv_base = static_cast<uint8_t*>(device_pointer(whole));
  std::unordered_map<int64_t, void*> pointers{{kQ, device_pointer(qkv)},
                                              {kK, kv_base + k_offset},
                                              {kV, kv_base + v_offset},
                                              {kO, out},
                                              {kStats, lse}};
  add_pieces(pointers, pieces, /*backward=*/false);
  void* workspace = g.forward_workspace > 0
                        ? scratch.allocate_bytes(g.forward_workspace, "context SDPA forward workspace")
                        : nullptr;
  fe_check(g.forward.execute(static_cast<cudnnHandle_t>(handle_), pointers, workspace),
           "context SDPA forward execute");
}

void ContextAttentionRunner::backward(void* d_qkv, void* d_kv_pieces, const void* d_out, const void* out,
                                      const float* lse, const void* qkv, const void* kv_pieces,
                                      const ContextAttentionShape& s, const ContextPieces& pieces,
                                      DeviceArena& scratch) {
  Graphs& g = graphs(s);
  const size_t elem = 2;
  const size_t v_offset = static_cast<size_t>(s.kv_heads * s.head_dim) * elem;  // in a piece's block
  auto* kv_base = static_cast<uint8_t*>(device_pointer(kv_pieces));
  std::unordered_map<int64_t, void*> pointers{{kQ, device_pointer(qkv)},
                                              {kK, kv_base},
                                              {kV, kv_base + v_offset},
                                              {kO, device_pointer(out)},
                                              {kDO, device_pointer(d_out)},
                                              {kStats, device_pointer(lse)},
                                              {kDQ, d_qkv},
                                              {kDK, d_kv_pieces},
                                              {kDV, static_cast<uint8_t*>(d_kv_pieces) + v_offset}};
  add_pieces(pointers, pieces, /*backward=*/true);
  void* workspace = g.backward_workspace > 0
                        ? scratch.allocate_bytes(g.backward_workspace, "context SDPA backward workspace")
                        : nullptr;
  fe_check(g.backward.execute(static_cast<cudnnHandle_t>(handle_), pointers, workspace),
           "context SDPA backward execute");
}

}  // namespace loom
