#include "ops/cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <span>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"
#include "ops/op_workspace.h"
#include "ops/thd_groups.h"

namespace loom {
namespace {

using bf16_t = cuda::bf16;

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data);
}

void check_device(const char* op, const char* name, const Tensor& t) {
  if (t.device != Device::cuda) throw_runtime_failure(op, std::string(name) + " is not a CUDA tensor");
}

cuda::Scratch scratch(DeviceArena& arena, int64_t bytes, const char* what) {
  return {arena.allocate_bytes(bytes, what), bytes};
}

// The lm_head ops' inputs: hidden [T, H], weight [V, H] (the whole vocabulary or a shard),
// targets i32[T].
void check_lm_head(const char* op, const Tensor& hidden, const Tensor& weight, const Tensor& targets) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1];
  check_tensor(op, "hidden", hidden, DType::bf16, {t, h});
  check_tensor(op, "weight", weight, DType::bf16, {weight.shape[0], h});
  check_tensor(op, "targets", targets, DType::i32, {t});
}

void check_lm_head_grads(const char* op, const Tensor& d_hidden, const Tensor& d_weight, const Tensor& hidden,
                         const Tensor& weight) {
  if (!d_hidden.data) throw_runtime_failure(op, "d_hidden is null");
  check_tensor(op, "d_hidden", d_hidden, DType::bf16, {hidden.shape[0], hidden.shape[1]});
  if (d_weight.data) check_tensor(op, "d_weight", d_weight, DType::f32, {weight.shape[0], weight.shape[1]});
}

// The causal forward's matmul FLOPs: QKᵀ and PV over the n(n+1)/2 unmasked scores of each
// row (n its length) and q head.
double attention_flops(const RowSpans& rows, const HeadLayout& heads) {
  double scores = 0;
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const auto n =
        static_cast<double>(rows.offsets[static_cast<size_t>(r + 1)] - rows.offsets[static_cast<size_t>(r)]);
    scores += n * (n + 1) / 2;
  }
  return 4.0 * static_cast<double>(heads.q_heads * heads.head_dim) * scores;
}

// Context parallelism's forward: QKᵀ and PV over each query's keys (ContextSpans) and q head.
double context_attention_flops(const ContextSpans& spans, const HeadLayout& heads) {
  double scores = 0;
  for (size_t i = 0; i < spans.key_begin.size(); ++i) scores += spans.key_end[i] - spans.key_begin[i];
  return 4.0 * static_cast<double>(heads.q_heads * heads.head_dim) * scores;
}

}  // namespace

CudaOps::OpTimer::OpTimer(CudaOps& ops, const char* name, double flops, double bytes) : ops_(ops) {
  if (!ops_.profile_) return;
  OpEvents e{name, flops, bytes, nullptr, nullptr};
  LOOM_CUDA_CHECK(cudaEventCreate(&e.start));
  LOOM_CUDA_CHECK(cudaEventCreate(&e.stop));
  LOOM_CUDA_CHECK(cudaEventRecord(e.start, ops_.stream_));
  index_ = ops_.profile_events_.size();
  ops_.profile_events_.push_back(e);
}

CudaOps::OpTimer::~OpTimer() {
  if (ops_.profile_) cudaEventRecord(ops_.profile_events_[index_].stop, ops_.stream_);
}

void CudaOps::profile_discard() {
  if (!profile_) return;
  stream_wait();
  for (const OpEvents& e : profile_events_) {
    cudaEventDestroy(e.start);
    cudaEventDestroy(e.stop);
  }
  profile_events_.clear();
  profile_discarded_ = true;
}

