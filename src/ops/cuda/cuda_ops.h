// The CUDA backend of the op interface: bf16 activations and weights, fp32 statistics and
// main grads, on one stream. GEMMs through cuBLASLt (gemm.h), attention through cuDNN
// (attention.h), the rest loom's own kernels (kernels.h).
//
// Temporaries an op needs (norm-gradient partials, the lm_head's logits chunk, cuDNN's
// workspace) come from a workspace arena that each op starts afresh: ops run in stream
// order, so an op's temporaries are dead once the next op is queued behind it.
//
// LOOM_OP_PROFILE=1 in the environment times every op with CUDA events (no extra
// synchronisation) and prints, when the backend is destroyed, each op's total GPU time.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "ops/cuda/attention.h"
#include "ops/cuda/context_attention.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/gemm.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/kernels.h"
#include "ops/ops.h"
#include "ops/thd_groups.h"

namespace loom {

class CudaOps final : public Ops {
 public:
  // `loss_chunk_tokens`: tokens per lm_head chunk; 8,192 × 151,936 bf16 logits are 2.5 GB
  // (fp32 logits of a 16,384-token micro-batch would be 10 GB).
  explicit CudaOps(int64_t loss_chunk_tokens = 8192);
  ~CudaOps() override;
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  Device device() const override { return Device::cuda; }
  DType activation_dtype() const override { return DType::bf16; }
  cudaStream_t stream() const { return stream_; }
  DeviceArena& workspace() { return workspace_; }

