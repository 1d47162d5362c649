#include <string>

#include "core/error.h"
#include "ops/cuda/grouped_gemm.h"
#include "ops/cuda/grouped_gemm_kernels.h"
#include "ops/cuda/launch.h"
#include "ops/op_workspace.h"

namespace loom {

namespace {

// CUTLASS's problem shapes are int32, and TMA wants each row (n or k bf16 values) a
// multiple of 16 bytes and each expert's first row 16-byte aligned.
void check_shape(const GroupedGemmShape& s, const char* call) {
  const std::string where = std::string("grouped GEMM ") + call;
  LOOM_ASSERT(s.experts > 0 && s.rows >= 0 && s.n > 0 && s.k > 0, where + ": empty or negative shape");
  LOOM_ASSERT(s.n % 8 == 0 && s.k % 8 == 0, where + ": n and k must be multiples of 8");
  constexpr int64_t kMost = int64_t{1} << 31;
  LOOM_ASSERT(s.rows < kMost && s.n < kMost && s.k < kMost, where + ": a dimension past int32");
}

void check_aligned(const void* p, const char* what) {
  LOOM_ASSERT(reinterpret_cast<uintptr_t>(p) % 16 == 0,
              std::string("grouped GEMM: ") + what + " must be 16-byte aligned");
}

}  // namespace

GroupedGemmRunner::GroupedGemmRunner(cudaStream_t stream) : stream_(stream) {}

GroupedGemmRunner::~GroupedGemmRunner() = default;

size_t GroupedGemmRunner::workspace_bytes(int64_t experts) {
  return static_cast<size_t>(
      op_workspace::grouped_gemm_workspace_bytes(experts, cuda::multiprocessor_count()));
}

void GroupedGemmRunner::forward(const GroupedGemmShape& shape, const int32_t* offsets, const void* x,
                                const void* weights, void* out, void* workspace) {
  check_shape(shape, "forward");
  check_aligned(x, "x");
  check_aligned(weights, "weights");
  check_aligned(out, "out");
  if (!forward_) forward_ = cuda::grouped_gemm::make_forward_kernel();
  forward_->run({shape, offsets, x, weights, out}, workspace, stream_);
}

void GroupedGemmRunner::backward_input(const GroupedGemmShape& shape, const int32_t* offsets,
                                       const void* d_out, const void* weights, void* d_x, void* workspace) {
  check_shape(shape, "backward_input");
  check_aligned(d_out, "d_out");
  check_aligned(weights, "weights");
  check_aligned(d_x, "d_x");
  if (!backward_input_) backward_input_ = cuda::grouped_gemm::make_backward_input_kernel();
  backward_input_->run({shape, offsets, d_out, weights, d_x}, workspace, stream_);
}

void GroupedGemmRunner::backward_weight(const GroupedGemmShape& shape, const int32_t* offsets,
                                        const void* d_out, const void* x, float* d_weights, void* workspace) {
  check_shape(shape, "backward_weight");
  check_aligned(d_out, "d_out");
  check_aligned(x, "x");
  check_aligned(d_weights, "d_weights");
  if (!backward_weight_) backward_weight_ = cuda::grouped_gemm::make_backward_weight_kernel();
  backward_weight_->run({shape, offsets, d_out, x, d_weights}, workspace, stream_);
}

}  // namespace loom
