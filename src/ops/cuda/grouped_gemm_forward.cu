// The MoE forward's grouped GEMM (grouped_gemm.h): out[r, :] = x[r, :] · W_eᵀ. In CUTLASS's
// naming M is the expert's rows (ragged), N = n, K = k; A = x and B = W_e are both
// K-contiguous (TN), D = out.
#include "ops/cuda/grouped_gemm_cutlass.cuh"

namespace loom::cuda::grouped_gemm {
namespace {

struct Forward {
  // The experts' rows are M, so a 2 × 1 cluster shares the weight tile between two blocks.
  using G = GroupedGemm<cutlass::layout::RowMajor, cutlass::layout::ColumnMajor, void, bf16_cutlass,
                        Cooperative128x256>;
  static constexpr float kBeta = 0.0f;
  static int64_t lda(const GroupedGemmShape& s) { return s.k; }
  static int64_t ldb(const GroupedGemmShape& s) { return s.k; }
  static int64_t ldd(const GroupedGemmShape& s) { return s.n; }
  __device__ static GroupArguments<G> of(const Operands& o, int64_t e, int64_t begin, int64_t rows) {
    const GroupedGemmShape& s = o.shape;
    return {cute::make_shape(static_cast<int>(rows), static_cast<int>(s.n), static_cast<int>(s.k)),
            static_cast<const bf16_cutlass*>(o.a) + begin * s.k,
            static_cast<const bf16_cutlass*>(o.b) + e * s.n * s.k, nullptr,
            static_cast<bf16_cutlass*>(o.out) + begin * s.n};
  }
};

}  // namespace

std::unique_ptr<Kernel> make_forward_kernel() {
  return std::make_unique<CutlassKernel<Forward>>();
}

}  // namespace loom::cuda::grouped_gemm
