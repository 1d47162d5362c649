// The CUTLASS side of the grouped GEMMs (grouped_gemm.h): a kernel configuration, the
// grouped GEMM type it makes, the setup kernel that writes each expert's arguments from the
// device offsets, and the Kernel that queues both. Each grouped_gemm_*.cu file instantiates
// one call with it.
//
// In CUTLASS's naming each group computes D[M, N] = alpha · Σ_K A[M, K] B[N, K] + beta · C,
// with B indexed [N, K]: a ColumnMajor B has K contiguous (a row-major [n, k] weight), a
// RowMajor B has N contiguous.
#pragma once

#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/kernel_hardware_info.h>

#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <string>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/grouped_gemm_kernels.h"
#include "ops/cuda/launch.h"
#include "ops/op_workspace.h"

namespace loom::cuda::grouped_gemm {

using bf16_cutlass = cutlass::bfloat16_t;

// Cooperative: the two consumer warp groups of a thread block share one 128 × 256 output
// tile (64 × 256 each), the largest tile whose fp32 accumulators fit the registers; each
// 64-deep slice of K brings 48 KiB into shared memory, four stages of it. A 2 × 1 cluster
// multicasts the weight's (B's) tile to the two blocks of neighbouring M tiles, halving its
// L2 reads.
struct Cooperative128x256 {
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using MainloopSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
};

// Ping-pong: each consumer warp group owns a 128 × 128 output tile, and the two take turns
// at the tensor cores, so one's epilogue runs beside the other's main loop.
struct Pingpong128x128 {
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using MainloopSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
};

// A grouped GEMM of bf16 A and B with fp32 accumulation into a row-major D (ElementD), and
// a row-major C of ElementC read when ElementC is not void.
template <class LayoutA, class LayoutB, class ElementC_, class ElementD_, class Config>
struct GroupedGemm {
  using ElementC = ElementC_;
  using ElementD = ElementD_;
  using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;
  using Shape = ProblemShape::UnderlyingProblemShape;
  static constexpr int kAlignmentAB = 16 / sizeof(bf16_cutlass);
  static constexpr int kAlignmentD = 16 / sizeof(ElementD);
  static constexpr int kAlignmentC =
      16 / sizeof(std::conditional_t<std::is_void_v<ElementC>, ElementD, ElementC>);

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Config::Tile, typename Config::Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, cutlass::layout::RowMajor*,
      kAlignmentC, ElementD, cutlass::layout::RowMajor*, kAlignmentD, typename Config::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, bf16_cutlass, LayoutA*, kAlignmentAB, bf16_cutlass,
      LayoutB*, kAlignmentAB, float, typename Config::Tile, typename Config::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      typename Config::MainloopSchedule>::CollectiveOp;
  using GemmKernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<GemmKernel>;
  using StrideA = typename GemmKernel::InternalStrideA;
  using StrideB = typename GemmKernel::InternalStrideB;
  using StrideC = typename GemmKernel::InternalStrideC;
  using StrideD = typename GemmKernel::InternalStrideD;
  using PointerC = std::conditional_t<std::is_void_v<ElementC>, const void*, const ElementC*>;

