// Context parallelism's attention (ops.h attention_context_*) through cuDNN's fused SDPA:
// a CP rank's queries against the whole micro-batch's keys (docs/performance.md, "Context
// parallelism's attention on the GPU", says why cuDNN and not a kernel of loom's own).
//
// A rank's queries fall into pieces: runs of consecutive queries that share a span's first
// key and whose last keys follow one another (a chunk of a row, or its part of one sample
// under isolated packing). A piece of q queries and k keys (k ≥ q, the span's tokens from its
// first up to the piece's last query) is causal attention with the diagonal aligned to the
// bottom right: query i of the piece sees keys 0 .. k − q + i. Every piece is one sequence of a
// THD call: queries, outputs and lse at ragged offsets into this rank's tensors, keys and
// values at ragged offsets into `whole` (pieces of one span read overlapping keys), cuDNN's
// padding mask with each piece's own q and k lengths. The backward's dQ goes straight into
// d_qkv (each query is in one piece); dK and dV of overlapping pieces cannot share memory, so
// each piece writes its own [k, 2 nkv, hd] block of a packed buffer, and the caller sums the
// blocks covering each key in piece order (kernels.h context_kv_sum). The backward reads K
// and V from a copy in the same packed blocks (kernels.h context_kv_gather), so that no two
// sequences of its call share a key: an ordinary THD call with q and kv of different lengths,
// whatever cuDNN keeps per key in its workspace. The backward runs
// cuDNN's deterministic algorithm as attention.h's does; the same two measurement switches
// (LOOM_SDPA_NONDETERMINISTIC, LOOM_OP_PROFILE's workspace report) apply.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace loom {

class DeviceArena;

// A THD call's shape: `pieces` sequences (bucketed to a power of two) of at most `q_tokens`
// queries and `kv_tokens` keys (each bucketed), over `q_total` queries (this rank's T) and a
// key extent of `kv_total` tokens (at least whole's T_all and the pieces' keys packed end to
// end, bucketed: the packed dK/dV buffer has that many tokens).
struct ContextAttentionShape {
  int64_t pieces = 0, q_tokens = 0, kv_tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t q_total = 0, kv_total = 0;
  auto key() const {
    return std::tie(pieces, q_tokens, kv_tokens, q_heads, kv_heads, head_dim, q_total, kv_total);
  }
  bool operator<(const ContextAttentionShape& other) const { return key() < other.key(); }
};

// The device int32 arrays of a call, shape.pieces pieces (those past the real ones have
// length 0): each piece's query and key counts, and (pieces + 1 values) its first query's
// offset in elements of qkv (and d_qkv), of out (and d_out) and of lse ([T, nq], token-major:
// this backend's own layout), its first key's in elements of whole, and its block's in
// elements of the packed K/V and dK/dV buffers.
struct ContextPieces {
  const int32_t* q_len = nullptr;
  const int32_t* kv_len = nullptr;
  const int32_t* q_offset = nullptr;
  const int32_t* out_offset = nullptr;
  const int32_t* lse_offset = nullptr;
  const int32_t* kv_offset = nullptr;
  const int32_t* dkv_offset = nullptr;
};

class ContextAttentionRunner {
 public:
  explicit ContextAttentionRunner(cudaStream_t stream);
  ~ContextAttentionRunner();
  ContextAttentionRunner(const ContextAttentionRunner&) = delete;
  ContextAttentionRunner& operator=(const ContextAttentionRunner&) = delete;

  // Builds and caches the shape's graphs (a one-time cost of seconds).
  void prepare(const ContextAttentionShape& shape) { graphs(shape); }
  // qkv bf16 [T, nq + 2 nkv, hd] (its q heads read), whole bf16 [T_all, nq + 2 nkv, hd] (its k
  // and v heads read), out bf16 [T, nq, hd], lse f32 [T, nq]. Workspace from `scratch`.
  void forward(void* out, float* lse, const void* qkv, const void* whole, const ContextAttentionShape& shape,
               const ContextPieces& pieces, DeviceArena& scratch);
  // kv_pieces bf16 [kv_total, 2 nkv, hd]: each piece's keys' K in heads [0, nkv) and V in
  // [nkv, 2 nkv) of its block (at dkv_offset). d_qkv's q heads written (its k and v heads
  // untouched); d_kv_pieces as kv_pieces: each piece's dK and dV.
  void backward(void* d_qkv, void* d_kv_pieces, const void* d_out, const void* out, const float* lse,
                const void* qkv, const void* kv_pieces, const ContextAttentionShape& shape,
                const ContextPieces& pieces, DeviceArena& scratch);

 private:
  struct Graphs;
  Graphs& graphs(const ContextAttentionShape& shape);

  bool deterministic_;
  bool report_workspace_;
  void* handle_ = nullptr;  // cudnnHandle_t, kept opaque so this header needs no cuDNN
  std::map<ContextAttentionShape, std::unique_ptr<Graphs>> cache_;
};

}  // namespace loom
