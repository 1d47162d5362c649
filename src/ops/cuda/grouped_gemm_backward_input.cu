// The MoE backward's input gradient (grouped_gemm.h): d_x[r, :] = d_out[r, :] · W_e. In
// CUTLASS's naming M is the expert's rows (ragged), N = k, K = n; A = d_out is K-contiguous,
// B[N, K] = W_e[K, N] is N-contiguous (CUTLASS's RowMajor B), D = d_x.
#include "ops/cuda/grouped_gemm_cutlass.cuh"

namespace loom::cuda::grouped_gemm {
namespace {

struct BackwardInput {
  using G = GroupedGemm<cutlass::layout::RowMajor, cutlass::layout::RowMajor, void, bf16_cutlass,
                        Cooperative128x256>;
  static constexpr float kBeta = 0.0f;
  static int64_t lda(const GroupedGemmShape& s) { return s.n; }
  static int64_t ldb(const GroupedGemmShape& s) { return s.k; }
  static int64_t ldd(const GroupedGemmShape& s) { return s.k; }
  __device__ static GroupArguments<G> of(const Operands& o, int64_t e, int64_t begin, int64_t rows) {
    const GroupedGemmShape& s = o.shape;
    return {cute::make_shape(static_cast<int>(rows), static_cast<int>(s.k), static_cast<int>(s.n)),
            static_cast<const bf16_cutlass*>(o.a) + begin * s.n,
            static_cast<const bf16_cutlass*>(o.b) + e * s.n * s.k, nullptr,
            static_cast<bf16_cutlass*>(o.out) + begin * s.k};
  }
};

}  // namespace

std::unique_ptr<Kernel> make_backward_input_kernel() {
  return std::make_unique<CutlassKernel<BackwardInput>>();
}

}  // namespace loom::cuda::grouped_gemm