void CudaOps::profile_report() {
  cudaStreamSynchronize(stream_);
  struct Total {
    double ms = 0, flops = 0, bytes = 0;
    int64_t calls = 0;
  };
  std::map<std::string, Total> totals;
  // The stream's time between one op's end and the next op's start, by the pair of ops: the
  // work no op timer covers (the AdamW update, the grads' memset joins) and the host's
  // launch gaps, such as after a wait for the loss.
  std::map<std::string, double> between;
  double all = 0, all_between = 0;
  for (size_t i = 0; i < profile_events_.size(); ++i) {
    const OpEvents& e = profile_events_[i];
    float ms = 0;
    cudaEventElapsedTime(&ms, e.start, e.stop);
    Total& total = totals[e.name];
    total.ms += ms;
    total.flops += e.flops;
    total.bytes += e.bytes;
    total.calls += 1;
    all += ms;
    float gap = 0;
    if (i > 0 && cudaEventElapsedTime(&gap, profile_events_[i - 1].stop, e.start) == cudaSuccess && gap > 0) {
      between[std::string(profile_events_[i - 1].name) + " -> " + e.name] += gap;
      all_between += gap;
    }
  }
  for (const OpEvents& e : profile_events_) {
    cudaEventDestroy(e.start);
    cudaEventDestroy(e.stop);
  }
  std::vector<std::pair<std::string, Total>> sorted(totals.begin(), totals.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::fprintf(stderr,
               "loom op profile (GPU time of every op over the run%s, %.1f ms in all; TFLOP/s of the "
               "matmul ops, GB/s of the memory-bound ones):\n",
               profile_discarded_ ? " from its second step on" : "", all);
  for (const auto& [name, total] : sorted) {
    const double seconds = total.ms / 1e3;
    char rate[32] = "";
    if (total.flops > 0 && seconds > 0)
      std::snprintf(rate, sizeof rate, "%8.1f TFLOP/s", total.flops / seconds / 1e12);
    else if (total.bytes > 0 && seconds > 0)
      std::snprintf(rate, sizeof rate, "%8.1f GB/s", total.bytes / seconds / 1e9);
    std::fprintf(stderr, "  %-26s %10.2f ms %6.1f%% %8lld calls %s\n", name.c_str(), total.ms,
                 100.0 * total.ms / all, static_cast<long long>(total.calls), rate);
  }
  std::vector<std::pair<std::string, double>> gaps(between.begin(), between.end());
  std::sort(gaps.begin(), gaps.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::fprintf(
      stderr,
      "loom op profile: %.1f ms of the stream's time between ops; the largest, by the ops around it:\n",
      all_between);
  for (size_t i = 0; i < gaps.size() && i < 8; ++i)
    std::fprintf(stderr, "  %-60s %10.2f ms\n", gaps[i].first.c_str(), gaps[i].second);
}

CudaOps::CudaOps(int64_t loss_chunk_tokens) : loss_chunk_tokens_(loss_chunk_tokens) {
  profile_ = env_flag("LOOM_OP_PROFILE");
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<GemmRunner>(stream_);
  attention_ = std::make_unique<AttentionRunner>(stream_);
  context_attention_ = std::make_unique<ContextAttentionRunner>(stream_);
  grouped_gemm_ = std::make_unique<GroupedGemmRunner>(stream_);
  reduce_result_ = static_cast<double*>(tables_.allocate_bytes(sizeof(double), "reduction result"));
}

CudaOps::~CudaOps() {
  if (profile_) profile_report();
  cudaStreamSynchronize(stream_);
  grouped_gemm_.reset();
  context_attention_.reset();
  attention_.reset();
  gemm_.reset();
  cudaStreamDestroy(stream_);
}

void CudaOps::stream_wait() {
  if (stream_wait_)
    stream_wait_();
  else
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::workspace_restart() {
  if (workspace_.release_waits()) stream_wait();
  workspace_.release_all();
}

const int32_t* CudaOps::positions(const RowSpans& rows) {
  const int64_t t = rows.tokens();
  if (!rows.positions.empty() && static_cast<int64_t>(rows.positions.size()) != t)
    throw_runtime_failure("qk_norm_rope", "positions for " + std::to_string(rows.positions.size()) +
                                              " tokens, expected " + std::to_string(t));
  // The rows' offsets, then (after a −1, which no offset is) the given positions.
  std::vector<int32_t> key = rows.offsets;
  if (!rows.positions.empty()) {
    key.push_back(-1);
    key.insert(key.end(), rows.positions.begin(), rows.positions.end());
  }
  if (key == positions_key_) return positions_;
  std::vector<int32_t> host = rows.positions;
  if (host.empty()) {
    host.resize(static_cast<size_t>(t));
    for (int64_t r = 0; r < rows.rows(); ++r)
      for (int32_t i = rows.offsets[static_cast<size_t>(r)]; i < rows.offsets[static_cast<size_t>(r + 1)];
           ++i)
        host[static_cast<size_t>(i)] = i - rows.offsets[static_cast<size_t>(r)];
  }
  if (t > positions_capacity_) {
    // Table memory is small and kept for the run; a larger micro-batch takes a new slot.
    positions_ = static_cast<int32_t*>(tables_.allocate_bytes(t * 4, "token positions"));
    positions_capacity_ = t;
  }
  // The previous table may still be read by queued kernels.
  stream_wait();
  LOOM_CUDA_CHECK(cudaMemcpy(positions_, host.data(), static_cast<size_t>(t) * 4, cudaMemcpyHostToDevice));
  positions_key_ = std::move(key);
  return positions_;
}

const float2* CudaOps::rope_table(int64_t head_dim, const RopeSpec& rope, const RowSpans& rows) {
  int64_t positions_needed = 0;
  for (int64_t r = 0; r < rows.rows(); ++r)
    positions_needed = std::max<int64_t>(
        positions_needed, rows.offsets[static_cast<size_t>(r + 1)] - rows.offsets[static_cast<size_t>(r)]);
  for (int32_t p : rows.positions) {
    if (p < 0) throw_runtime_failure("qk_norm_rope", "a negative position (" + std::to_string(p) + ")");
    positions_needed = std::max<int64_t>(positions_needed, int64_t{p} + 1);
  }
  RopeTable& table = rope_[std::make_pair(head_dim, rope)];
  if (table.positions >= positions_needed) return table.cos_sin;
  // The CPU twin's values: inv_freq of ops/rope.h and cos/sin of position · inv_freq, each in
  // fp32 on the host. Tables are small (8,192 × 64 × 8 bytes = 4 MB) and kept; a longer row
  // makes a new one.
  const int64_t half = head_dim / 2;
  const std::vector<float> inv_freq = rope_inv_freq(rope, head_dim);
  std::vector<float> host(static_cast<size_t>(2 * positions_needed * half));
  for (int64_t i = 0; i < half; ++i) {
    for (int64_t p = 0; p < positions_needed; ++p) {
      const float angle = static_cast<float>(p) * inv_freq[static_cast<size_t>(i)];
      host[static_cast<size_t>(2 * (p * half + i))] = std::cos(angle);
      host[static_cast<size_t>(2 * (p * half + i) + 1)] = std::sin(angle);
    }
  }
  table.cos_sin = static_cast<float2*>(
      tables_.allocate_bytes(static_cast<int64_t>(host.size()) * 4, "rope cos/sin table"));
  table.positions = positions_needed;
  LOOM_CUDA_CHECK(cudaMemcpy(table.cos_sin, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  return table.cos_sin;
}

void CudaOps::embedding_forward(Tensor out, Tensor ids, Tensor table) {
  embedding_rows_forward("embedding_forward", out, ids, table, 0);
}

void CudaOps::embedding_backward(Tensor d_table, Tensor ids, Tensor d_out) {
  embedding_rows_backward("embedding_backward", d_table, ids, d_out, 0);
}

void CudaOps::embedding_forward_shard(Tensor out, Tensor ids, Tensor table, int64_t vocab_begin) {
  embedding_rows_forward("embedding_forward_shard", out, ids, table, vocab_begin);
}

void CudaOps::embedding_backward_shard(Tensor d_table, Tensor ids, Tensor d_out, int64_t vocab_begin) {
  embedding_rows_backward("embedding_backward_shard", d_table, ids, d_out, vocab_begin);
}

void CudaOps::embedding_rows_forward(const char* op, Tensor out, Tensor ids, Tensor table,
                                     int64_t vocab_begin) {
  const int64_t t = ids.numel(), v = table.shape[0], h = table.shape[1];
  OpTimer timer(*this, op, 0, 4.0 * static_cast<double>(t * h));
  check_tensor(op, "ids", ids, DType::i32, {t});
  check_tensor(op, "table", table, DType::bf16, {v, h});
  check_tensor(op, "out", out, DType::bf16, {t, h});
  check_device(op, "table", table);
  cuda::embedding_forward(ptr<bf16_t>(out), ptr<int32_t>(ids), ptr<bf16_t>(table), t, h, vocab_begin, v,
                          stream_);
}

void CudaOps::embedding_rows_backward(const char* op, Tensor d_table, Tensor ids, Tensor d_out,
                                      int64_t vocab_begin) {
  const int64_t t = ids.numel(), v = d_table.shape[0], h = d_table.shape[1];
  OpTimer timer(*this, op, 0, 10.0 * static_cast<double>(t * h));  // bf16 rows in, fp32 rows read and written
  check_tensor(op, "ids", ids, DType::i32, {t});
  check_tensor(op, "d_table", d_table, DType::f32, {v, h});
  check_tensor(op, "d_out", d_out, DType::bf16, {t, h});
  workspace_restart();
  cuda::embedding_backward(ptr<float>(d_table), ptr<int32_t>(ids), ptr<bf16_t>(d_out), t, h, vocab_begin, v,
                           scratch(workspace_, cuda::embedding_backward_scratch_bytes(t), "embedding sort"),
                           stream_);
}

void CudaOps::linear_forward(Tensor out, Tensor x, Tensor weight, Tensor bias) {
  const int64_t t = x.shape[0], k = x.shape[1], n = weight.shape[0];
  OpTimer timer(*this, bias.data ? "linear_forward (+ bias)" : "linear_forward",
                2.0 * static_cast<double>(t * n * k));
  check_tensor("linear_forward", "x", x, DType::bf16, {t, k});
  check_tensor("linear_forward", "weight", weight, DType::bf16, {n, k});
  check_tensor("linear_forward", "out", out, DType::bf16, {t, n});
  if (bias.data) check_tensor("linear_forward", "bias", bias, DType::bf16, {n});
  GemmShape shape{t, n, k, false, true, DType::bf16, false};
  shape.bias = bias.data != nullptr;
  gemm_->run(shape, x.data, weight.data, out.data, 1.0f, nullptr, nullptr, bias.data);
}

void CudaOps::linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight) {
  const int64_t t = d_out.shape[0], k = weight.shape[1], n = weight.shape[0];
  const double gemms = (d_x.data ? 1.0 : 0.0) + (d_weight.data ? 1.0 : 0.0);
  OpTimer timer(*this, "linear_backward", 2.0 * gemms * static_cast<double>(t * n * k));
  check_tensor("linear_backward", "d_out", d_out, DType::bf16, {t, n});
  if (d_x.data) {
    check_tensor("linear_backward", "d_x", d_x, DType::bf16, {t, k});
    gemm_->run({t, k, n, false, false, DType::bf16, false}, d_out.data, weight.data, d_x.data);
  }
  if (d_weight.data) {
    check_tensor("linear_backward", "d_weight", d_weight, DType::f32, {n, k});
    check_tensor("linear_backward", "x", x, DType::bf16, {t, k});
    gemm_->run({n, k, t, true, false, DType::f32, true}, d_out.data, x.data, d_weight.data);
  }
}

// Each adapter's GEMMs read and write column windows of the wider t and out (row strides J·r
// and N): a few small GEMMs (r of 8 to 64) per linear layer. cuBLASLt's strided GEMMs take
// windows that start at 16-byte boundaries (gemm.h): adapter j's columns of t and d_t start at
// j·r, which a rank that is not a multiple of 8 leaves unaligned for j > 0. Such windows go
// through a contiguous copy [T, r] in the op workspace (cudaMemcpy2DAsync), the GEMM reading
// or writing the copy instead.
namespace {
bool lora_window_aligned(int64_t r, size_t j) {
  return j == 0 || r % 8 == 0;
}
}  // namespace

bf16_t* CudaOps::lora_window_copy(const bf16_t* from, int64_t tokens, int64_t r, int64_t width) {
  auto* to = static_cast<bf16_t*>(workspace_.allocate_bytes(tokens * r * 2, "LoRA window (unaligned rank)"));
  if (from)
    LOOM_CUDA_CHECK(cudaMemcpy2DAsync(to, static_cast<size_t>(r) * 2, from, static_cast<size_t>(width) * 2,
                                      static_cast<size_t>(r) * 2, static_cast<size_t>(tokens),
                                      cudaMemcpyDeviceToDevice, stream_));
  return to;
}

void CudaOps::lora_up_forward(Tensor out, Tensor t, const std::vector<LoraUp>& adapters, float scale) {
  const int64_t r = lora_up_check("lora_up_forward", out, t, adapters, DType::bf16, DType::bf16, false);
  const int64_t tokens = out.shape[0], n = out.shape[1], width = t.shape[1];
  double flops = 0;
  for (const LoraUp& a : adapters) flops += 2.0 * static_cast<double>(tokens * a.b.shape[0] * r);
  OpTimer timer(*this, "lora_up_forward", flops);
  workspace_restart();
  for (size_t j = 0; j < adapters.size(); ++j) {
    const LoraUp& a = adapters[j];
    const bf16_t* t_j = ptr<bf16_t>(t) + static_cast<int64_t>(j) * r;
    GemmShape shape{tokens, a.b.shape[0], r, false, true, DType::bf16, true};
    shape.lda = width;
    if (!lora_window_aligned(r, j)) {
      t_j = lora_window_copy(t_j, tokens, r, width);
      shape.lda = r;
    }
    shape.ldc = n;
    gemm_->run(shape, t_j, a.b.data, ptr<bf16_t>(out) + a.column, scale);
  }
}

void CudaOps::lora_up_backward(Tensor d_t, Tensor d_out, Tensor t, const std::vector<LoraUp>& adapters,
                               float scale) {
  const int64_t r = lora_up_check("lora_up_backward", d_out, d_t, adapters, DType::bf16, DType::bf16, true);
  check_tensor("lora_up_backward", "t", t, DType::bf16, {d_t.shape[0], d_t.shape[1]});
  const int64_t tokens = d_out.shape[0], n = d_out.shape[1], width = t.shape[1];
  double flops = 0;
  for (const LoraUp& a : adapters) flops += 4.0 * static_cast<double>(tokens * a.b.shape[0] * r);
  OpTimer timer(*this, "lora_up_backward", flops);
  for (size_t j = 0; j < adapters.size(); ++j) {
    workspace_restart();
    const LoraUp& a = adapters[j];
    const int64_t rows = a.b.shape[0];
    const int64_t offset = static_cast<int64_t>(j) * r;
    const bool aligned = lora_window_aligned(r, j);
    const int64_t ld = aligned ? width : r;
    // d_t_j [T, r] = scale · d_out_j [T, N_j] · B_j [N_j, r]
    bf16_t* d_t_j = aligned ? ptr<bf16_t>(d_t) + offset : lora_window_copy(nullptr, tokens, r, width);
    GemmShape input{tokens, r, rows, false, false, DType::bf16, false};
    input.lda = n;
    input.ldc = ld;
    gemm_->run(input, ptr<bf16_t>(d_out) + a.column, a.b.data, d_t_j, scale);
    if (!aligned)
      LOOM_CUDA_CHECK(cudaMemcpy2DAsync(ptr<bf16_t>(d_t) + offset, static_cast<size_t>(width) * 2, d_t_j,
                                        static_cast<size_t>(r) * 2, static_cast<size_t>(r) * 2,
                                        static_cast<size_t>(tokens), cudaMemcpyDeviceToDevice, stream_));
    // d_B_j [N_j, r] += scale · d_out_jᵀ · t_j
    const bf16_t* t_j =
        aligned ? ptr<bf16_t>(t) + offset : lora_window_copy(ptr<bf16_t>(t) + offset, tokens, r, width);
    GemmShape weight{rows, r, tokens, true, false, DType::f32, true};
    weight.lda = n;
    weight.ldb = ld;
    gemm_->run(weight, ptr<bf16_t>(d_out) + a.column, t_j, a.d_b.data, scale);
  }
}

void CudaOps::amax(Tensor amax, Tensor x) {
  OpTimer timer(*this, "fp8 amax", 0, static_cast<double>(x.nbytes()));
  check_tensor("amax", "amax", amax, DType::f32, {1});
  check_device("amax", "x", x);
  if (x.dtype == DType::f32)
    cuda::amax(ptr<float>(amax), ptr<float>(x), x.numel(), stream_);
  else if (x.dtype == DType::bf16)
    cuda::amax(ptr<float>(amax), ptr<bf16_t>(x), x.numel(), stream_);
  else
    throw_runtime_failure("amax", "x is " + dtype_name(x.dtype) + ", expected BF16 or F32");
}

void CudaOps::fp8_cast(Tensor out, Tensor out_t, Tensor scale_inv, Tensor x, Tensor amax, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  OpTimer timer(*this, out_t.data ? "fp8 cast-transpose" : "fp8 cast", 0,
                static_cast<double>(r * c) * (2.0 + (out.data ? 1 : 0) + (out_t.data ? 1 : 0)));
  if (format != DType::e4m3 && format != DType::e5m2) throw_runtime_failure("fp8_cast", "format is not FP8");
  check_tensor("fp8_cast", "x", x, DType::bf16, {r, c});
  check_tensor("fp8_cast", "amax", amax, DType::f32, {1});
  check_tensor("fp8_cast", "scale_inv", scale_inv, DType::f32, {1});
  if (out.data) check_tensor("fp8_cast", "out", out, format, {r, c});
  if (out_t.data) check_tensor("fp8_cast", "out_t", out_t, format, {c, -1});
  const int64_t ld = out_t.data ? out_t.shape[1] : r;
  if (c % 8 != 0 || ld < r || (out_t.data && ld % 8 != 0))
    throw_runtime_failure("fp8_cast",
                          "x is " + x.shape.str() + ", out_t " + out_t.shape.str() +
                              "; the FP8 cast needs columns in multiples of 8, and out_t's rows at "
                              "least x's rows, a multiple of 8");
  cuda::fp8_cast(static_cast<uint8_t*>(out.data), static_cast<uint8_t*>(out_t.data), ld,
                 ptr<float>(scale_inv), ptr<bf16_t>(x), ptr<float>(amax), r, c, format == DType::e5m2,
                 stream_);
}

void CudaOps::fp8_gemm(Tensor out, Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv,
                       bool accumulate, bool fast_accumulation) {
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[0];
  OpTimer timer(*this, accumulate ? "fp8 gemm (weight grad)" : "fp8 gemm",
                2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  const auto fp8 = [](DType d) { return d == DType::e4m3 || d == DType::e5m2; };
  if (!fp8(a.dtype) || !fp8(b.dtype) || (a.dtype == DType::e5m2 && b.dtype == DType::e5m2))
    throw_runtime_failure("fp8_gemm", "a and b must be FP8, not both e5m2");
  check_tensor("fp8_gemm", "b", b, b.dtype, {n, k});
  check_tensor("fp8_gemm", "a_scale_inv", a_scale_inv, DType::f32, {1});
  check_tensor("fp8_gemm", "b_scale_inv", b_scale_inv, DType::f32, {1});
  check_tensor("fp8_gemm", "out", out, accumulate ? DType::f32 : DType::bf16, {m, n});
  if (n % 16 != 0 || k % 16 != 0)
    throw_runtime_failure("fp8_gemm", "m=" + std::to_string(m) + " n=" + std::to_string(n) +
                                          " k=" + std::to_string(k) +
                                          "; cuBLASLt's FP8 GEMMs need n and k in multiples of 16");
  GemmShape shape{m, n, k, false, true, out.dtype, accumulate};
  shape.a_dtype = a.dtype;
  shape.b_dtype = b.dtype;
  shape.fast_accumulation = fast_accumulation;
  gemm_->run(shape, a.data, b.data, out.data, 1.0f, ptr<float>(a_scale_inv), ptr<float>(b_scale_inv));
}

namespace {

void check_block_scales(const char* op, const char* name, const Tensor& scale_inv, Fp8Blocks blocks,
                        int64_t rows, int64_t cols) {
  const Shape shape = fp8_block_scales_shape(blocks, rows, cols);
  check_tensor(op, name, scale_inv, DType::f32, {shape[0], shape[1]});
}

void check_fp8_format(const char* op, DType format) {
  if (format != DType::e4m3 && format != DType::e5m2) throw_runtime_failure(op, "format is not FP8");
}

// The CUDA backend's block-scaled kernels and cuBLASLt's GEMMs take whole 128-blocks only.
void require_blocks(const char* op, const std::string& shapes, std::initializer_list<int64_t> dims) {
  for (int64_t d : dims)
    if (d % kFp8BlockSize != 0)
      throw_runtime_failure(op, shapes + ": block-scaled FP8 on CUDA needs these dims in multiples of 128");
}

}  // namespace

void CudaOps::fp8_cast_rows(Tensor out, Tensor scale_inv, Tensor x, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  OpTimer timer(*this, "fp8 cast (1x128 blocks)", 0, 3.0 * static_cast<double>(r * c));
  check_fp8_format("fp8_cast_rows", format);
  check_tensor("fp8_cast_rows", "x", x, DType::bf16, {r, c});
  check_tensor("fp8_cast_rows", "out", out, format, {r, c});
  check_block_scales("fp8_cast_rows", "scale_inv", scale_inv, Fp8Blocks::vec128, r, c);
  require_blocks("fp8_cast_rows", "x " + x.shape.str() + " (its columns)", {c});
  cuda::fp8_cast_rows(static_cast<uint8_t*>(out.data), ptr<float>(scale_inv), ptr<bf16_t>(x), r, c,
                      format == DType::e5m2, stream_);
}

void CudaOps::fp8_cast_columns(Tensor out_t, Tensor scale_inv, Tensor x, DType format) {
  const int64_t r = x.shape[0], c = x.shape[1];
  OpTimer timer(*this, "fp8 cast-transpose (1x128 blocks)", 0, 3.0 * static_cast<double>(r * c));
  check_fp8_format("fp8_cast_columns", format);
  check_tensor("fp8_cast_columns", "x", x, DType::bf16, {r, c});
  check_tensor("fp8_cast_columns", "out_t", out_t, format, {c, -1});
  const int64_t ld = out_t.shape[1];
  if (ld < r)
    throw_runtime_failure("fp8_cast_columns", "out_t " + out_t.shape.str() + " is narrower than x's rows");
  check_block_scales("fp8_cast_columns", "scale_inv", scale_inv, Fp8Blocks::vec128, c, ld);
  require_blocks("fp8_cast_columns",
                 "x " + x.shape.str() + ", out_t " + out_t.shape.str() + " (both of out_t's dims)", {c, ld});
  cuda::fp8_cast_columns(static_cast<uint8_t*>(out_t.data), ld, ptr<float>(scale_inv), ptr<bf16_t>(x), r, c,
                         format == DType::e5m2, stream_);
}

void CudaOps::fp8_cast_blocks(Tensor out, Tensor out_t, Tensor scale_inv, Tensor scale_inv_t, Tensor w,
                              DType format) {
  const int64_t r = w.shape[0], c = w.shape[1];
  OpTimer timer(*this, "fp8 cast-transpose (128x128 blocks)", 0, 4.0 * static_cast<double>(r * c));
  check_fp8_format("fp8_cast_blocks", format);
  check_tensor("fp8_cast_blocks", "w", w, DType::bf16, {r, c});
  check_tensor("fp8_cast_blocks", "out", out, format, {r, c});
  check_tensor("fp8_cast_blocks", "out_t", out_t, format, {c, r});
  check_block_scales("fp8_cast_blocks", "scale_inv", scale_inv, Fp8Blocks::block128x128, r, c);
  check_block_scales("fp8_cast_blocks", "scale_inv_t", scale_inv_t, Fp8Blocks::block128x128, c, r);
  require_blocks("fp8_cast_blocks", "w " + w.shape.str(), {r, c});
  cuda::fp8_cast_blocks(static_cast<uint8_t*>(out.data), static_cast<uint8_t*>(out_t.data),
                        ptr<float>(scale_inv), scale_inv.shape[1], ptr<float>(scale_inv_t),
                        scale_inv_t.shape[1], ptr<bf16_t>(w), r, c, format == DType::e5m2, stream_);
}

void CudaOps::fp8_gemm_blocks(Tensor out, Tensor a, Tensor a_scale_inv, Fp8Blocks a_blocks, Tensor b,
                              Tensor b_scale_inv, Fp8Blocks b_blocks, bool accumulate) {
  const int64_t m = a.shape[0], k = a.shape[1], n = b.shape[0];
  OpTimer timer(*this, accumulate ? "fp8 gemm blocks (weight grad)" : "fp8 gemm blocks",
                2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  const auto fp8 = [](DType d) { return d == DType::e4m3 || d == DType::e5m2; };
  if (!fp8(a.dtype) || !fp8(b.dtype) || (a.dtype == DType::e5m2 && b.dtype == DType::e5m2))
    throw_runtime_failure("fp8_gemm_blocks", "a and b must be FP8, not both e5m2");
  if (a_blocks == Fp8Blocks::block128x128 && b_blocks == Fp8Blocks::block128x128)
    throw_runtime_failure("fp8_gemm_blocks", "a and b are both 128x128-blocked; cuBLASLt needs one 1x128");
  check_tensor("fp8_gemm_blocks", "b", b, b.dtype, {n, k});
  check_block_scales("fp8_gemm_blocks", "a_scale_inv", a_scale_inv, a_blocks, m, k);
  check_block_scales("fp8_gemm_blocks", "b_scale_inv", b_scale_inv, b_blocks, n, k);
  check_tensor("fp8_gemm_blocks", "out", out, accumulate ? DType::f32 : DType::bf16, {m, n});
  require_blocks("fp8_gemm_blocks",
                 "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k), {m, n, k});
  const auto scales = [](Fp8Blocks blocks) {
    return blocks == Fp8Blocks::vec128 ? GemmScales::vec128 : GemmScales::block128x128;
  };
  GemmShape shape{m, n, k, false, true, out.dtype, accumulate};
  shape.a_dtype = a.dtype;
  shape.b_dtype = b.dtype;
  shape.a_scales = scales(a_blocks);
  shape.b_scales = scales(b_blocks);
  gemm_->run(shape, a.data, b.data, out.data, 1.0f, ptr<float>(a_scale_inv), ptr<float>(b_scale_inv));
}

void CudaOps::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps, Tensor out_amax) {
  const int64_t t = x.shape[0], h = x.shape[1];
  OpTimer timer(*this, "rmsnorm_forward", 0, 4.0 * static_cast<double>(t * h));
  check_tensor("rmsnorm_forward", "out", out, DType::bf16, {t, h});
  check_tensor("rmsnorm_forward", "rstd", rstd, DType::f32, {t});
  check_tensor("rmsnorm_forward", "weight", weight, DType::bf16, {h});
  if (out_amax.data) check_tensor("rmsnorm_forward", "out_amax", out_amax, DType::f32, {1});
  cuda::rmsnorm_forward(ptr<bf16_t>(out), ptr<float>(rstd), ptr<float>(out_amax), ptr<bf16_t>(x),
                        ptr<bf16_t>(weight), t, h, eps, stream_);
}

void CudaOps::residual_rmsnorm_forward(Tensor residual_out, Tensor out, Tensor rstd, Tensor residual,
                                       Tensor delta, Tensor weight, float eps, Tensor out_amax) {
  const int64_t t = residual.shape[0], h = residual.shape[1];
  OpTimer timer(*this, "residual_rmsnorm_forward", 0, 8.0 * static_cast<double>(t * h));
  check_tensor("residual_rmsnorm_forward", "delta", delta, DType::bf16, {t, h});
  check_tensor("residual_rmsnorm_forward", "residual_out", residual_out, DType::bf16, {t, h});
  check_tensor("residual_rmsnorm_forward", "out", out, DType::bf16, {t, h});
  check_tensor("residual_rmsnorm_forward", "rstd", rstd, DType::f32, {t});
  if (out_amax.data) check_tensor("residual_rmsnorm_forward", "out_amax", out_amax, DType::f32, {1});
  cuda::residual_rmsnorm_forward(ptr<bf16_t>(residual_out), ptr<bf16_t>(out), ptr<float>(rstd),
                                 ptr<float>(out_amax), ptr<bf16_t>(residual), ptr<bf16_t>(delta),
                                 ptr<bf16_t>(weight), t, h, eps, stream_);
}

void CudaOps::rmsnorm_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                               Tensor rstd, Tensor out_amax) {
  const int64_t t = x.shape[0], h = x.shape[1];
  OpTimer timer(*this, "rmsnorm_backward", 0, 8.0 * static_cast<double>(t * h));
  check_tensor("rmsnorm_backward", "d_x", d_x, DType::bf16, {t, h});
  if (d_weight.data) check_tensor("rmsnorm_backward", "d_weight", d_weight, DType::f32, {h});
  check_tensor("rmsnorm_backward", "d_out", d_out, DType::bf16, {t, h});
  if (out_amax.data) check_tensor("rmsnorm_backward", "out_amax", out_amax, DType::f32, {1});
  workspace_restart();
  cuda::rmsnorm_backward(ptr<bf16_t>(d_x), ptr<float>(d_weight), ptr<float>(out_amax), ptr<bf16_t>(d_out),
                         ptr<bf16_t>(x), ptr<bf16_t>(weight), ptr<float>(rstd), t, h,
                         scratch(workspace_, cuda::rmsnorm_backward_scratch_bytes(t, h), "rmsnorm partials"),
                         stream_);
}

void CudaOps::qk_norm_rope_forward(Tensor qkv_out, Tensor rstd, Tensor qkv, Tensor q_weight, Tensor k_weight,
                                   const RowSpans& rows, const HeadLayout& heads, float eps,
                                   const RopeSpec& rope) {
  const int64_t t = rows.tokens(), hd = heads.head_dim;
  OpTimer timer(*this, "qk_norm_rope_forward", 0, 4.0 * static_cast<double>(t * heads.total_heads() * hd));
  check_tensor("qk_norm_rope_forward", "qkv", qkv, DType::bf16, {t, heads.total_heads(), hd});
  check_tensor("qk_norm_rope_forward", "qkv_out", qkv_out, DType::bf16, {t, heads.total_heads(), hd});
  if (q_weight.data) {
    check_tensor("qk_norm_rope_forward", "rstd", rstd, DType::f32, {t, heads.q_heads + heads.kv_heads});
    check_tensor("qk_norm_rope_forward", "q_weight", q_weight, DType::bf16, {hd});
    check_tensor("qk_norm_rope_forward", "k_weight", k_weight, DType::bf16, {hd});
  }
  cuda::qk_norm_rope_forward(ptr<bf16_t>(qkv_out), ptr<float>(rstd), ptr<bf16_t>(qkv), ptr<bf16_t>(q_weight),
                             ptr<bf16_t>(k_weight), positions(rows), rope_table(hd, rope, rows), t,
                             heads.q_heads, heads.kv_heads, hd, eps, stream_);
}

void CudaOps::qk_norm_rope_backward(Tensor d_qkv, Tensor d_q_weight, Tensor d_k_weight, Tensor d_qkv_out,
                                    Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor rstd,
                                    const RowSpans& rows, const HeadLayout& heads, const RopeSpec& rope,
                                    Tensor out_amax) {
  const int64_t t = rows.tokens(), hd = heads.head_dim;
  // Read: d_out of the heads walked (the v heads too unless in place) and x of the q and k
  // heads, and in place the v heads when their amax is asked for; written: d_qkv of the heads
  // walked.
  const int64_t normed = heads.q_heads + heads.kv_heads;
  const bool in_place = d_qkv.data == d_qkv_out.data;
  const int64_t walked = in_place ? normed : heads.total_heads();
  const int64_t v_read = in_place && out_amax.data ? heads.kv_heads : 0;
  OpTimer timer(*this, "qk_norm_rope_backward", 0,
                2.0 * static_cast<double>(t * (2 * walked + normed + v_read) * hd));
  check_tensor("qk_norm_rope_backward", "d_qkv", d_qkv, DType::bf16, {t, heads.total_heads(), hd});
  check_tensor("qk_norm_rope_backward", "d_qkv_out", d_qkv_out, DType::bf16, {t, heads.total_heads(), hd});
  if (q_weight.data && d_q_weight.data) {
    check_tensor("qk_norm_rope_backward", "d_q_weight", d_q_weight, DType::f32, {hd});
    check_tensor("qk_norm_rope_backward", "d_k_weight", d_k_weight, DType::f32, {hd});
  }
  if (out_amax.data) check_tensor("qk_norm_rope_backward", "out_amax", out_amax, DType::f32, {1});
  const int32_t* pos = positions(rows);
  workspace_restart();
  cuda::qk_norm_rope_backward(
      ptr<bf16_t>(d_qkv), ptr<float>(d_q_weight), ptr<float>(d_k_weight), ptr<float>(out_amax),
      ptr<bf16_t>(d_qkv_out), ptr<bf16_t>(qkv), ptr<bf16_t>(q_weight), ptr<bf16_t>(k_weight),
      ptr<float>(rstd), pos, rope_table(hd, rope, rows), t, heads.q_heads, heads.kv_heads, hd,
      scratch(workspace_, cuda::qk_norm_rope_backward_scratch_bytes(t, hd), "q/k norm partials"), stream_);
}

void CudaOps::bias_add_forward(Tensor out, Tensor bias) {
  const int64_t t = out.shape[0], n = bias.numel();
  OpTimer timer(*this, "bias_add_forward", 0, 4.0 * static_cast<double>(t * n));
  check_tensor("bias_add_forward", "out", out, DType::bf16, {t, n});
  check_tensor("bias_add_forward", "bias", bias, DType::bf16, {n});
  cuda::bias_add_forward(ptr<bf16_t>(out), ptr<bf16_t>(bias), t, n, stream_);
}

void CudaOps::bias_backward(Tensor d_bias, Tensor d_out) {
  const int64_t t = d_out.shape[0], n = d_bias.numel();
  OpTimer timer(*this, "bias_backward", 0, 2.0 * static_cast<double>(t * n));
  check_tensor("bias_backward", "d_out", d_out, DType::bf16, {t, n});
  check_tensor("bias_backward", "d_bias", d_bias, DType::f32, {n});
  workspace_restart();
  cuda::bias_backward(ptr<float>(d_bias), ptr<bf16_t>(d_out), t, n,
                      scratch(workspace_, cuda::bias_backward_scratch_bytes(t, n), "bias gradient partials"),
                      stream_);
}

AttentionShape CudaOps::attention_shape(const RowSpans& rows, const HeadLayout& heads,
                                        const RaggedSpans** ragged) {
  const int64_t n = rows.rows() > 0 ? rows.offsets[1] - rows.offsets[0] : 0;
  int64_t longest = 0;
  bool equal = true;
  for (int64_t r = 0; r < rows.rows(); ++r) {
    const int64_t len = rows.offsets[static_cast<size_t>(r + 1)] - rows.offsets[static_cast<size_t>(r)];
    equal = equal && len == n;
    longest = std::max(longest, len);
  }
  *ragged = nullptr;
  if (equal) return {rows.rows(), n, heads.q_heads, heads.kv_heads, heads.head_dim};
  using op_workspace::power_of_two_at_least;
  AttentionShape shape{power_of_two_at_least(rows.rows(), op_workspace::kThdMinSequences),
                       power_of_two_at_least(longest, op_workspace::kThdMinSequenceTokens), heads.q_heads,
                       heads.kv_heads, heads.head_dim};
  shape.ragged = true;
  shape.tokens = rows.tokens();
  *ragged = ragged_spans(rows, heads, shape.rows);
  return shape;
}

namespace {

// The THD arrays (attention.h RaggedSpans) of `count` sequences starting at sequence `first`
// of `offsets`, in `sequences` slots, their offsets relative to sequence first's first token:
// [sequences] lengths, then [sequences + 1] offsets of qkv, out and lse; slots past the real
// sequences are empty at the window's end. 4 · sequences + 3 values from `out`.
void fill_ragged(int32_t* out, std::span<const int32_t> offsets, int64_t first, int64_t count,
                 int64_t sequences, const HeadLayout& heads) {
  int32_t* seq_len = out;
  int32_t* qkv = seq_len + sequences;
  int32_t* attn_out = qkv + sequences + 1;
  int32_t* lse = attn_out + sequences + 1;
  const int64_t base = offsets[static_cast<size_t>(first)];
  for (int64_t r = 0; r <= sequences; ++r) {
    const int64_t start = offsets[static_cast<size_t>(first + std::min(r, count))] - base;
    if (r < sequences)
      seq_len[r] =
          r < count ? offsets[static_cast<size_t>(first + r + 1)] - static_cast<int32_t>(base + start) : 0;
    qkv[r] = static_cast<int32_t>(start * heads.total_heads() * heads.head_dim);
    attn_out[r] = static_cast<int32_t>(start * heads.q_heads * heads.head_dim);
    lse[r] = static_cast<int32_t>(start * heads.q_heads);
  }
}

RaggedSpans ragged_view(int32_t* table, int64_t sequences) {
  const int64_t b = sequences;
  return {table, table + b, table + 2 * b + 1, table + 3 * b + 2};
}

}  // namespace

int32_t* CudaOps::upload_table(const std::vector<int32_t>& host, int32_t*& table, int64_t& capacity,
                               const char* what) {
  const auto values = static_cast<int64_t>(host.size());
  if (values > capacity) {
    // Small and kept for the run, like the position table; a larger batch takes a new slot.
    table = static_cast<int32_t*>(tables_.allocate_bytes(values * 4, what));
    capacity = values;
  }
  // The previous arrays may still be read by queued kernels.
  stream_wait();
  LOOM_CUDA_CHECK(cudaMemcpy(table, host.data(), static_cast<size_t>(values) * 4, cudaMemcpyHostToDevice));
  return table;
}

const RaggedSpans* CudaOps::ragged_spans(const RowSpans& rows, const HeadLayout& heads, int64_t sequences) {
  std::vector<int32_t> key = rows.offsets;
  key.push_back(static_cast<int32_t>(sequences));
  key.push_back(static_cast<int32_t>(heads.total_heads()));
  key.push_back(static_cast<int32_t>(heads.q_heads));
  key.push_back(static_cast<int32_t>(heads.head_dim));
  if (key == ragged_key_) return &ragged_;
  LOOM_ASSERT(static_cast<double>(rows.tokens()) * static_cast<double>(heads.total_heads() * heads.head_dim) <
                  2147483647.0,
              "THD offsets past int32");
  std::vector<int32_t> host(static_cast<size_t>(4 * sequences + 3));
  fill_ragged(host.data(), rows.offsets, 0, rows.rows(), sequences, heads);
  ragged_ =
      ragged_view(upload_table(host, ragged_table_, ragged_capacity_, "THD lengths and offsets"), sequences);
  ragged_key_ = std::move(key);
  return &ragged_;
}

const std::vector<CudaOps::ThdCall>& CudaOps::thd_backward_calls(const RowSpans& rows,
                                                                 const HeadLayout& heads) {
  std::vector<int32_t> key = rows.offsets;
  key.push_back(static_cast<int32_t>(heads.total_heads()));
  key.push_back(static_cast<int32_t>(heads.q_heads));
  key.push_back(static_cast<int32_t>(heads.head_dim));
  if (key == thd_calls_key_) return thd_calls_;
  const std::vector<ThdGroup> groups = thd_backward_groups(rows.offsets, thd_workspace_model(heads));
  std::vector<int32_t> host;
  std::vector<size_t> starts;
  for (const ThdGroup& g : groups) {
    starts.push_back(host.size());
    host.resize(host.size() + static_cast<size_t>(4 * g.sequences + 3));
    fill_ragged(host.data() + starts.back(), rows.offsets, g.first, g.count, g.sequences, heads);
  }
  int32_t* table =
      upload_table(host, thd_calls_table_, thd_calls_capacity_, "THD backward calls' lengths and offsets");
  thd_calls_.clear();
  for (size_t i = 0; i < groups.size(); ++i) {
    const ThdGroup& g = groups[i];
    AttentionShape shape{g.sequences, g.sequence_tokens, heads.q_heads, heads.kv_heads, heads.head_dim};
    shape.ragged = true;
    // cuDNN's max_total_seq_len, an upper bound of the call's tokens: bucketed like its shape
    // (at most sequences × sequence_tokens), so that the groups' varying sums build few graphs.
    shape.tokens = op_workspace::power_of_two_at_least(g.tokens, op_workspace::kThdMinSequenceTokens);
    thd_calls_.push_back({shape, ragged_view(table + starts[i], g.sequences), g.first_token});
  }
  thd_calls_key_ = std::move(key);
  return thd_calls_;
}

void CudaOps::attention_forward(Tensor out, Tensor lse, Tensor qkv, const RowSpans& rows,
                                const HeadLayout& heads) {
  const int64_t t = rows.tokens();
  const RaggedSpans* ragged = nullptr;
  const AttentionShape shape = attention_shape(rows, heads, &ragged);
  attention_->prepare(shape);  // the one-time graph build stays outside the op's time
  OpTimer timer(*this, "attention_forward", attention_flops(rows, heads));
  check_tensor("attention_forward", "qkv", qkv, DType::bf16, {t, heads.total_heads(), heads.head_dim});
  check_tensor("attention_forward", "out", out, DType::bf16, {t, heads.q_heads, heads.head_dim});
  check_tensor("attention_forward", "lse", lse, DType::f32, {heads.q_heads, t});
  workspace_restart();
  attention_->forward(out.data, ptr<float>(lse), qkv.data, shape, workspace_, ragged);
}

void CudaOps::attention_backward(Tensor d_qkv, Tensor d_out, Tensor out, Tensor lse, Tensor qkv,
                                 const RowSpans& rows, const HeadLayout& heads) {
  const int64_t t = rows.tokens();
  const RaggedSpans* ragged = nullptr;
  const AttentionShape shape = attention_shape(rows, heads, &ragged);
  // THD: the sequences in groups of calls, each within the workspace bound (ops/thd_groups.h).
  const std::vector<ThdCall>* calls = ragged ? &thd_backward_calls(rows, heads) : nullptr;
  if (calls)
    for (const ThdCall& call : *calls) attention_->prepare(call.shape);
  else
    attention_->prepare(shape);
  // Five matmuls of the forward's size against its two: 2.5 × its FLOPs (FlashAttention-2's
  // count, which recomputes the scores).
  OpTimer timer(*this, "attention_backward", 2.5 * attention_flops(rows, heads));
  check_tensor("attention_backward", "d_qkv", d_qkv, DType::bf16, {t, heads.total_heads(), heads.head_dim});
  check_tensor("attention_backward", "d_out", d_out, DType::bf16, {t, heads.q_heads, heads.head_dim});
  workspace_restart();
  if (!calls) {
    attention_->backward(d_qkv.data, d_out.data, out.data, ptr<float>(lse), qkv.data, shape, workspace_);
    return;
  }
  // Each call sees the window of its sequences: the tensors from its first token on.
  const auto qkv_token = static_cast<size_t>(heads.total_heads() * heads.head_dim) * 2;
  const auto out_token = static_cast<size_t>(heads.q_heads * heads.head_dim) * 2;
  for (const ThdCall& call : *calls) {
    const auto first = static_cast<size_t>(call.first_token);
    auto at = [first](const void* p, size_t token_bytes) {
      return static_cast<void*>(static_cast<uint8_t*>(const_cast<void*>(p)) + first * token_bytes);
    };
    workspace_restart();
    attention_->backward(at(d_qkv.data, qkv_token), at(d_out.data, out_token), at(out.data, out_token),
                         ptr<float>(lse) + first * static_cast<size_t>(heads.q_heads),
                         at(qkv.data, qkv_token), call.shape, workspace_, &call.ragged);
  }
}

const CudaOps::ContextTables& CudaOps::context_tables(const char* op, const ContextSpans& spans,
                                                      const HeadLayout& heads, int64_t t_all) {
  std::vector<int32_t> key = spans.key_begin;
  key.insert(key.end(), spans.key_end.begin(), spans.key_end.end());
  for (int64_t x : {t_all, heads.q_heads, heads.kv_heads, heads.head_dim})
    key.push_back(static_cast<int32_t>(x));
  if (key == context_key_) return context_;
  const auto t = static_cast<int64_t>(spans.key_begin.size());
  const int64_t nh = heads.total_heads(), nq = heads.q_heads, nkv = heads.kv_heads, hd = heads.head_dim;
  if (heads.head_dim % 8 != 0)
    throw_runtime_failure(op, "head_dim " + std::to_string(hd) + ", expected a multiple of 8 (cuDNN's SDPA)");
  LOOM_ASSERT(static_cast<double>(std::max(t, t_all)) * static_cast<double>(nh * hd) < 2147483647.0,
              "context attention's offsets past int32");
  // The pieces: a new one wherever a query's span starts elsewhere than the previous query's,
  // or its keys do not end one past the previous query's (ContextAttentionShape's bottom-right
  // causal run).
  struct Piece {
    int32_t q_begin, q_len, kv_begin, kv_len;
  };
  std::vector<Piece> pieces;
  for (int64_t i = 0; i < t; ++i) {
    const int32_t begin = spans.key_begin[static_cast<size_t>(i)],
                  end = spans.key_end[static_cast<size_t>(i)];
    if (!(0 <= begin && begin < end && end <= t_all))
      throw_runtime_failure(op, "query " + std::to_string(i) + "'s keys [" + std::to_string(begin) + ", " +
                                    std::to_string(end) +
                                    ") are not a non-empty range of the whole micro-batch's " +
                                    std::to_string(t_all) + " tokens");
    Piece* last = pieces.empty() ? nullptr : &pieces.back();
    if (last && last->kv_begin == begin && last->kv_begin + last->kv_len + 1 == end) {
      ++last->q_len;
      ++last->kv_len;
    } else {
      pieces.push_back({static_cast<int32_t>(i), 1, begin, end - begin});
    }
  }
  using op_workspace::power_of_two_at_least;
  const auto real = static_cast<int64_t>(pieces.size());
  int64_t longest_q = 0, longest_kv = 0, packed_kv = 0;
  for (const Piece& p : pieces) {
    longest_q = std::max<int64_t>(longest_q, p.q_len);
    longest_kv = std::max<int64_t>(longest_kv, p.kv_len);
    packed_kv += p.kv_len;
  }
  // Bucketed as attention_shape buckets THD (a run builds few graphs): isolated rows change
  // the pieces' keys from one micro-batch to the next. The key extent may then pass whole's
  // last token; only keys inside a piece's length are read unmasked.
  ContextAttentionShape& shape = context_.shape;
  shape = {power_of_two_at_least(real, op_workspace::kThdMinSequences),
           power_of_two_at_least(longest_q, op_workspace::kThdMinSequenceTokens),
           power_of_two_at_least(longest_kv, op_workspace::kThdMinSequenceTokens),
           nq,
           nkv,
           hd,
           t,
           power_of_two_at_least(std::max(t_all, packed_kv), op_workspace::kThdMinSequenceTokens)};
  const int64_t b = shape.pieces;
  // Each whole token's blocks in the packed K/V and dK/dV buffers, in piece order.
  std::vector<std::vector<int32_t>> covering(static_cast<size_t>(t_all));
  // [b] query and key counts, then [b + 1] offsets of qkv, out, lse, whole and the packed
  // buffer; pieces past the real ones are empty at the tensors' ends.
  std::vector<int32_t> host(static_cast<size_t>(7 * b + 5));
  int32_t* q_len = host.data();
  int32_t* kv_len = q_len + b;
  int32_t* q_offset = kv_len + b;
  int32_t* out_offset = q_offset + b + 1;
  int32_t* lse_offset = out_offset + b + 1;
  int32_t* kv_offset = lse_offset + b + 1;
  int32_t* dkv_offset = kv_offset + b + 1;
  int64_t packed = 0;
  for (int64_t p = 0; p <= b; ++p) {
    const bool present = p < real;
    const Piece piece = present ? pieces[static_cast<size_t>(p)]
                                : Piece{static_cast<int32_t>(t), 0, static_cast<int32_t>(t_all), 0};
    if (p < b) {
      q_len[p] = piece.q_len;
      kv_len[p] = piece.kv_len;
    }
    q_offset[p] = static_cast<int32_t>(piece.q_begin * nh * hd);
    out_offset[p] = static_cast<int32_t>(piece.q_begin * nq * hd);
    lse_offset[p] = static_cast<int32_t>(piece.q_begin * nq);
    kv_offset[p] = static_cast<int32_t>(piece.kv_begin * nh * hd);
    dkv_offset[p] = static_cast<int32_t>(packed * 2 * nkv * hd);
    for (int32_t k = 0; k < piece.kv_len; ++k)
      covering[static_cast<size_t>(piece.kv_begin + k)].push_back(static_cast<int32_t>(packed + k));
    packed += piece.kv_len;
  }
  int64_t width = 1;
  for (const auto& c : covering) width = std::max<int64_t>(width, static_cast<int64_t>(c.size()));
  // Then each packed key's whole token, then the cover.
  const auto arrays = static_cast<int64_t>(host.size());
  for (int64_t p = 0; p < real; ++p)
    for (int32_t k = 0; k < pieces[static_cast<size_t>(p)].kv_len; ++k)
      host.push_back(pieces[static_cast<size_t>(p)].kv_begin + k);
  const auto cover_at = static_cast<int64_t>(host.size());
  host.resize(static_cast<size_t>(cover_at + t_all * width), -1);
  for (int64_t j = 0; j < t_all; ++j)
    std::copy(covering[static_cast<size_t>(j)].begin(), covering[static_cast<size_t>(j)].end(),
              host.begin() + cover_at + j * width);

  const int32_t* d =
      upload_table(host, context_table_, context_capacity_, "context attention's pieces and cover");
  context_.pieces = {d, d + b, d + 2 * b, d + 3 * b + 1, d + 4 * b + 2, d + 5 * b + 3, d + 6 * b + 4};
  context_.source = d + arrays;
  context_.packed = packed;
  context_.cover = d + cover_at;
  context_.cover_width = width;
  context_key_ = std::move(key);
  return context_;
}

void CudaOps::attention_context_forward(Tensor out, Tensor lse, Tensor qkv, Tensor whole,
                                        const ContextSpans& spans, const HeadLayout& heads) {
  const int64_t t = qkv.shape[0], t_all = whole.shape[0], nh = heads.total_heads(), hd = heads.head_dim;
  const char* op = "attention_context_forward";
  check_tensor(op, "qkv", qkv, DType::bf16, {t, nh, hd});
  check_tensor(op, "whole", whole, DType::bf16, {t_all, nh, hd});
  check_tensor(op, "out", out, DType::bf16, {t, heads.q_heads, hd});
  check_tensor(op, "lse", lse, DType::f32, {heads.q_heads, t});
  if (static_cast<int64_t>(spans.key_begin.size()) != t || spans.key_end.size() != spans.key_begin.size())
    throw_runtime_failure(op, "context spans for " + std::to_string(spans.key_begin.size()) +
                                  " queries, expected " + std::to_string(t));
  const ContextTables& tables = context_tables(op, spans, heads, t_all);
  context_attention_->prepare(tables.shape);  // the one-time graph build stays outside the op's time
  OpTimer timer(*this, op, context_attention_flops(spans, heads));
  workspace_restart();
  context_attention_->forward(out.data, ptr<float>(lse), qkv.data, whole.data, tables.shape, tables.pieces,
                              workspace_);
}

void CudaOps::attention_context_backward(Tensor d_qkv, Tensor d_whole, Tensor d_out, Tensor out, Tensor lse,
                                         Tensor qkv, Tensor whole, const ContextSpans& spans,
                                         const HeadLayout& heads) {
  const int64_t t = qkv.shape[0], t_all = whole.shape[0], nh = heads.total_heads(), hd = heads.head_dim;
  const int64_t nq = heads.q_heads, nkv = heads.kv_heads;
  const char* op = "attention_context_backward";
  check_tensor(op, "qkv", qkv, DType::bf16, {t, nh, hd});
  check_tensor(op, "whole", whole, DType::bf16, {t_all, nh, hd});
  check_tensor(op, "d_qkv", d_qkv, DType::bf16, {t, nh, hd});
  check_tensor(op, "d_whole", d_whole, DType::bf16, {t_all, nh, hd});
  check_tensor(op, "out", out, DType::bf16, {t, nq, hd});
  check_tensor(op, "d_out", d_out, DType::bf16, {t, nq, hd});
  check_tensor(op, "lse", lse, DType::f32, {nq, t});
  if (static_cast<int64_t>(spans.key_begin.size()) != t || spans.key_end.size() != spans.key_begin.size())
    throw_runtime_failure(op, "context spans for " + std::to_string(spans.key_begin.size()) +
                                  " queries, expected " + std::to_string(t));
  const ContextTables& tables = context_tables(op, spans, heads, t_all);
  context_attention_->prepare(tables.shape);
  OpTimer timer(*this, op, 2.5 * context_attention_flops(spans, heads));  // as attention_backward
  workspace_restart();
  const int64_t block = 2 * nkv * hd;  // a key's dK and dV in the pieces' buffer
  auto* kv_pieces = static_cast<bf16_t*>(
      workspace_.allocate_bytes(tables.shape.kv_total * block * 2, "context attention's K and V by piece"));
  auto* d_kv_pieces = static_cast<bf16_t*>(
      workspace_.allocate_bytes(tables.shape.kv_total * block * 2, "context attention's dK and dV by piece"));
  cuda::context_kv_gather(kv_pieces, ptr<bf16_t>(whole), tables.source, tables.packed, nq, nkv, hd, stream_);
  // d_qkv's k and v heads are 0 (ops.h): the keys' gradients travel in d_whole.
  const size_t row_bytes = static_cast<size_t>(nh * hd) * 2, q_bytes = static_cast<size_t>(nq * hd) * 2;
  LOOM_CUDA_CHECK(cudaMemset2DAsync(static_cast<uint8_t*>(d_qkv.data) + q_bytes, row_bytes, 0,
                                    static_cast<size_t>(block) * 2, static_cast<size_t>(t), stream_));
  context_attention_->backward(d_qkv.data, d_kv_pieces, d_out.data, out.data, ptr<float>(lse), qkv.data,
                               kv_pieces, tables.shape, tables.pieces, workspace_);
  cuda::context_kv_sum(ptr<bf16_t>(d_whole), d_kv_pieces, tables.cover, tables.cover_width, t_all, nq, nkv,
                       hd, stream_);
}

void CudaOps::swiglu_forward(Tensor out, Tensor gate_up, Tensor out_amax) {
  const int64_t t = gate_up.shape[0], f = gate_up.shape[1] / 2;
  OpTimer timer(*this, "swiglu_forward", 0, 6.0 * static_cast<double>(t * f));
  check_tensor("swiglu_forward", "out", out, DType::bf16, {t, f});
  check_tensor("swiglu_forward", "gate_up", gate_up, DType::bf16, {t, 2 * f});
  if (out_amax.data) check_tensor("swiglu_forward", "out_amax", out_amax, DType::f32, {1});
  cuda::swiglu_forward(ptr<bf16_t>(out), ptr<float>(out_amax), ptr<bf16_t>(gate_up), t, f, stream_);
}

void CudaOps::swiglu_backward(Tensor d_gate_up, Tensor d_out, Tensor gate_up, Tensor out_amax) {
  const int64_t t = gate_up.shape[0], f = gate_up.shape[1] / 2;
  OpTimer timer(*this, "swiglu_backward", 0, 10.0 * static_cast<double>(t * f));
  check_tensor("swiglu_backward", "d_gate_up", d_gate_up, DType::bf16, {t, 2 * f});
  check_tensor("swiglu_backward", "d_out", d_out, DType::bf16, {t, f});
  if (out_amax.data) check_tensor("swiglu_backward", "out_amax", out_amax, DType::f32, {1});
  cuda::swiglu_backward(ptr<bf16_t>(d_gate_up), ptr<float>(out_amax), ptr<bf16_t>(d_out),
                        ptr<bf16_t>(gate_up), t, f, stream_);
}

template <typename Loss>
void CudaOps::lm_head_chunks(Tensor hidden, Tensor weight, Tensor d_hidden, Tensor d_weight, bool backward,
                             Loss loss) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1], v = weight.shape[0];
  workspace_restart();
  const int64_t chunk = op_workspace::lm_head_chunk_rows(t, loss_chunk_tokens_);
  bf16_t* logits = static_cast<bf16_t*>(workspace_.allocate_bytes(chunk * v * 2, "lm_head logits chunk"));
  for (int64_t begin = 0; begin < t; begin += chunk) {
    const int64_t rows = std::min(chunk, t - begin);
    const bf16_t* x = ptr<bf16_t>(hidden) + begin * h;
    gemm_->run({rows, v, h, false, true, DType::bf16, false}, x, weight.data, logits);
    loss(logits, begin, rows);
    if (!backward) continue;
    gemm_->run({rows, h, v, false, false, DType::bf16, false}, logits, weight.data,
               ptr<bf16_t>(d_hidden) + begin * h);
    if (d_weight.data) gemm_->run({v, h, rows, true, false, DType::f32, true}, logits, x, d_weight.data);
  }
}

void CudaOps::lm_head_loss(Tensor nll, Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                           Tensor targets, float grad_scale) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1], v = weight.shape[0];
  const bool backward = d_hidden.data != nullptr;
  const double gemms = 1.0 + (backward ? 1.0 : 0.0) + (backward && d_weight.data ? 1.0 : 0.0);
  OpTimer timer(*this, "lm_head_loss", 2.0 * gemms * static_cast<double>(t * v * h));
  check_lm_head("lm_head_loss", hidden, weight, targets);
  check_tensor("lm_head_loss", "nll", nll, DType::f32, {t});
  if (backward) check_lm_head_grads("lm_head_loss", d_hidden, d_weight, hidden, weight);
  lm_head_chunks(hidden, weight, d_hidden, d_weight, backward,
                 [&](bf16_t* logits, int64_t begin, int64_t rows) {
                   cuda::softmax_xent_inplace(logits, ptr<float>(nll) + begin, ptr<int32_t>(targets) + begin,
                                              rows, v, grad_scale, backward, stream_);
                 });
}

void CudaOps::lm_head_shard_forward(Tensor lse, Tensor target_logit, Tensor hidden, Tensor weight,
                                    Tensor targets, int64_t vocab_begin) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1], v = weight.shape[0];
  OpTimer timer(*this, "lm_head_shard_forward", 2.0 * static_cast<double>(t * v * h));
  check_lm_head("lm_head_shard_forward", hidden, weight, targets);
  check_tensor("lm_head_shard_forward", "lse", lse, DType::f32, {t});
  check_tensor("lm_head_shard_forward", "target_logit", target_logit, DType::f32, {t});
  lm_head_chunks(hidden, weight, Tensor{}, Tensor{}, false, [&](bf16_t* logits, int64_t begin, int64_t rows) {
    cuda::shard_logsumexp(ptr<float>(lse) + begin, ptr<float>(target_logit) + begin, logits,
                          ptr<int32_t>(targets) + begin, rows, v, vocab_begin, stream_);
  });
}

