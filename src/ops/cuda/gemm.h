// GEMMs through cuBLASLt: bf16 inputs, fp32 accumulation, bf16 or fp32 output.
//
// Row-major, as the op interface: out[M, N] = alpha · op(a) · op(b) + beta · out, where
// op(a) is a [M, K] (a stored [M, K]) or aᵀ (a stored [K, M]), likewise b. The weight
// gradient is the beta = 1 case with an fp32 out: cuBLASLt adds straight into the main grad,
// so there is no bf16 product to add afterwards.
//
// The algorithm for each shape is chosen once (cuBLASLt's heuristic, first result that fits
// the workspace) and cached; the workspace is 32 MiB, what cuBLAS asks for on Hopper.
// LOOM_GEMM_AUTOTUNE=1, a measurement switch (README), instead times up to 16 of the
// heuristic's candidates on each shape's first call and keeps the fastest, printing both
// rates; the choice can differ between runs, so bitwise resume is not promised under it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "core/dtype.h"

namespace loom {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  DType out_dtype = DType::bf16;
  bool accumulate = false;  // beta = 1
  auto key() const { return std::tie(m, n, k, transpose_a, transpose_b, out_dtype, accumulate); }
  bool operator<(const GemmShape& other) const { return key() < other.key(); }
};

class GemmRunner {
 public:
  explicit GemmRunner(cudaStream_t stream);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // out[m, n] (row-major, leading dimension n) = op(a) · op(b) (+ out when accumulate).
  // a, b are bf16; out is bf16 or fp32 as shape.out_dtype.
  void run(const GemmShape& shape, const void* a, const void* b, void* out, float alpha = 1.0f);

 private:
  static constexpr int kAutotuneCandidates = 16;
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::vector<cublasLtMatmulAlgo_t> candidates;
    bool tuned = false;
  };
  Plan& plan(const GemmShape& shape);
  void autotune(const GemmShape& shape, Plan& p, const void* a, const void* b, float alpha);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 32u << 20;
  bool autotune_ = false;
  std::map<GemmShape, Plan> plans_;
};

}  // namespace loom
