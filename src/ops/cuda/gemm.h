// GEMMs through cuBLASLt: bf16 (or FP8) inputs, fp32 accumulation, bf16 or fp32 output.
//
// Row-major, as the op interface: out[M, N] = alpha · op(a) · op(b) + beta · out, where
// op(a) is a [M, K] (a stored [M, K]) or aᵀ (a stored [K, M]), likewise b. The weight
// gradient is the beta = 1 case with an fp32 out: cuBLASLt adds straight into the main grad,
// so there is no bf16 product to add afterwards.
//
// The algorithm for each shape is chosen on its first call and cached; the workspace is
// 32 MiB, what cuBLAS asks for on Hopper. cuBLASLt's heuristic offers up to 16 candidates
// that fit; its first choice is often not the fastest in isolation (docs/performance.md,
// "GEMM algorithms"). The first call runs each candidate on its own inputs
// and keeps only those whose output has the heuristic first's bits (a 64-bit fingerprint of
// the whole output, millions of values: a candidate that adds in another order, such as
// split-K, differs somewhere in it), then the fastest of those. So whichever a run picks,
// timings being noisy, it computes the heuristic's bits: runs, and a run and its resume,
// stay bitwise equal. LOOM_GEMM_AUTOTUNE=0 keeps the heuristic's first choice (for A/B
// measurements); LOOM_OP_PROFILE=1 prints each shape's choice and rates. An accumulating
// GEMM (into the fp32 main grads) is tuned in a scratch output, only where 1 GiB stays free
// beside it.
//
// FP8 (a_dtype, b_dtype e4m3 or e5m2, not both e5m2): Hopper reads both operands
// K-contiguous, so only op(a) = a, op(b) = bᵀ; each operand's 1/scale is a device float the
// call passes, which cuBLASLt multiplies into the fp32 sum. `fast_accumulation` is cuBLASLt's
// FAST_ACCUM (partial sums promoted to fp32 less often).
//
// Block-scaled FP8 (a_scales, b_scales not `tensor`; ops.h fp8_gemm_blocks): the scale
// pointers are f32 tensors of inverse scales in cuBLASLt's VEC128_32F (vec128) or
// BLK128x128_32F (block128x128) layout, not both block128x128 (sm_90 takes 1D × 1D, 1D × 2D
// and 2D × 1D); no fast accumulation.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "core/dtype.h"

namespace loom {

// How an FP8 operand's scale pointer is read: one scale for the tensor, or blocks.
enum class GemmScales : uint8_t { tensor, vec128, block128x128 };

struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  DType out_dtype = DType::bf16;
  bool accumulate = false;  // beta = 1
  DType a_dtype = DType::bf16, b_dtype = DType::bf16;
  bool fast_accumulation = false;
  GemmScales a_scales = GemmScales::tensor, b_scales = GemmScales::tensor;
  bool bias = false;  // out += bias[n] in the epilogue (bf16 bias and out)
  // Row strides in elements of a, b and out as stored (0: packed, the stored width). A strided
  // GEMM (LoRA's, on column windows of wider tensors) keeps the heuristic's first choice: the
  // tuning's scratch output and fingerprint assume a packed out.
  int64_t lda = 0, ldb = 0, ldc = 0;
  bool strided() const { return lda != 0 || ldb != 0 || ldc != 0; }
  auto key() const {
    return std::tie(m, n, k, transpose_a, transpose_b, out_dtype, accumulate, a_dtype, b_dtype,
                    fast_accumulation, a_scales, b_scales, bias, lda, ldb, ldc);
  }
  bool operator<(const GemmShape& other) const { return key() < other.key(); }
};

class GemmRunner {
 public:
  explicit GemmRunner(cudaStream_t stream);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // out[m, n] (row-major, leading dimension n) = op(a) · op(b) (+ out when accumulate)
  // (+ bias, each row, with shape.bias: cuBLASLt's BIAS epilogue adds it to the fp32 sum
  // before the rounding to bf16). a, b are shape.a_dtype, shape.b_dtype; out is bf16 or fp32
  // as shape.out_dtype. FP8 operands come with their 1/scale (device floats).
  void run(const GemmShape& shape, const void* a, const void* b, void* out, float alpha = 1.0f,
           const float* a_scale_inv = nullptr, const float* b_scale_inv = nullptr,
           const void* bias = nullptr);

 private:
  static constexpr int kTuneCandidates = 16;
  static constexpr uint32_t kStridedAlignment = 16;  // bytes: a strided GEMM's pointers and rows
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::vector<cublasLtMatmulAlgo_t> candidates;
    bool tuned = false;
  };
  // The shape's plan, made on first use with the call's FP8 scale pointers (null for bf16).
  Plan& plan(const GemmShape& shape, const float* a_scale_inv, const float* b_scale_inv, const void* bias);
  void set_scale_pointers(Plan& p, const float* a_scale_inv, const float* b_scale_inv);
  void tune(const GemmShape& shape, Plan& p, const void* a, const void* b, void* out, float alpha);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 32u << 20;
  unsigned long long* fingerprint_ = nullptr;  // device: one candidate's output fingerprint
  bool tune_ = true, report_ = false;
  std::map<GemmShape, Plan> plans_;
};

}  // namespace loom