void CudaOps::lm_head_shard_backward(Tensor d_hidden, Tensor d_weight, Tensor hidden, Tensor weight,
                                     Tensor targets, Tensor lse, int64_t vocab_begin, float grad_scale) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1], v = weight.shape[0];
  // The logits recomputed, d_hidden and d_weight: three GEMMs of the forward's size.
  OpTimer timer(*this, "lm_head_shard_backward",
                (d_weight.data ? 6.0 : 4.0) * static_cast<double>(t * v * h));
  check_lm_head("lm_head_shard_backward", hidden, weight, targets);
  check_tensor("lm_head_shard_backward", "lse", lse, DType::f32, {t});
  check_lm_head_grads("lm_head_shard_backward", d_hidden, d_weight, hidden, weight);
  lm_head_chunks(hidden, weight, d_hidden, d_weight, true, [&](bf16_t* logits, int64_t begin, int64_t rows) {
    cuda::shard_xent_grad_inplace(logits, ptr<float>(lse) + begin, ptr<int32_t>(targets) + begin, rows, v,
                                  vocab_begin, grad_scale, stream_);
  });
}

void CudaOps::lm_head_shard_combine(Tensor nll, Tensor lse, Tensor lse_parts, Tensor target_logit,
                                    Tensor targets) {
  const int64_t t = targets.numel(), parts = lse_parts.shape[0];
  // Read: the parts, the target logit and the targets; written: lse and nll (4 bytes each).
  OpTimer timer(*this, "lm_head_shard_combine", 0, 4.0 * static_cast<double>((parts + 4) * t));
  check_tensor("lm_head_shard_combine", "targets", targets, DType::i32, {t});
  check_tensor("lm_head_shard_combine", "lse_parts", lse_parts, DType::f32, {parts, t});
  check_tensor("lm_head_shard_combine", "target_logit", target_logit, DType::f32, {t});
  check_tensor("lm_head_shard_combine", "lse", lse, DType::f32, {t});
  check_tensor("lm_head_shard_combine", "nll", nll, DType::f32, {t});
  cuda::shard_combine(ptr<float>(nll), ptr<float>(lse), ptr<float>(lse_parts), ptr<float>(target_logit),
                      ptr<int32_t>(targets), parts, t, stream_);
}

