#include "ops/cuda/gemm.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace loom {

GemmRunner::GemmRunner(cudaStream_t stream) : stream_(stream) {
  const char* autotune = std::getenv("LOOM_GEMM_AUTOTUNE");
  autotune_ = autotune && std::string(autotune) == "1";
  LOOM_CUBLAS_CHECK(cublasLtCreate(&handle_));
  LOOM_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

GemmRunner::~GemmRunner() {
  for (auto& [shape, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  cudaFree(workspace_);
  cublasLtDestroy(handle_);
}

// cuBLASLt is column-major. A row-major [r, c] matrix is a column-major [c, r] one, so the
// row-major out = op(a)·op(b) is computed as the column-major outᵀ = op(b)ᵀ·op(a)ᵀ: cuBLAS's
// "A" is our b and its "B" is our a, with the same transpose flags.
GemmRunner::Plan& GemmRunner::plan(const GemmShape& s) {
  auto found = plans_.find(s);
  if (found != plans_.end()) return found->second;
  Plan p;
  const cudaDataType_t out_type = s.out_dtype == DType::f32 ? CUDA_R_32F : CUDA_R_16BF;
  LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
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
  LOOM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, b_rows, b_cols, static_cast<int64_t>(b_rows)));
  LOOM_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, a_rows, a_cols, static_cast<int64_t>(a_rows)));
  LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_type, static_cast<uint64_t>(s.n),
                                               static_cast<uint64_t>(s.m), s.n));
  cublasLtMatmulPreference_t pref = nullptr;
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t results[kAutotuneCandidates]{};
  int found_count = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      handle_, p.op, p.a, p.b, p.c, p.c, pref, autotune_ ? kAutotuneCandidates : 1, results, &found_count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found_count == 0)
    throw_runtime_failure("cuBLASLt", "no GEMM algorithm for m=" + std::to_string(s.m) +
                                          " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
  p.algo = results[0].algo;
  for (int i = 0; i < found_count; ++i) p.candidates.push_back(results[i].algo);
  return plans_.emplace(s, p).first->second;
}

// Times every candidate on the call's inputs into a scratch output (an accumulating GEMM
// must not add into the real one more than once) and keeps the fastest.
void GemmRunner::autotune(const GemmShape& shape, Plan& p, const void* a, const void* b, float alpha) {
  const float beta = shape.accumulate ? 1.0f : 0.0f;
  const size_t out_bytes = static_cast<size_t>(shape.m * shape.n) * (shape.out_dtype == DType::f32 ? 4 : 2);
  void* scratch = nullptr;
  LOOM_CUDA_CHECK(cudaMalloc(&scratch, out_bytes));
  LOOM_CUDA_CHECK(cudaMemsetAsync(scratch, 0, out_bytes, stream_));
  cudaEvent_t start = nullptr, stop = nullptr;
  LOOM_CUDA_CHECK(cudaEventCreate(&start));
  LOOM_CUDA_CHECK(cudaEventCreate(&stop));
  float first_ms = 0, best_ms = 0;
  size_t best = 0;
  for (size_t i = 0; i < p.candidates.size(); ++i) {
    const auto launch = [&] {
      return cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, scratch, p.c, scratch, p.c,
                            &p.candidates[i], workspace_, workspace_bytes_, stream_);
    };
    if (launch() != CUBLAS_STATUS_SUCCESS) continue;
    LOOM_CUDA_CHECK(cudaEventRecord(start, stream_));
    constexpr int kRuns = 5;
    for (int r = 0; r < kRuns; ++r) LOOM_CUBLAS_CHECK(launch());
    LOOM_CUDA_CHECK(cudaEventRecord(stop, stream_));
    LOOM_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    LOOM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    ms /= kRuns;
    if (i == 0) first_ms = ms;
    if (i == 0 || ms < best_ms) {
      best_ms = ms;
      best = i;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  LOOM_CUDA_CHECK(cudaFree(scratch));
  p.algo = p.candidates[best];
  const double flops =
      2.0 * static_cast<double>(shape.m) * static_cast<double>(shape.n) * static_cast<double>(shape.k);
  std::fprintf(
      stderr,
      "loom: GEMM m=%lld n=%lld k=%lld%s%s%s: heuristic first %.1f TFLOP/s, fastest of %zu (#%zu) %.1f\n",
      static_cast<long long>(shape.m), static_cast<long long>(shape.n), static_cast<long long>(shape.k),
      shape.transpose_a ? " Ta" : "", shape.transpose_b ? " Tb" : "", shape.accumulate ? " +=" : "",
      flops / (first_ms * 1e9), p.candidates.size(), best, flops / (best_ms * 1e9));
}

void GemmRunner::run(const GemmShape& shape, const void* a, const void* b, void* out, float alpha) {
  Plan& p = plan(shape);
  if (autotune_ && !p.tuned) {
    autotune(shape, p, a, b, alpha);
    p.tuned = true;
  }
  const float beta = shape.accumulate ? 1.0f : 0.0f;
  LOOM_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                   workspace_, workspace_bytes_, stream_));
}

}  // namespace loom
