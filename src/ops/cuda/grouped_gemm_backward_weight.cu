// The MoE backward's weight gradient (grouped_gemm.h): d_W[e] += d_out_eᵀ · x_e. In
// CUTLASS's naming M = n, N = k, K is the expert's rows (ragged); A[M, K] = d_out_e[K, M] is
// M-contiguous (ColumnMajor), B[N, K] = x_e[K, N] N-contiguous (RowMajor), and C = D is the
// expert's fp32 gradient with beta = 1. An expert with no rows is an empty 0 × 0 × 0
// problem: it has no tiles, so its gradient is neither read nor written (a K = 0 problem
// with tiles would run a main loop of no steps, which CUTLASS's pipelines do not expect).
#include "ops/cuda/grouped_gemm_cutlass.cuh"

namespace loom::cuda::grouped_gemm {
namespace {

struct BackwardWeight {
  using G =
      GroupedGemm<cutlass::layout::ColumnMajor, cutlass::layout::RowMajor, float, float, Cooperative128x256>;
  static constexpr float kBeta = 1.0f;
  static int64_t lda(const GroupedGemmShape& s) { return s.n; }
  static int64_t ldb(const GroupedGemmShape& s) { return s.k; }
  static int64_t ldd(const GroupedGemmShape& s) { return s.k; }
  __device__ static GroupArguments<G> of(const Operands& o, int64_t e, int64_t begin, int64_t rows) {
    const GroupedGemmShape& s = o.shape;
    float* grad = static_cast<float*>(o.out) + e * s.n * s.k;
    const bool empty = rows == 0;
    return {empty ? cute::make_shape(0, 0, 0)
                  : cute::make_shape(static_cast<int>(s.n), static_cast<int>(s.k), static_cast<int>(rows)),
            static_cast<const bf16_cutlass*>(o.a) + begin * s.n,
            static_cast<const bf16_cutlass*>(o.b) + begin * s.k, grad, grad};
  }
};

}  // namespace

std::unique_ptr<Kernel> make_backward_weight_kernel() {
  return std::make_unique<CutlassKernel<BackwardWeight>>();
}

}  // namespace loom::cuda::grouped_gemm