void CudaOps::add(Tensor out, Tensor a, Tensor b) {
  const int64_t n = a.numel();
  OpTimer timer(*this, "add", 0, 6.0 * static_cast<double>(n));
  // Any shape: a stage's output and the residual it is added to may be viewed differently.
  const auto check = [n](const char* name, const Tensor& x) {
    if (x.dtype != DType::bf16 || x.numel() != n || x.device != Device::cuda)
      throw_runtime_failure("add", std::string(name) + " is not a CUDA bf16 tensor of " + std::to_string(n) +
                                       " values (a's size): " + dtype_name(x.dtype) + " " + x.shape.str());
  };
  check("out", out);
  check("a", a);
  check("b", b);
  cuda::add(ptr<bf16_t>(out), ptr<bf16_t>(a), ptr<bf16_t>(b), n, stream_);
}

void CudaOps::lora_dropout(Tensor out, Tensor x, const LoraDropoutMask& mask, bool accumulate) {
  lora_dropout_check(out, x, mask, DType::bf16);
  const int64_t n = x.numel();
  OpTimer timer(*this, "lora_dropout", 0, (accumulate ? 6.0 : 4.0) * static_cast<double>(n));
  cuda::lora_dropout(ptr<bf16_t>(out), ptr<bf16_t>(x), ptr<int32_t>(mask.tokens), mask.stream, mask.threshold,
                     mask.scale, mask.feature_begin, x.shape[0], x.shape[1], accumulate, stream_);
}