  // The workspace's per-expert arrays hold at most 16 bytes an entry (op_workspace.h).
  static_assert(sizeof(Shape) <= op_workspace::kGroupedGemmArrayEntryBytes);
  static_assert(sizeof(StrideA) <= op_workspace::kGroupedGemmArrayEntryBytes &&
                sizeof(StrideB) <= op_workspace::kGroupedGemmArrayEntryBytes &&
                sizeof(StrideC) <= op_workspace::kGroupedGemmArrayEntryBytes &&
                sizeof(StrideD) <= op_workspace::kGroupedGemmArrayEntryBytes);
};

// A stride of a row- or column-major operand: the leading dimension in whichever of its
// first two modes is not the static 1 (the third, the batch mode, is a static 0 in grouped
// GEMMs).
template <class Stride>
Stride leading_dimension_stride(int64_t leading_dimension) {
  Stride stride{};
  if constexpr (cute::is_static<cute::tuple_element_t<0, Stride>>::value)
    cute::get<1>(stride) = leading_dimension;
  else
    cute::get<0>(stride) = leading_dimension;
  return stride;
}

// One expert's arguments, as a call's Group::of returns them.
template <class G>
struct GroupArguments {
  typename G::Shape shape;
  const bf16_cutlass* a;
  const bf16_cutlass* b;
  typename G::PointerC c;
  typename G::ElementD* d;
};

// The per-expert argument arrays in the workspace, and the strides (the same for every
// expert: the operands' leading dimensions).
template <class G>
struct Arrays {
  typename G::Shape* shapes;
  const bf16_cutlass** a;
  const bf16_cutlass** b;
  typename G::PointerC* c;  // null when C is void
  typename G::ElementD** d;
  typename G::StrideA* stride_a;
  typename G::StrideB* stride_b;
  typename G::StrideC* stride_c;
  typename G::StrideD* stride_d;
  typename G::StrideA a_stride;
  typename G::StrideB b_stride;
  typename G::StrideC c_stride;
  typename G::StrideD d_stride;
};

// One thread an expert: its rows [begin, end) from the offsets, clamped to [0, R] and made
// non-decreasing, then the call's Group::of gives its problem shape and pointers.
template <class Call>
__global__ void setup_groups_kernel(Arrays<typename Call::G> arrays, Operands operands) {
  const int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (e >= operands.shape.experts) return;
  const int64_t rows = operands.shape.rows;
  const auto clamp = [rows](int64_t r) { return r < 0 ? 0 : r > rows ? rows : r; };
  const int64_t begin = clamp(operands.offsets[e]);
  const int64_t end = clamp(operands.offsets[e + 1]);
  const GroupArguments<typename Call::G> group = Call::of(operands, e, begin, end > begin ? end - begin : 0);
  arrays.shapes[e] = group.shape;
  arrays.a[e] = group.a;
  arrays.b[e] = group.b;
  if (arrays.c) arrays.c[e] = group.c;
  arrays.d[e] = group.d;
  arrays.stride_a[e] = arrays.a_stride;
  arrays.stride_b[e] = arrays.b_stride;
  if (arrays.stride_c) arrays.stride_c[e] = arrays.c_stride;
  arrays.stride_d[e] = arrays.d_stride;
}

// The Kernel of one call. `Call` gives the GEMM type G, beta (1: accumulate into C = D),
// the operands' leading dimensions, and each expert's arguments (Call::of, on the device).
//
// Workspace layout: CUTLASS's own part first (the TMA descriptors it rewrites per
// multiprocessor, which want 64-byte alignment), then the nine per-expert arrays.
// CUTLASS's kernel parameters depend on nothing but the workspace's address and the
// expert count (every operand is reached through the arrays), so they are made once and
// remade only when either changes.
template <class Call>
class CutlassKernel final : public Kernel {
  using G = typename Call::G;

