#include "ops/cuda/gemm.h"

#include <cstdio>
#include <string>

#include "core/env.h"
#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"

namespace loom {

GemmRunner::GemmRunner(cudaStream_t stream)
    : stream_(stream), tune_(!env_is("LOOM_GEMM_AUTOTUNE", "0")), report_(env_is("LOOM_OP_PROFILE", "1")) {
  LOOM_CUBLAS_CHECK(cublasLtCreate(&handle_));
  LOOM_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
  LOOM_CUDA_CHECK(cudaMalloc(&fingerprint_, sizeof *fingerprint_));
}

GemmRunner::~GemmRunner() {
  for (auto& [shape, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  cudaFree(workspace_);
  cudaFree(fingerprint_);
  cublasLtDestroy(handle_);
}

// cuBLASLt is column-major. A row-major [r, c] matrix is a column-major [c, r] one, so the
// row-major out = op(a)·op(b) is computed as the column-major outᵀ = op(b)ᵀ·op(a)ᵀ: cuBLAS's
// "A" is our b and its "B" is our a, with the same transpose flags.
GemmRunner::Plan& GemmRunner::plan(const GemmShape& s, const float* a_scale_inv, const float* b_scale_inv,
                                   const void* bias) {
  auto found = plans_.find(s);
  if (found != plans_.end()) return found->second;
  Plan p;
  const cudaDataType_t out_type = s.out_dtype == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  const auto input_type = [](DType d) {
    return d == DType::e4m3 ? CUDA_R_8F_E4M3 : d == DType::e5m2 ? CUDA_R_8F_E5M2 : CUDA_R_16BF;
  };
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (s.fast_accumulation) {
    const int8_t fast = 1;
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  }
  const auto scale_mode = [](GemmScales scales) -> int32_t {
    switch (scales) {
      case GemmScales::vec128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
      case GemmScales::block128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
      case GemmScales::tensor: break;
    }
    return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  };
  if (s.a_scales != GemmScales::tensor || s.b_scales != GemmScales::tensor) {
    // cuBLAS's A is our b (above).
    const int32_t mode_a = scale_mode(s.b_scales), mode_b = scale_mode(s.a_scales);
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a));
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b));
  }
  // The scale pointers before the heuristic: it offers no algorithm for block scales without
  // them (run() sets each call's).
  set_scale_pointers(p, a_scale_inv, b_scale_inv);
  if (s.bias) {
    // cuBLAS's D is column-major [n, m]: a bias of n values is added down each column, i.e.
    // to each of our rows. run() sets each call's pointer.
    LOOM_ASSERT(!s.accumulate && s.out_dtype == DType::bf16, "a GEMM's bias epilogue needs a bf16 out");
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const cudaDataType_t bias_type = CUDA_R_16BF;
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                     sizeof bias_type));
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  const cublasOperation_t op_b = s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b));
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a));
  // cuBLAS "A" = our b: stored row-major [k, n] (or [n, k] transposed) = column-major
  // [n, k] (or [k, n]).
  const uint64_t b_rows = static_cast<uint64_t>(s.transpose_b ? s.k : s.n);
  const uint64_t b_cols = static_cast<uint64_t>(s.transpose_b ? s.n : s.k);
  const uint64_t a_rows = static_cast<uint64_t>(s.transpose_a ? s.m : s.k);
  const uint64_t a_cols = static_cast<uint64_t>(s.transpose_a ? s.k : s.m);
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, input_type(s.b_dtype), b_rows, b_cols,
                                               s.ldb ? s.ldb : static_cast<int64_t>(b_rows)));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, input_type(s.a_dtype), a_rows, a_cols,
                                               s.lda ? s.lda : static_cast<int64_t>(a_rows)));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_type, static_cast<uint64_t>(s.n),
                                               static_cast<uint64_t>(s.m), s.ldc ? s.ldc : s.n));
  cublasLtMatmulPreference_t pref = nullptr;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes_, sizeof workspace_bytes_));
  if (s.strided()) {
    // cuBLASLt assumes 256-byte aligned pointers unless told; a window's start is only
    // 16-byte aligned (run() checks it).
    const uint32_t alignment = kStridedAlignment;
    for (const auto attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &alignment, sizeof alignment));
  }
  cublasLtMatmulHeuristicResult_t results[kTuneCandidates]{};
  int found_count = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_, p.op, p.a, p.b, p.c, p.c, pref, tune_ ? kTuneCandidates : 1, results, &found_count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found_count == 0)
    throw_runtime_failure("cuBLASLt", "no GEMM algorithm for m=" + std::to_string(s.m) +
                                          " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
  p.algo = results[0].algo;
  for (int i = 0; i < found_count; ++i) p.candidates.push_back(results[i].algo);
  return plans_.emplace(s, p).first->second;
}

// Free memory an accumulating GEMM's tuning leaves beside its scratch output; short of it,
// the shape keeps the heuristic's first choice.
constexpr size_t kTuneHeadroom = size_t{1} << 30;