void CudaOps::fill_zero(Tensor x) {
  OpTimer timer(*this, "fill_zero");
  LOOM_CUDA_CHECK(cudaMemsetAsync(x.data, 0, x.nbytes(), stream_));
}

void CudaOps::gather_rows(Tensor out, Tensor x, Tensor index) {
  const int64_t n = index.numel(), h = x.shape[1];
  OpTimer timer(*this, "gather_rows", 0, 4.0 * static_cast<double>(n * h));
  check_tensor("gather_rows", "index", index, DType::i32, {n});
  check_tensor("gather_rows", "x", x, DType::bf16, {-1, h});
  check_tensor("gather_rows", "out", out, DType::bf16, {n, h});
  cuda::gather_rows(ptr<bf16_t>(out), ptr<bf16_t>(x), ptr<int32_t>(index), n, h, stream_);
}

void CudaOps::scatter_rows(Tensor out, Tensor x, Tensor index) {
  const int64_t n = index.numel(), h = out.shape[1];
  OpTimer timer(*this, "scatter_rows", 0, 4.0 * static_cast<double>(n * h));
  check_tensor("scatter_rows", "index", index, DType::i32, {n});
  check_tensor("scatter_rows", "out", out, DType::bf16, {-1, h});
  check_tensor("scatter_rows", "x", x, DType::bf16, {-1, h});
  LOOM_ASSERT(x.shape[0] >= n, "scatter_rows: fewer rows than positions");
  cuda::scatter_rows(ptr<bf16_t>(out), ptr<bf16_t>(x), ptr<int32_t>(index), n, h, stream_);
}