  void embedding_forward(Tensor out, Tensor ids, Tensor table) override;
  void embedding_backward(Tensor d_table, Tensor ids, Tensor d_out) override;
  void linear_forward(Tensor out, Tensor x, Tensor weight, Tensor bias) override;
  void linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight) override;
  void lora_up_forward(Tensor out, Tensor t, const std::vector<LoraUp>& adapters, float scale) override;
  void lora_up_backward(Tensor d_t, Tensor d_out, Tensor t, const std::vector<LoraUp>& adapters,
                        float scale) override;
  void lora_dropout(Tensor out, Tensor x, const LoraDropoutMask& mask, bool accumulate) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Tensor out_amax) override;
  void residual_rmsnorm_forward(Tensor residual_out, Tensor out, Tensor rstd, Tensor residual, Tensor delta,
                                Tensor weight, float eps, Tensor out_amax) override;
  void rmsnorm_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight, Tensor rstd,
                        Tensor out_amax) override;
  void qk_norm_rope_forward(Tensor qkv_out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                            const RowSpans& rows, const HeadLayout& heads, float eps,
                            const RopeSpec& rope) override;
  void qk_norm_rope_backward(Tensor d_qkv, Tensor d_q_weight, Tensor d_k_weight, Tensor d_qkv_out, Tensor qkv,
                             Tensor q_weight, Tensor k_weight, Tensor rstd, const RowSpans& rows,
                             const HeadLayout& heads, const RopeSpec& rope, Tensor out_amax) override;
  void bias_add_forward(Tensor out, Tensor bias) override;
  void bias_backward(Tensor d_bias, Tensor d_out) override;
  void attention_forward(Tensor out, Tensor lse, Tensor qkv, const RowSpans& rows,
                         const HeadLayout& heads) override;
  void attention_backward(Tensor d_qkv, Tensor d_out, Tensor out, Tensor lse, Tensor qkv,
                          const RowSpans& rows, const HeadLayout& heads) override;
  void attention_context_forward(Tensor out, Tensor lse, Tensor qkv, Tensor whole, const ContextSpans& spans,
                                 const HeadLayout& heads) override;
  void attention_context_backward(Tensor d_qkv, Tensor d_whole, Tensor d_out, Tensor out, Tensor lse,
                                  Tensor qkv, Tensor whole, const ContextSpans& spans,
                                  const HeadLayout& heads) override;
  void amax(Tensor amax, Tensor x) override;
  void fp8_cast(Tensor out, Tensor out_t, Tensor scale_inv, Tensor x, Tensor amax, DType format) override;
  void fp8_gemm(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, bool accumulate,
                bool fast_accumulation) override;
  void fp8_census(Tensor counts, Tensor amax, Tensor x, Tensor q, Tensor scale_inv,
                  std::optional<Fp8Blocks> blocks) override;
  void fp8_cast_rows(Tensor out, Tensor scale_inv, Tensor x, DType format) override;
  void fp8_cast_columns(Tensor out_t, Tensor scale_inv, Tensor x, DType format) override;
  void fp8_cast_blocks(Tensor out, Tensor out_t, Tensor scale_inv, Tensor scale_inv_t, Tensor w,
                       DType format) override;
  void fp8_gemm_blocks(Tensor out, Tensor a, Tensor a_scale_inv, Fp8Blocks a_blocks, Tensor b,
                       Tensor b_scale_inv, Fp8Blocks b_blocks, bool accumulate) override;
  void swiglu_forward(Tensor out, Tensor gate_up, Tensor out_amax) override;
  void swiglu_backward(Tensor d_gate_up, Tensor d_out, Tensor gate_up, Tensor out_amax) override;
  void lm_head_loss(Tensor nll, Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                    Tensor targets, float grad_scale) override;
  void embedding_forward_shard(Tensor out, Tensor ids, Tensor table, int64_t vocab_begin) override;
  void embedding_backward_shard(Tensor d_table, Tensor ids, Tensor d_out, int64_t vocab_begin) override;
  void lm_head_shard_forward(Tensor lse, Tensor target_logit, Tensor hidden, Tensor weight, Tensor targets,
                             int64_t vocab_begin) override;
  void lm_head_shard_backward(Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight, Tensor targets,
                              Tensor lse, int64_t vocab_begin, float grad_scale) override;
  void lm_head_shard_combine(Tensor nll, Tensor lse, Tensor lse_parts, Tensor target_logit,
                             Tensor targets) override;
  void add(Tensor out, Tensor a, Tensor b) override;
  void fill_zero(Tensor x) override;
  void gather_rows(Tensor out, Tensor x, Tensor index) override;
  void scatter_rows(Tensor out, Tensor x, Tensor index) override;
  void moe_route_forward(Tensor expert_ids, Tensor weights, Tensor probs, Tensor logits,
                         bool normalize) override;
  void moe_route_backward(Tensor d_logits, Tensor d_weights, Tensor d_probs_per_expert, Tensor probs,
                          Tensor expert_ids, Tensor weights, bool normalize) override;
  void moe_sort(Tensor positions, Tensor offsets, Tensor expert_ids) override;
  void moe_permute(Tensor sorted, Tensor x, Tensor positions) override;
  void moe_permute_backward(Tensor d_x, Tensor d_sorted, Tensor positions, bool accumulate) override;
  void moe_combine_forward(Tensor out, Tensor y, Tensor positions, Tensor weights) override;
  void moe_combine_backward(Tensor d_y, Tensor d_weights, Tensor d_out, Tensor y, Tensor positions,
                            Tensor weights) override;
  void grouped_linear_forward(Tensor out, Tensor x, Tensor weight, Tensor offsets) override;
  void grouped_linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                               Tensor offsets) override;
  void column_sum(Tensor out, Tensor x) override;
  double sum(Tensor x) override;
  void copy_to_host(void* out, Tensor x) override;
  void copy_from_host(Tensor x, const void* in) override;

  // Σ x² over n fp32 device values (the grad norm's square), in a fixed order.
  double sum_squares(const float* x, int64_t n);
  // x *= scale, then Σ x², in one pass over x: bit for bit a scale pass and sum_squares.
  double scale_sum_squares(float* x, int64_t n, float scale);
  // Per slot s of `slots`, the values of x (fp32, device) that are NaN or ±inf over the ranges
  // with slot s (kernels.h count_nonfinite), waited for and returned to the host: which
  // tensors of a flat grad buffer hold a non-finite value, without copying the buffer.
  std::vector<int64_t> count_nonfinite(const float* x, const std::vector<cuda::CountRange>& ranges,
                                       int slots);

  // How the host waits for the stream where an op needs it (a reduction read back, a
  // positions table replaced, the workspace consolidated): cudaStreamSynchronize unless set.
  // The engine's CUDA store sets the bounded wait of its stream-ordered TP Comm: with
  // collectives queued on the stream, a peer that never joins one would otherwise hang the
  // host here for ever.
  void set_stream_wait(std::function<void()> wait) { stream_wait_ = std::move(wait); }

  // attention.h: cuDNN's SDPA backward one row a call (less workspace, a little slower).
  void set_attention_backward_by_row(bool by_row) { attention_->set_backward_by_row(by_row); }

  // LOOM_OP_PROFILE: forget the ops timed so far. The engine calls it as its second step
  // begins: the first step's ops also time the GPU waiting on one-time host work (GEMM
  // heuristics, cuDNN graph builds, first allocations) and would skew every rate.
  void profile_discard();

 private:
  void stream_wait();
  // The workspace emptied for the next op; when the last op spilled it into several blocks,
  // the stream is waited for first (stream_wait), since consolidating them waits for the
  // whole device.
  void workspace_restart();
  // A [tokens, r] copy in the workspace of the column window [from, from + r) of a [tokens,
  // width] bf16 tensor (uninitialised where from is null): LoRA's windows that do not start at
  // a 16-byte boundary (lora_up_forward).
  cuda::bf16* lora_window_copy(const cuda::bf16* from, int64_t tokens, int64_t r, int64_t width);
  const int32_t* positions(const RowSpans& rows);
  const float2* rope_table(int64_t head_dim, const RopeSpec& rope, const RowSpans& rows);
  // Σ x (or Σ x²) in a fixed order, waited for and returned to the host.
  double reduce_to_host(const float* x, int64_t n, bool square);
  // The reductions' fp64 result, once the stream has made it.
  double result_to_host();
  // Equal rows: the batched shape. Unequal ones: a THD shape, its batch and sequence
  // dimensions bucketed to powers of two (a run builds few graphs), and *ragged set to the
  // rows' lengths and offsets on the device (ragged_spans).
  AttentionShape attention_shape(const RowSpans& rows, const HeadLayout& heads, const RaggedSpans** ragged);
  // The THD arrays (attention.h RaggedSpans) of these rows for `sequences` sequences,
  // uploaded once per micro-batch (kept while its rows are the last seen).
  const RaggedSpans* ragged_spans(const RowSpans& rows, const HeadLayout& heads, int64_t sequences);
  // Context parallelism's pieces (context_attention.h) of `spans` against whole's t_all tokens:
  // the call's shape, its device arrays, each packed key's whole token (`source`, `packed` of
  // them, kernels.h context_kv_gather), and per whole token the packed keys that are it
  // (`cover`, t_all × cover_width, context_kv_sum). Uploaded once per micro-batch (kept while
  // its spans are the last seen).
  struct ContextTables {
    ContextAttentionShape shape;
    ContextPieces pieces;
    const int32_t* source = nullptr;
    int64_t packed = 0;
    const int32_t* cover = nullptr;
    int64_t cover_width = 0;
  };
  const ContextTables& context_tables(const char* op, const ContextSpans& spans, const HeadLayout& heads,
                                      int64_t t_all);
  // One cuDNN call of a THD backward: its sequences' bucketed shape, their arrays on the
  // device (offsets relative to its first token) and where its window of tokens starts.
  struct ThdCall {
    AttentionShape shape;
    RaggedSpans ragged;
    int64_t first_token = 0;
  };
  // The backward's calls over these rows (ops/thd_groups.h thd_backward_groups), each asking
  // at most the bound of workspace where its sequences allow; uploaded once per micro-batch.
  const std::vector<ThdCall>& thd_backward_calls(const RowSpans& rows, const HeadLayout& heads);
  // Copies `host` into a device table of the tables arena (a new slot, named `what`, when it
  // outgrows `capacity`), after the stream is done with the previous contents.
  int32_t* upload_table(const std::vector<int32_t>& host, int32_t*& table, int64_t& capacity,
                        const char* what);
  // The chunk walk of lm_head_loss and the shard ops (their weight is the whole vocabulary
  // or a shard): per chunk of at most loss_chunk_tokens_ tokens (the fewest such chunks, of
  // equal size up to a multiple of 256, so that no small last chunk runs its GEMMs at a poor
  // rate: 10,240 rows are two of 5,120, not 8,192 and 2,048), logits = hidden · Wᵀ in bf16 into the
  // workspace, then `loss(logits, begin, rows)` (a loss kernel, which for a backward turns
  // them into d logits in place), then with `backward` d_hidden = d logits · W
  // (written) and d_weight += d logitsᵀ · hidden (the GEMM's beta = 1).
  template <typename Loss>
  void lm_head_chunks(Tensor hidden, Tensor weight, Tensor d_hidden, Tensor d_weight, bool backward,
                      Loss loss);
  // The embedding ops on the table's rows [vocab_begin, vocab_begin + V) (kernels.h).
  void embedding_rows_forward(const char* op, Tensor out, Tensor ids, Tensor table, int64_t vocab_begin);
  void embedding_rows_backward(const char* op, Tensor d_table, Tensor ids, Tensor d_out, int64_t vocab_begin);

  // One op's events while LOOM_OP_PROFILE is set: started at construction, stopped at
  // destruction. `flops` (matmul ops) or `bytes` (memory-bound ops: the bytes the kernels
  // must move at least) turn the time into a rate in the report.
  class OpTimer {
   public:
    OpTimer(CudaOps& ops, const char* name, double flops = 0, double bytes = 0);
    ~OpTimer();
    OpTimer(const OpTimer&) = delete;
    OpTimer& operator=(const OpTimer&) = delete;

   private:
    CudaOps& ops_;
    size_t index_ = 0;
  };
  struct OpEvents {
    const char* name;
    double flops, bytes;
    cudaEvent_t start, stop;
  };
  void profile_report();

  cudaStream_t stream_ = nullptr;
  std::function<void()> stream_wait_;
  bool profile_ = false;
  bool profile_discarded_ = false;
  std::vector<OpEvents> profile_events_;
  DeviceArena workspace_{"op workspace"};
  DeviceArena tables_{"position and rope tables"};
  std::unique_ptr<GemmRunner> gemm_;
  std::unique_ptr<AttentionRunner> attention_;
  std::unique_ptr<ContextAttentionRunner> context_attention_;
  std::unique_ptr<GroupedGemmRunner> grouped_gemm_;
  int64_t loss_chunk_tokens_;
  std::vector<int32_t> positions_key_;
  int32_t* positions_ = nullptr;
  int64_t positions_capacity_ = 0;
  std::vector<int32_t> ragged_key_;  // rows.offsets, then the sequences and heads they were made for
  RaggedSpans ragged_;
  int32_t* ragged_table_ = nullptr;
  int64_t ragged_capacity_ = 0;       // int32 values
  std::vector<int32_t> context_key_;  // the spans' key_begin, key_end, then t_all and the heads
  ContextTables context_;
  int32_t* context_table_ = nullptr;
  int64_t context_capacity_ = 0;        // int32 values
  std::vector<int32_t> thd_calls_key_;  // rows.offsets, then the heads the calls were made for
  std::vector<ThdCall> thd_calls_;
  int32_t* thd_calls_table_ = nullptr;
  int64_t thd_calls_capacity_ = 0;  // int32 values
  struct RopeTable {
    float2* cos_sin = nullptr;
    int64_t positions = 0;
  };
  std::map<std::pair<int64_t, RopeSpec>, RopeTable> rope_;
  double* reduce_result_ = nullptr;
};

}  // namespace loom