 public:
  void run(const Operands& operands, void* workspace, cudaStream_t stream) override {
    const int64_t experts = operands.shape.experts;
    const int sms = multiprocessor_count();
    LOOM_ASSERT(reinterpret_cast<uintptr_t>(workspace) % 256 == 0,
                "grouped GEMM workspace must be 256-byte aligned");
    char* base = static_cast<char*>(workspace);
    const int64_t tensor_maps = op_workspace::grouped_gemm_tensor_map_bytes(sms);
    const int64_t array = op_workspace::grouped_gemm_array_bytes(experts);
    const auto slot = [&](int i) { return base + tensor_maps + i * array; };
    Arrays<G> arrays{};
    arrays.shapes = reinterpret_cast<typename G::Shape*>(slot(0));
    arrays.a = reinterpret_cast<const bf16_cutlass**>(slot(1));
    arrays.b = reinterpret_cast<const bf16_cutlass**>(slot(2));
    arrays.c =
        std::is_void_v<typename G::ElementC> ? nullptr : reinterpret_cast<typename G::PointerC*>(slot(3));
    arrays.d = reinterpret_cast<typename G::ElementD**>(slot(4));
    arrays.stride_a = reinterpret_cast<typename G::StrideA*>(slot(5));
    arrays.stride_b = reinterpret_cast<typename G::StrideB*>(slot(6));
    arrays.stride_c =
        std::is_void_v<typename G::ElementC> ? nullptr : reinterpret_cast<typename G::StrideC*>(slot(7));
    arrays.stride_d = reinterpret_cast<typename G::StrideD*>(slot(8));
    arrays.a_stride = leading_dimension_stride<typename G::StrideA>(Call::lda(operands.shape));
    arrays.b_stride = leading_dimension_stride<typename G::StrideB>(Call::ldb(operands.shape));
    arrays.c_stride = leading_dimension_stride<typename G::StrideC>(Call::ldd(operands.shape));
    arrays.d_stride = leading_dimension_stride<typename G::StrideD>(Call::ldd(operands.shape));

    constexpr int kThreads = 128;
    setup_groups_kernel<Call>
        <<<static_cast<unsigned>(ceil_div(experts, kThreads)), kThreads, 0, stream>>>(arrays, operands);
    LOOM_LAUNCH_CHECK();

    if (workspace != initialized_workspace_ || experts != initialized_experts_ || sms != initialized_sms_) {
      initialize(arrays, workspace, static_cast<int>(experts), sms, stream);
      initialized_workspace_ = workspace;
      initialized_experts_ = experts;
      initialized_sms_ = sms;
    }
    check(gemm_.run(stream), "run");
    LOOM_LAUNCH_CHECK();
  }

 private:
  static void check(cutlass::Status status, const char* what) {
    if (status != cutlass::Status::kSuccess)
      throw_runtime_failure("grouped GEMM", std::string("CUTLASS ") + what +
                                                " failed: " + cutlass::cutlassGetStatusString(status));
  }

  void initialize(const Arrays<G>& arrays, void* workspace, int experts, int sms, cudaStream_t stream) {
    typename G::Gemm::Arguments args{};
    args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
    // No host problem shapes: the counts stay on the device, and the grid is one block per
    // multiprocessor (in clusters) that walks the groups' tiles.
    args.problem_shape = {experts, arrays.shapes, nullptr};
    args.mainloop = {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b};
    args.epilogue.ptr_C = reinterpret_cast<decltype(args.epilogue.ptr_C)>(arrays.c);
    args.epilogue.dC = arrays.stride_c;
    args.epilogue.ptr_D = arrays.d;
    args.epilogue.dD = arrays.stride_d;
    args.epilogue.thread.alpha = 1.0f;
    args.epilogue.thread.beta = Call::kBeta;
    args.hw_info.device_id = 0;  // only read when sm_count is not given
    args.hw_info.sm_count = sms;
    // The clusters that fit the GPU at once (a GPC's spare multiprocessors may hold none):
    // the persistent grid's size.
    if (max_active_clusters_ == 0)
      max_active_clusters_ =
          cutlass::KernelHardwareInfo::query_device_max_active_clusters<typename G::GemmKernel>();
    args.hw_info.max_active_clusters = max_active_clusters_;
    const size_t need = G::Gemm::get_workspace_size(args);
    LOOM_ASSERT(need <= static_cast<size_t>(op_workspace::grouped_gemm_tensor_map_bytes(sms)),
                "CUTLASS's grouped GEMM workspace outgrew op_workspace::grouped_gemm_tensor_map_bytes");
    check(G::Gemm::can_implement(args), "can_implement");
    check(gemm_.initialize(args, workspace, stream), "initialize");
  }

  typename G::Gemm gemm_;
  void* initialized_workspace_ = nullptr;
  int64_t initialized_experts_ = -1;
  int initialized_sms_ = 0;
  int max_active_clusters_ = 0;
};

}  // namespace loom::cuda::grouped_gemm