void CudaOps::fp8_census(Tensor counts, Tensor amax, Tensor x, Tensor q, Tensor scale_inv,
                         std::optional<Fp8Blocks> blocks) {
  const int64_t r = x.shape[0], c = x.shape[1];
  OpTimer timer(*this, "fp8 census", 0, 3.0 * static_cast<double>(r * c));
  check_tensor("fp8_census", "counts", counts, DType::i64, {2});
  check_tensor("fp8_census", "amax", amax, DType::f32, {1});
  check_tensor("fp8_census", "x", x, DType::bf16, {r, c});
  check_fp8_format("fp8_census", q.dtype);
  check_tensor("fp8_census", "q", q, q.dtype, {r, c});
  if (blocks)
    check_block_scales("fp8_census", "scale_inv", scale_inv, *blocks, r, c);
  else
    check_tensor("fp8_census", "scale_inv", scale_inv, DType::f32, {1});
  if (c % 8 != 0)
    throw_runtime_failure("fp8_census", "x " + x.shape.str() + ": its columns must be a multiple of 8");
  const int layout = !blocks ? 0 : *blocks == Fp8Blocks::vec128 ? 1 : 2;
  cuda::fp8_census(ptr<int64_t>(counts), ptr<float>(amax), ptr<bf16_t>(x),
                   static_cast<const uint8_t*>(q.data), ptr<float>(scale_inv), layout, scale_inv.shape[1], r,
                   c, q.dtype == DType::e5m2, stream_);
}

