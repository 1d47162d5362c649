// Causal GQA attention through cuDNN's fused SDPA (cudnn-frontend graphs), forward and
// backward, reading q, k and v straight out of the fused qkv activation through strides.
//
// The rows of a micro-batch are the batch dimension: fixed-row packing makes every row
// row_tokens long, so a micro-batch of R rows is [R, heads, row_tokens, head_dim] and the
// causal mask within each sequence is the mask within each row. Rows of unequal lengths
// (sample-isolated packing: every sample, and a row's padding, is a row of its own) run as
// THD: cuDNN's padding mask with per-sequence lengths and ragged offsets into the packed
// tokens, never padded to the longest. Their batch and length dimensions are bucketed
// (powers of two; the extra sequences have length 0) so that a run builds a few graphs. Graphs are built once
// per shape and cached. The backward runs cuDNN's deterministic algorithm: the same bits on every run, which
// exact resume needs. That algorithm's workspace is ~33 fp32 dQ-sized buffers of what one call is given:
// set_backward_by_row(true) runs it one row a call, for a fraction of it at a few percent more
// attention-backward time (docs/performance.md), what fits a model that the batched call would not (loom plan
// chooses). LOOM_OP_PROFILE=1 prints each graph's workspace.
//
// Two measurement switches, read once (docs/performance.md): LOOM_SDPA_NONDETERMINISTIC=1 runs cuDNN's
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
  // THD: `rows` sequences (bucketed) of at most `row_tokens` tokens (bucketed), packed end to
  // end in at most `tokens` tokens (cuDNN's max_total_seq_len); the call passes their lengths
  // and offsets (RaggedSpans).
  bool ragged = false;
  int64_t tokens = 0;
  auto key() const { return std::tie(rows, row_tokens, q_heads, kv_heads, head_dim, ragged, tokens); }
  bool operator<(const AttentionShape& other) const { return key() < other.key(); }
};

// The device int32 arrays of a THD call, shape.rows sequences: each one's length, and
// (rows + 1 values) its first token's offset in elements of qkv, of out and of lse. lse is
// then token-major within each sequence: sequence r's block [len_r, nq] starts at
// offsets[r]·nq (ops.h). Sequences past the micro-batch's have length 0 and start at T.
struct RaggedSpans {
  const int32_t* seq_len = nullptr;
  const int32_t* qkv_offset = nullptr;
  const int32_t* out_offset = nullptr;
  const int32_t* lse_offset = nullptr;
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
  // `ragged` for a THD shape, else null.
  void forward(void* out, float* lse, const void* qkv, const AttentionShape& shape, DeviceArena& scratch,
               const RaggedSpans* ragged = nullptr);
  // d_qkv bf16 [T, nq + 2 nkv, hd], all of it written. A THD shape is one call (CudaOps splits a
  // micro-batch's sequences into such calls, ops/thd_groups.h).
  void backward(void* d_qkv, const void* d_out, const void* out, const float* lse, const void* qkv,
                const AttentionShape& shape, DeviceArena& scratch, const RaggedSpans* ragged = nullptr);

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
