#include "ops/cuda/gemm.h"

#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace loom {

GemmRunner::GemmRunner(cudaStream_t stream) : stream_(stream) {
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
const GemmRunner::Plan& GemmRunner::plan(const GemmShape& s) {
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
  cublasLtMatmulHeuristicResult_t result{};
  int found_count = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found_count);
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found_count == 0)
    throw_runtime_failure("cuBLASLt", "no GEMM algorithm for m=" + std::to_string(s.m) +
                                          " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k));
  p.algo = result.algo;
  return plans_.emplace(s, p).first->second;
}

void GemmRunner::run(const GemmShape& shape, const void* a, const void* b, void* out, float alpha) {
  const Plan& p = plan(shape);
  const float beta = shape.accumulate ? 1.0f : 0.0f;
  LOOM_CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                   workspace_, workspace_bytes_, stream_));
}

}  // namespace loom
