// The three CUTLASS grouped kernels behind GroupedGemmRunner (grouped_gemm.h), one .cu file
// each so that they compile in parallel: what the runner sees of them, with no CUTLASS type.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ops/cuda/grouped_gemm.h"

namespace loom::cuda::grouped_gemm {

// One call's operands, as GroupedGemmRunner's methods name them: forward (a = x, b =
// weights, out), backward_input (a = d_out, b = weights, out = d_x), backward_weight (a =
// d_out, b = x, out = the fp32 d_weights).
struct Operands {
  GroupedGemmShape shape;
  const int32_t* offsets = nullptr;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  // Queues the setup kernel and the grouped GEMM on `stream`. `workspace`: at least
  // op_workspace::grouped_gemm_workspace_bytes(experts, multiprocessor_count()) bytes,
  // 256-byte aligned.
  virtual void run(const Operands& operands, void* workspace, cudaStream_t stream) = 0;
};

std::unique_ptr<Kernel> make_forward_kernel();
std::unique_ptr<Kernel> make_backward_input_kernel();
std::unique_ptr<Kernel> make_backward_weight_kernel();

}  // namespace loom::cuda::grouped_gemm