void CudaOps::copy_to_host(void* out, Tensor x) {
  check_device("copy_to_host", "x", x);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(out, x.data, x.nbytes(), cudaMemcpyDeviceToHost, stream_));
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaOps::copy_from_host(Tensor x, const void* in) {
  check_device("copy_from_host", "x", x);
  // Pageable host memory: the copy is staged before the call returns, so `in` may be reused.
  LOOM_CUDA_CHECK(cudaMemcpyAsync(x.data, in, x.nbytes(), cudaMemcpyHostToDevice, stream_));
}

namespace {

// The permute and combine ops' rows: positions i32[T, k] and the sorted rows [≥ T·k, H].
void check_moe_rows(const char* op, const char* sorted_name, const Tensor& tokens, const Tensor& sorted,
                    const Tensor& positions) {
  const int64_t t = tokens.shape[0], h = tokens.shape[1], k = positions.shape[1];
  check_tensor(op, "positions", positions, DType::i32, {t, k});
  check_tensor(op, sorted_name, sorted, DType::bf16, {-1, h});
  if (sorted.shape[0] < t * k)
    throw_runtime_failure(op, std::string(sorted_name) + " " + sorted.shape.str() + " has fewer rows than " +
                                  "tokens × k = " + std::to_string(t * k));
  check_device(op, "positions", positions);
}

// The router's shapes the CUDA kernels take (kernels.h): E ≤ 512 experts, top-k ≤ 32.
void check_route_sizes(const char* op, int64_t experts, int64_t k) {
  if (experts < 1 || experts > cuda::kMoeMaxExperts || k < 1 || k > cuda::kMoeMaxTopK || k > experts)
    throw_runtime_failure(op, "experts " + std::to_string(experts) + ", top-k " + std::to_string(k) +
                                  ": the CUDA router takes 1 to 512 experts and a top-k of 1 to 32");
}

}  // namespace

void CudaOps::moe_route_forward(Tensor expert_ids, Tensor weights, Tensor probs, Tensor logits,
                                bool normalize) {
  const int64_t t = logits.shape[0], e = logits.shape[1], k = expert_ids.shape[1];
  // Read: the bf16 logits; written: fp32 probs, the ids and weights.
  OpTimer timer(*this, "moe_route_forward", 0, static_cast<double>(t * (6 * e + 8 * k)));
  check_tensor("moe_route_forward", "logits", logits, DType::bf16, {t, e});
  check_tensor("moe_route_forward", "probs", probs, DType::f32, {t, e});
  check_tensor("moe_route_forward", "expert_ids", expert_ids, DType::i32, {t, k});
  check_tensor("moe_route_forward", "weights", weights, DType::f32, {t, k});
  check_device("moe_route_forward", "logits", logits);
  check_route_sizes("moe_route_forward", e, k);
  cuda::moe_route_forward(ptr<int32_t>(expert_ids), ptr<float>(weights), ptr<float>(probs),
                          ptr<bf16_t>(logits), t, e, k, normalize, stream_);
}

void CudaOps::moe_route_backward(Tensor d_logits, Tensor d_weights, Tensor d_probs_per_expert, Tensor probs,
                                 Tensor expert_ids, Tensor weights, bool normalize) {
  const int64_t t = probs.shape[0], e = probs.shape[1], k = expert_ids.shape[1];
  // Read: fp32 probs, the ids, weights and their gradient; written: the bf16 d_logits.
  OpTimer timer(*this, "moe_route_backward", 0, static_cast<double>(t * (6 * e + 12 * k)));
  check_tensor("moe_route_backward", "d_logits", d_logits, DType::bf16, {t, e});
  check_tensor("moe_route_backward", "d_weights", d_weights, DType::f32, {t, k});
  check_tensor("moe_route_backward", "probs", probs, DType::f32, {t, e});
  check_tensor("moe_route_backward", "expert_ids", expert_ids, DType::i32, {t, k});
  check_tensor("moe_route_backward", "weights", weights, DType::f32, {t, k});
  if (d_probs_per_expert.data)
    check_tensor("moe_route_backward", "d_probs_per_expert", d_probs_per_expert, DType::f32, {e});
  check_device("moe_route_backward", "probs", probs);
  check_route_sizes("moe_route_backward", e, k);
  cuda::moe_route_backward(ptr<bf16_t>(d_logits), ptr<float>(d_weights), ptr<float>(d_probs_per_expert),
                           ptr<float>(probs), ptr<int32_t>(expert_ids), ptr<float>(weights), t, e, k,
                           normalize, stream_);
}

void CudaOps::moe_sort(Tensor positions, Tensor offsets, Tensor expert_ids) {
  const int64_t t = expert_ids.shape[0], k = expert_ids.shape[1], e = offsets.numel() - 1;
  // The ids read twice (a count pass, a place pass), the positions written.
  OpTimer timer(*this, "moe_sort", 0, 12.0 * static_cast<double>(t * k));
  check_tensor("moe_sort", "expert_ids", expert_ids, DType::i32, {t, k});
  check_tensor("moe_sort", "positions", positions, DType::i32, {t, k});
  check_tensor("moe_sort", "offsets", offsets, DType::i32, {e + 1});
  check_device("moe_sort", "expert_ids", expert_ids);
  if (e < 1 || e > cuda::kMoeSortMaxExperts)
    throw_runtime_failure("moe_sort", "offsets " + offsets.shape.str() + ": the CUDA sort takes 1 to " +
                                          std::to_string(cuda::kMoeSortMaxExperts) + " experts");
  workspace_restart();
  cuda::moe_sort(ptr<int32_t>(positions), ptr<int32_t>(offsets), ptr<int32_t>(expert_ids), t * k, e,
                 scratch(workspace_, cuda::moe_sort_scratch_bytes(t * k, e), "moe_sort counts"), stream_);
}

void CudaOps::moe_permute(Tensor sorted, Tensor x, Tensor positions) {
  const int64_t t = x.shape[0], h = x.shape[1], k = positions.shape[1];
  OpTimer timer(*this, "moe_permute", 0, 2.0 * static_cast<double>((t + t * k) * h));
  check_tensor("moe_permute", "x", x, DType::bf16, {t, h});
  check_moe_rows("moe_permute", "sorted", x, sorted, positions);
  cuda::moe_permute(ptr<bf16_t>(sorted), ptr<bf16_t>(x), ptr<int32_t>(positions), t, k, h, stream_);
}

