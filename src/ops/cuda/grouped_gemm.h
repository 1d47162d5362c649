// Grouped GEMMs for mixture-of-experts layers: one GEMM an expert, all experts in one launch
// of CUTLASS's SM90 grouped kernel (Hopper, sm_90a); bf16 operands, fp32 accumulation.
//
// Expert weights are bf16 row-major [E, n, k] (expert e's W_e is [n, k]). Tokens sorted by
// expert lie in row-major [R, ·] arrays, expert e owning rows [offsets[e], offsets[e+1]):
// `offsets` is int32 [E + 1] in device memory, offsets[0] = 0, offsets[E] ≤ R; rows past
// offsets[E] are neither read nor written, and an expert may own no rows. Offsets are
// clamped to [0, R] and made non-decreasing on the device, so bad counts cannot reach
// outside the arrays.
//
// The counts stay on the device: no call synchronizes with the host. A small kernel turns
// `offsets` into CUTLASS's per-expert problem shapes, pointers and strides, and the grouped
// kernel runs with no host problem shapes, a persistent grid of one cluster per pair of
// multiprocessors that walks the experts' output tiles in order. Each output tile is summed
// by one thread block over the whole reduction, in a fixed order (no split-K or stream-K,
// no atomics), so a run gives the same bits every time.
//
// n and k must be multiples of 8 (TMA needs 16-byte row strides and 16-byte aligned
// starts of each expert's rows), all pointers 16-byte aligned.
//
// No CUTLASS type appears here: the three kernels are compiled apart, one .cu file each
// (grouped_gemm_{forward,backward_input,backward_weight}.cu, via grouped_gemm_kernels.h).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace loom {

namespace cuda::grouped_gemm {
class Kernel;
}

struct GroupedGemmShape {
  int64_t experts = 0;   // E
  int64_t rows = 0;      // R, the rows of x, out, d_out and d_x (offsets are clamped to it)
  int64_t n = 0, k = 0;  // each expert's weight is [n, k]
};

class GroupedGemmRunner {
 public:
  explicit GroupedGemmRunner(cudaStream_t stream);
  ~GroupedGemmRunner();
  GroupedGemmRunner(const GroupedGemmRunner&) = delete;
  GroupedGemmRunner& operator=(const GroupedGemmRunner&) = delete;

  // The device workspace a call with `experts` experts needs on the current device
  // (op_workspace::grouped_gemm_workspace_bytes of its multiprocessor count).
  static size_t workspace_bytes(int64_t experts);

  // Each call takes `workspace`: at least workspace_bytes(shape.experts) bytes of device
  // memory, 256-byte aligned, untouched by anything else until the stream has run the call
  // (CudaOps's op workspace). Calls in turn on one stream may share it.

  // out[r, :] = x[r, :] · W_eᵀ for the rows r of expert e. x bf16 [R, k], weights bf16
  // [E, n, k], out bf16 [R, n].
  void forward(const GroupedGemmShape& shape, const int32_t* offsets, const void* x, const void* weights,
               void* out, void* workspace);
  // d_x[r, :] = d_out[r, :] · W_e. d_out bf16 [R, n], weights bf16 [E, n, k], d_x bf16 [R, k].
  void backward_input(const GroupedGemmShape& shape, const int32_t* offsets, const void* d_out,
                      const void* weights, void* d_x, void* workspace);
  // d_weights[e] += d_out_eᵀ · x_e, summed over expert e's rows, into the fp32 main grads
  // d_weights [E, n, k]; an expert with no rows keeps its gradient as it was. d_out bf16
  // [R, n], x bf16 [R, k].
  void backward_weight(const GroupedGemmShape& shape, const int32_t* offsets, const void* d_out,
                       const void* x, float* d_weights, void* workspace);

 private:
  cudaStream_t stream_;
  std::unique_ptr<cuda::grouped_gemm::Kernel> forward_, backward_input_, backward_weight_;
};

}  // namespace loom