// Runs the candidates on the call's inputs: a non-accumulating GEMM into its own output,
// which the call then overwrites; an accumulating one (the fp32 main grads) into a scratch
// output zeroed before each, so the grads are added to once. Candidates whose output's
// fingerprint is not the heuristic first's are dropped, then the fastest of the rest is kept.
void GemmRunner::tune(const GemmShape& shape, Plan& p, const void* a, const void* b, void* out, float alpha) {
  const size_t out_bytes = static_cast<size_t>(shape.m * shape.n) * (shape.out_dtype == DType::f32 ? 4 : 2);
  void* target = out;
  void* scratch = nullptr;
  if (shape.accumulate) {
    size_t free_bytes = 0, total_bytes = 0;
    LOOM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (free_bytes < out_bytes + kTuneHeadroom) return;
    LOOM_CUDA_CHECK(cudaMalloc(&scratch, out_bytes));
    target = scratch;
  }
  const float beta = shape.accumulate ? 1.0f : 0.0f;
  const auto launch = [&](size_t i) {
    return cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, target, p.c, target, p.c,
                          &p.candidates[i], workspace_, workspace_bytes_, stream_);
  };
  const auto output_fingerprint = [&](size_t i, unsigned long long* value) {
    if (shape.accumulate) LOOM_CUDA_CHECK(cudaMemsetAsync(target, 0, out_bytes, stream_));
    if (launch(i) != CUBLAS_STATUS_SUCCESS) return false;
    cuda::fingerprint(fingerprint_, target, static_cast<int64_t>(out_bytes), stream_);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(value, fingerprint_, sizeof *value, cudaMemcpyDeviceToHost, stream_));
    LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return true;
  };
  unsigned long long first = 0;
  if (!output_fingerprint(0, &first))
    throw_runtime_failure("cuBLASLt",
                          "the heuristic's GEMM algorithm failed for m=" + std::to_string(shape.m) +
                              " n=" + std::to_string(shape.n) + " k=" + std::to_string(shape.k));
  std::vector<size_t> same_bits{0};
  for (size_t i = 1; i < p.candidates.size(); ++i) {
    unsigned long long value = 0;
    if (output_fingerprint(i, &value) && value == first) same_bits.push_back(i);
  }

  cudaEvent_t start = nullptr, stop = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreate(&start));
  LOOM_CUDA_CHECK(cudaEventCreate(&stop));
  float first_ms = 0, best_ms = 0;
  size_t best = 0;
  for (size_t i : same_bits) {
    constexpr int kRuns = 3;
    LOOM_CUBLAS_CHECK(launch(i));  // warm
    LOOM_CUDA_CHECK(cudaEventRecord(start, stream_));
    for (int r = 0; r < kRuns; ++r) LOOM_CUBLAS_CHECK(launch(i));
    LOOM_CUDA_CHECK(cudaEventRecord(stop, stream_));
    LOOM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    ms /= kRuns;
    if (i == 0) first_ms = best_ms = ms;
    if (ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (scratch) LOOM_CUDA_CHECK(cudaFree(scratch));
  p.algo = p.candidates[best];
  if (!report_) return;
  const double flops =
      2.0 * static_cast<double>(shape.m) * static_cast<double>(shape.n) * static_cast<double>(shape.k);
  std::fprintf(
      stderr,
      "loom: GEMM m=%lld n=%lld k=%lld%s%s%s%s: heuristic first %.1f TFLOP/s; %zu of %zu candidates "
      "give its bits, the fastest (#%zu) %.1f\n",
      static_cast<long long>(shape.m), static_cast<long long>(shape.n), static_cast<long long>(shape.k),
      shape.transpose_a ? " Ta" : "", shape.transpose_b ? " Tb" : "", shape.accumulate ? " +=" : "",
      shape.a_dtype == DType::bf16           ? ""
      : shape.a_scales == GemmScales::tensor ? " fp8"
                                             : " fp8 blocks",
      flops / (first_ms * 1e9), same_bits.size(), p.candidates.size(), best, flops / (best_ms * 1e9));
}

void GemmRunner::set_scale_pointers(Plan& p, const float* a_scale_inv, const float* b_scale_inv) {
  if (!a_scale_inv && !b_scale_inv) return;
  // cuBLAS's A is our b (plan's comment).
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b_scale_inv,
                                                   sizeof b_scale_inv));
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &a_scale_inv,
                                                   sizeof a_scale_inv));
}

void GemmRunner::run(const GemmShape& shape, const void* a, const void* b, void* out, float alpha,
                     const float* a_scale_inv, const float* b_scale_inv, const void* bias) {
  LOOM_ASSERT(shape.bias == (bias != nullptr), "a GEMM with a bias epilogue needs its bias, and only it");
  if (shape.strided())
    for (const void* pointer : {a, b, static_cast<const void*>(out)})
      LOOM_ASSERT(reinterpret_cast<uintptr_t>(pointer) % kStridedAlignment == 0,
                  "a strided GEMM's operands start at 16-byte boundaries");
  Plan& p = plan(shape, a_scale_inv, b_scale_inv, bias);
  set_scale_pointers(p, a_scale_inv, b_scale_inv);
  if (bias)
    LOOM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  if (tune_ && !p.tuned && !shape.strided()) {
    if (p.candidates.size() > 1) tune(shape, p, a, b, out, alpha);
    p.tuned = true;
  }
  const float beta = shape.accumulate ? 1.0f : 0.0f;
  LOOM_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                   workspace_, workspace_bytes_, stream_));
}

}  // namespace loom
