// Causal GQA attention through cuDNN's fused SDPA (cudnn-frontend graphs), forward and
// backward, reading q, k and v straight out of the fused qkv activation through strides.
//
// The rows of a micro-batch are the batch dimension: fixed-row packing makes every row
// row_tokens long, so a micro-batch of R rows is [R, heads, row_tokens, head_dim] and the
// causal mask within each sequence is the mask within each row. Graphs are built once per
// shape and cached. The backward runs cuDNN's deterministic algorithm: the same bits on
// every run, which exact resume needs. That algorithm's workspace is ~33 fp32 dQ-sized
// buffers of what one call is given: set_backward_by_row(true) runs it one row a call, for
// a fraction of it at a few percent more attention-backward time (docs/performance.md),
// what fits a model that the batched call would not (loom plan chooses). LOOM_OP_PROFILE=1
// prints each graph's workspace.
//
// Two measurement switches, read once (README): LOOM_SDPA_NONDETERMINISTIC=1 runs cuDNN's
// faster non-deterministic backward (what determinism costs), LOOM_SDPA_AUTOTUNE=1 times
// every plan cuDNN offers on the first call and keeps the fastest (what the heuristic's
// first choice leaves on the table). Neither is bitwise reproducible across runs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

namespace loom {

class DeviceArena;

struct AttentionShape {
  int64_t rows = 0, row_tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  auto key() const { return std::tie(rows, row_tokens, q_heads, kv_heads, head_dim); }
  bool operator<(const AttentionShape& other) const { return key() < other.key(); }
};

class AttentionRunner {
 public:
  explicit AttentionRunner(cudaStream_t stream);
  ~AttentionRunner();
  AttentionRunner(const AttentionRunner&) = delete;
  AttentionRunner& operator=(const AttentionRunner&) = delete;

  // Builds and caches the shape's graphs (a one-time cost of seconds); forward and backward
  // call it too.
  void prepare(const AttentionShape& shape) { graphs(shape); }
  // Graphs already built keep their rows a call: set before the first call.
  void set_backward_by_row(bool by_row) { backward_by_row_ = by_row; }
  // qkv bf16 [T, nq + 2 nkv, hd], out bf16 [T, nq, hd], lse f32 packed [rows, nq, row_tokens]
  // (natural log of the sum of exp of the scaled scores; ops.h), T = rows · row_tokens. Workspace comes from
  // `scratch`.
  void forward(void* out, float* lse, const void* qkv, const AttentionShape& shape, DeviceArena& scratch);
  // d_qkv bf16 [T, nq + 2 nkv, hd], all of it written.
  void backward(void* d_qkv, const void* d_out, const void* out, const float* lse, const void* qkv,
                const AttentionShape& shape, DeviceArena& scratch);

 private:
  struct Graphs;
  Graphs& graphs(const AttentionShape& shape);

  cudaStream_t stream_;
  bool deterministic_;
  bool autotune_;
  bool report_workspace_;
  bool backward_by_row_ = false;
  void* handle_ = nullptr;  // cudnnHandle_t, kept opaque so this header needs no cuDNN
  std::map<AttentionShape, std::unique_ptr<Graphs>> cache_;
};

}  // namespace loom