void CudaOps::moe_permute_backward(Tensor d_x, Tensor d_sorted, Tensor positions, bool accumulate) {
  const int64_t t = d_x.shape[0], h = d_x.shape[1], k = positions.shape[1];
  OpTimer timer(*this, "moe_permute_backward", 0,
                2.0 * static_cast<double>((t * k + (accumulate ? 2 : 1) * t) * h));
  check_tensor("moe_permute_backward", "d_x", d_x, DType::bf16, {t, h});
  check_moe_rows("moe_permute_backward", "d_sorted", d_x, d_sorted, positions);
  cuda::moe_permute_backward(ptr<bf16_t>(d_x), ptr<bf16_t>(d_sorted), ptr<int32_t>(positions), t, k, h,
                             accumulate, stream_);
}

void CudaOps::moe_combine_forward(Tensor out, Tensor y, Tensor positions, Tensor weights) {
  const int64_t t = out.shape[0], h = out.shape[1], k = positions.shape[1];
  OpTimer timer(*this, "moe_combine_forward", 0, 2.0 * static_cast<double>((t * k + t) * h));
  check_tensor("moe_combine_forward", "out", out, DType::bf16, {t, h});
  check_moe_rows("moe_combine_forward", "y", out, y, positions);
  check_tensor("moe_combine_forward", "weights", weights, DType::f32, {t, k});
  cuda::moe_combine_forward(ptr<bf16_t>(out), ptr<bf16_t>(y), ptr<int32_t>(positions), ptr<float>(weights), t,
                            k, h, stream_);
}

void CudaOps::moe_combine_backward(Tensor d_y, Tensor d_weights, Tensor d_out, Tensor y, Tensor positions,
                                   Tensor weights) {
  const int64_t t = d_out.shape[0], h = d_out.shape[1], k = positions.shape[1];
  // Read: y's rows and d_out (from cache after its first slot); written: d_y's rows.
  OpTimer timer(*this, "moe_combine_backward", 0, 2.0 * static_cast<double>((2 * t * k + t) * h));
  check_tensor("moe_combine_backward", "d_out", d_out, DType::bf16, {t, h});
  check_moe_rows("moe_combine_backward", "y", d_out, y, positions);
  check_moe_rows("moe_combine_backward", "d_y", d_out, d_y, positions);
  check_tensor("moe_combine_backward", "weights", weights, DType::f32, {t, k});
  check_tensor("moe_combine_backward", "d_weights", d_weights, DType::f32, {t, k});
  cuda::moe_combine_backward(ptr<bf16_t>(d_y), ptr<float>(d_weights), ptr<bf16_t>(d_out), ptr<bf16_t>(y),
                             ptr<int32_t>(positions), ptr<float>(weights), t, k, h, stream_);
}

// The experts' GEMMs: CUTLASS's SM90 grouped kernel (grouped_gemm.h), deterministic (each
// output tile is one thread block's fixed-order sum: no split-K, no stream-K, no atomics).
// It takes n and k in multiples of 8 (op_workspace::grouped_gemm_takes; every Qwen3 MoE's
// experts do); other shapes run grouped_linear.cu's tiled CUDA-core kernels, deterministic
// too, a tenth of the speed. The workspace holds CUTLASS's per-expert arguments, written on
// the device from the offsets, so nothing waits on the host; its size is
// op_workspace::grouped_linear_bytes at this GPU's multiprocessor count, what the plan asks.
void CudaOps::grouped_linear_forward(Tensor out, Tensor x, Tensor weight, Tensor offsets) {
  const int64_t r = x.shape[0], e = weight.shape[0], n = weight.shape[1], k = weight.shape[2];
  // Every row is some expert's (the dispatch's rows: offsets[E] = R), as the plan counts them.
  OpTimer timer(*this, "grouped_linear_forward", 2.0 * static_cast<double>(r * n * k));
  check_tensor("grouped_linear_forward", "weight", weight, DType::bf16, {e, n, k});
  check_tensor("grouped_linear_forward", "x", x, DType::bf16, {r, k});
  check_tensor("grouped_linear_forward", "out", out, DType::bf16, {r, n});
  check_tensor("grouped_linear_forward", "offsets", offsets, DType::i32, {e + 1});
  check_device("grouped_linear_forward", "offsets", offsets);
  if (!op_workspace::grouped_gemm_takes(n, k)) {
    cuda::grouped_linear_forward(ptr<bf16_t>(out), ptr<bf16_t>(x), ptr<bf16_t>(weight), ptr<int32_t>(offsets),
                                 e, r, n, k, stream_);
    return;
  }
  workspace_restart();
  void* workspace = workspace_.allocate_bytes(static_cast<int64_t>(GroupedGemmRunner::workspace_bytes(e)),
                                              "grouped GEMM arguments");
  grouped_gemm_->forward({e, r, n, k}, ptr<int32_t>(offsets), x.data, weight.data, out.data, workspace);
}

void CudaOps::grouped_linear_backward(Tensor d_x, Tensor d_weight, Tensor d_out, Tensor x, Tensor weight,
                                      Tensor offsets) {
  const int64_t r = d_out.shape[0], e = weight.shape[0], n = weight.shape[1], k = weight.shape[2];
  const double gemms = (d_x.data ? 1.0 : 0.0) + (d_weight.data ? 1.0 : 0.0);
  OpTimer timer(*this, "grouped_linear_backward", gemms * 2.0 * static_cast<double>(r * n * k));
  check_tensor("grouped_linear_backward", "weight", weight, DType::bf16, {e, n, k});
  check_tensor("grouped_linear_backward", "d_out", d_out, DType::bf16, {r, n});
  check_tensor("grouped_linear_backward", "offsets", offsets, DType::i32, {e + 1});
  check_device("grouped_linear_backward", "offsets", offsets);
  if (d_x.data) check_tensor("grouped_linear_backward", "d_x", d_x, DType::bf16, {r, k});
  if (d_weight.data) {
    check_tensor("grouped_linear_backward", "d_weight", d_weight, DType::f32, {e, n, k});
    check_tensor("grouped_linear_backward", "x", x, DType::bf16, {r, k});
  }
  if (!op_workspace::grouped_gemm_takes(n, k)) {
    if (d_x.data)
      cuda::grouped_linear_backward_input(ptr<bf16_t>(d_x), ptr<bf16_t>(d_out), ptr<bf16_t>(weight),
                                          ptr<int32_t>(offsets), e, r, n, k, stream_);
    if (d_weight.data)
      cuda::grouped_linear_backward_weight(ptr<float>(d_weight), ptr<bf16_t>(d_out), ptr<bf16_t>(x),
                                           ptr<int32_t>(offsets), e, r, n, k, stream_);
    return;
  }
  // One workspace for both GEMMs: they run in turn on the stream, each setup kernel
  // rewriting the arguments after the previous GEMM has read them.
  workspace_restart();
  void* workspace = workspace_.allocate_bytes(static_cast<int64_t>(GroupedGemmRunner::workspace_bytes(e)),
                                              "grouped GEMM arguments");
  const GroupedGemmShape shape{e, r, n, k};
  if (d_x.data)
    grouped_gemm_->backward_input(shape, ptr<int32_t>(offsets), d_out.data, weight.data, d_x.data, workspace);
  if (d_weight.data)
    grouped_gemm_->backward_weight(shape, ptr<int32_t>(offsets), d_out.data, x.data, ptr<float>(d_weight),
                                   workspace);
}

void CudaOps::column_sum(Tensor out, Tensor x) {
  const int64_t r = x.shape[0], c = x.shape[1];
  OpTimer timer(*this, "column_sum", 0, 4.0 * static_cast<double>(r * c + c));
  check_tensor("column_sum", "x", x, DType::f32, {r, c});
  check_tensor("column_sum", "out", out, DType::f32, {c});
  check_device("column_sum", "x", x);
  workspace_restart();
  cuda::column_sum(ptr<float>(out), ptr<float>(x), r, c,
                   scratch(workspace_, cuda::column_sum_scratch_bytes(r, c), "column_sum partials"), stream_);
}

double CudaOps::sum(Tensor x) {
  OpTimer timer(*this, "sum");
  check_tensor("sum", "x", x, DType::f32, {x.numel()});
  return reduce_to_host(ptr<float>(x), x.numel(), false);
}

double CudaOps::sum_squares(const float* x, int64_t n) {
  OpTimer timer(*this, "sum_squares");
  return reduce_to_host(x, n, true);
}

double CudaOps::scale_sum_squares(float* x, int64_t n, float scale) {
  OpTimer timer(*this, "scale_sum_squares");
  workspace_restart();
  cuda::scale_reduce_sum_squares(reduce_result_, x, n, scale,
                                 scratch(workspace_, cuda::reduce_scratch_bytes(), "reduction partials"),
                                 stream_);
  return result_to_host();
}

std::vector<int64_t> CudaOps::count_nonfinite(const float* x, const std::vector<cuda::CountRange>& ranges,
                                              int slots) {
  OpTimer timer(*this, "count_nonfinite");
  std::vector<int64_t> out(static_cast<size_t>(slots));
  if (ranges.empty() || slots == 0) return out;
  int64_t max_numel = 0;
  for (const cuda::CountRange& r : ranges) {
    LOOM_ASSERT(r.slot >= 0 && r.slot < slots, "count_nonfinite: a range's slot is out of bounds");
    max_numel = std::max(max_numel, r.numel);
  }
  workspace_restart();
  const int64_t ranges_bytes = static_cast<int64_t>(ranges.size() * sizeof(cuda::CountRange));
  auto* device_ranges =
      static_cast<cuda::CountRange*>(workspace_.allocate_bytes(ranges_bytes, "non-finite count ranges"));
  auto* counts = static_cast<unsigned long long*>(workspace_.allocate_bytes(slots * 8, "non-finite counts"));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(device_ranges, ranges.data(), static_cast<size_t>(ranges_bytes),
                                  cudaMemcpyHostToDevice, stream_));
  LOOM_CUDA_CHECK(cudaMemsetAsync(counts, 0, static_cast<size_t>(slots) * 8, stream_));
  cuda::count_nonfinite(counts, x, device_ranges, static_cast<int>(ranges.size()), max_numel, stream_);
  std::vector<unsigned long long> host(out.size());
  LOOM_CUDA_CHECK(cudaMemcpyAsync(host.data(), counts, host.size() * 8, cudaMemcpyDeviceToHost, stream_));
  stream_wait();
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(host[i]);
  return out;
}

double CudaOps::reduce_to_host(const float* x, int64_t n, bool square) {
  workspace_restart();
  cuda::reduce_sum(reduce_result_, x, n, square,
                   scratch(workspace_, cuda::reduce_scratch_bytes(), "reduction partials"), stream_);
  return result_to_host();
}

double CudaOps::result_to_host() {
  double result = 0;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(&result, reduce_result_, sizeof result, cudaMemcpyDeviceToHost, stream_));
  stream_wait();
  return result;
}

}  // namespace loom
