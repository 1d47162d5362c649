// The experts' GEMMs over rows grouped by expert (ops.h grouped_linear_forward / _backward)
// at the shapes CUTLASS's grouped kernel (grouped_gemm.h) cannot take: n or k not a multiple
// of 8, where TMA's 16-byte rows do not fit (op_workspace::grouped_gemm_takes). Tiled
// CUDA-core kernels, correct at every shape and deterministic; in fp32 on CUDA cores (an
// H100's ~60 TFLOP/s of FMA at best, a tenth of its bf16 tensor cores), so no model whose
// experts CUTLASS takes comes here.
//
// Every kernel computes 64 × 64 output tiles, 256 threads of 4 × 4 outputs each, walking the
// reduction 16 at a time through shared memory (bf16 widened to fp32 on the way in). Each
// output element is one thread's fp32 sum over the reduction in ascending order: the same
// bits every run, no atomics. The group offsets are read on the device, so nothing waits on
// the host:
//   forward and backward_input: a block a (64-row tile of one expert's rows, column tile).
//     The grid has a block for every tile the rows could need (rows/64 + experts bounds the
//     tiles of any split); each block finds its expert and tile from the offsets, and blocks
//     past the last tile return.
//   backward_weight: a block a (expert, 64 × 64 tile of its [n, k] gradient), summing the
//     expert's rows in order; an expert without rows returns at once.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

constexpr int kTile = 64;               // output rows and columns of a block
constexpr int kDepth = 16;              // reduction steps a shared-memory stage holds
constexpr int kThreads = 256;           // 16 × 16, each 4 × 4 outputs
constexpr int kPerThread = kTile / 16;  // 4
constexpr unsigned kFullMask = 0xffffffffu;
// Shared tiles [kDepth][kTile + 1]: the pad puts a row's stores (consecutive reduction steps
// of one output row, when the reduction is the contiguous axis) in different banks.
using SharedTile = float[kDepth][kTile + 1];

// One operand of a tile product: element (i, d), i < kTile along the output tile's rows (or
// columns), d along the reduction, at data[i · i_stride + d · d_stride]; read as 0 past
// i_count or d_count. kReductionContiguous: d_stride is 1 (else i_stride is), which decides
// how the threads walk the tile so that neighbouring threads read neighbouring addresses.
struct Operand {
  const bf16* data;
  int64_t i_stride, d_stride, i_count, d_count;
};

template <bool kReductionContiguous>
__device__ inline void load_stage(SharedTile& tile, const Operand& x, int64_t d0) {
#pragma unroll
  for (int r = 0; r < kTile * kDepth / kThreads; ++r) {
    const int index = static_cast<int>(threadIdx.x) + r * kThreads;
    const int i = kReductionContiguous ? index / kDepth : index % kTile;
    const int d = kReductionContiguous ? index % kDepth : index / kTile;
    const int64_t depth = d0 + d;
    tile[d][i] = i < x.i_count && depth < x.d_count
                     ? __bfloat162float(x.data[i * x.i_stride + depth * x.d_stride])
                     : 0.0f;
  }
}

// acc[a][b] = Σ_d A(ty + 16a, d) · B(tx + 16b, d), d ascending (a.d_count == b.d_count).
template <bool kAContiguous, bool kBContiguous>
__device__ inline void tile_product(float (&acc)[kPerThread][kPerThread], const Operand& a, const Operand& b,
                                    SharedTile& a_tile, SharedTile& b_tile) {
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  for (int64_t d0 = 0; d0 < a.d_count; d0 += kDepth) {
    load_stage<kAContiguous>(a_tile, a, d0);
    load_stage<kBContiguous>(b_tile, b, d0);
    __syncthreads();
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      float a_values[kPerThread], b_values[kPerThread];
#pragma unroll
      for (int s = 0; s < kPerThread; ++s) {
        a_values[s] = a_tile[d][ty + 16 * s];
        b_values[s] = b_tile[d][tx + 16 * s];
      }
#pragma unroll
      for (int s = 0; s < kPerThread; ++s)
#pragma unroll
        for (int u = 0; u < kPerThread; ++u) acc[s][u] = fmaf(a_values[s], b_values[u], acc[s][u]);
    }
    __syncthreads();  // the next stage overwrites the tiles
  }
}

// Expert e's rows [begin, end), clamped into [0, rows): offsets that leave x end there.
__device__ inline void expert_rows(const int32_t* offsets, int e, int64_t rows, int64_t* begin,
                                   int64_t* end) {
  const int64_t b = offsets[e], f = offsets[e + 1];
  *begin = b < 0 ? 0 : b > rows ? rows : b;
  *end = f < *begin ? *begin : f > rows ? rows : f;
}

struct RowTile {
  int expert;
  int64_t row0, rows;  // rows [row0, row0 + rows) of the expert's, rows ≤ kTile
};

// Row tile `slot` of the experts' tiles in expert order (expert e has ceil(n_e / 64)), found
// by warp 0 with a scan of the tile counts 32 experts a round; false for a slot past the last
// tile (the whole block sees the same answer and returns together).
__device__ inline bool find_row_tile(const int32_t* offsets, int experts, int64_t rows, int64_t slot,
                                     RowTile* tile) {
  __shared__ RowTile found;
  if (threadIdx.x == 0) found.expert = -1;
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    int64_t before = 0;  // the tiles of the rounds before
    for (int base = 0; base < experts; base += 32) {
      const int e = base + lane;
      int64_t begin = 0, end = 0;
      if (e < experts) expert_rows(offsets, e, rows, &begin, &end);
      const int64_t tiles = ceil_div(end - begin, kTile);
      int64_t inclusive = tiles;
      for (int offset = 1; offset < 32; offset *= 2) {
        const int64_t other = __shfl_up_sync(kFullMask, inclusive, offset);
        if (lane >= offset) inclusive += other;
      }
      const int64_t first = before + inclusive - tiles;
      if (slot >= first && slot < first + tiles) {
        const int64_t row0 = begin + (slot - first) * kTile;
        found = {e, row0, end - row0 < kTile ? end - row0 : kTile};
      }
      before += __shfl_sync(kFullMask, inclusive, 31);
    }
  }
  __syncthreads();
  *tile = found;
  return tile->expert >= 0;
}

// out [rows, n] = x [rows, k] · weight[e]ᵀ: A(i, d) = x[row0 + i, d], B(j, d) = weight[e, col0 + j, d].
__global__ void grouped_forward_kernel(bf16* out, const bf16* x, const bf16* weight, const int32_t* offsets,
                                       int experts, int64_t rows, int64_t n, int64_t k) {
  __shared__ SharedTile a_tile, b_tile;
  RowTile tile;
  if (!find_row_tile(offsets, experts, rows, blockIdx.x, &tile)) return;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const Operand a{x + tile.row0 * k, k, 1, tile.rows, k};
  const Operand b{weight + (tile.expert * n + col0) * k, k, 1, n - col0, k};
  float acc[kPerThread][kPerThread] = {};
  tile_product<true, true>(acc, a, b, a_tile, b_tile);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int s = 0; s < kPerThread; ++s)
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int64_t i = ty + 16 * s, j = col0 + tx + 16 * u;
      if (i < tile.rows && j < n) out[(tile.row0 + i) * n + j] = __float2bfloat16(acc[s][u]);
    }
}

// d_x [rows, k] = d_out [rows, n] · weight[e]: A(i, d) = d_out[row0 + i, d], B(j, d) =
// weight[e, d, col0 + j].
__global__ void grouped_backward_input_kernel(bf16* d_x, const bf16* d_out, const bf16* weight,
                                              const int32_t* offsets, int experts, int64_t rows, int64_t n,
                                              int64_t k) {
  __shared__ SharedTile a_tile, b_tile;
  RowTile tile;
  if (!find_row_tile(offsets, experts, rows, blockIdx.x, &tile)) return;
  const int64_t col0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const Operand a{d_out + tile.row0 * n, n, 1, tile.rows, n};
  const Operand b{weight + tile.expert * n * k + col0, 1, k, k - col0, n};
  float acc[kPerThread][kPerThread] = {};
  tile_product<true, false>(acc, a, b, a_tile, b_tile);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
  for (int s = 0; s < kPerThread; ++s)
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int64_t i = ty + 16 * s, j = col0 + tx + 16 * u;
      if (i < tile.rows && j < k) d_x[(tile.row0 + i) * k + j] = __float2bfloat16(acc[s][u]);
    }
}

// d_weight[e] [n, k] += Σ over the expert's rows r of d_out[r, n0 + i] · x[r, k0 + j]: A(i, d) =
// d_out[begin + d, n0 + i], B(j, d) = x[begin + d, k0 + j]. Block (k tile x, n tile y, expert z).
__global__ void grouped_backward_weight_kernel(float* d_weight, const bf16* d_out, const bf16* x,
                                               const int32_t* offsets, int64_t rows, int64_t n, int64_t k) {
  __shared__ SharedTile a_tile, b_tile;
  const int e = static_cast<int>(blockIdx.z);
  int64_t begin = 0, end = 0;
  expert_rows(offsets, e, rows, &begin, &end);
  if (end == begin) return;  // an expert without rows adds nothing
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTile, k0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const Operand a{d_out + begin * n + n0, 1, n, n - n0, end - begin};
  const Operand b{x + begin * k + k0, 1, k, k - k0, end - begin};
  float acc[kPerThread][kPerThread] = {};
  tile_product<false, false>(acc, a, b, a_tile, b_tile);
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float* d_w = d_weight + static_cast<int64_t>(e) * n * k;
#pragma unroll
  for (int s = 0; s < kPerThread; ++s)
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int64_t i = n0 + ty + 16 * s, j = k0 + tx + 16 * u;
      if (i < n && j < k) d_w[i * k + j] += acc[s][u];
    }
}

// The row-tile slots of a forward or input-gradient grid: Σ_e ceil(n_e / 64) ≤ rows / 64 + experts.
unsigned row_tile_slots(int64_t rows, int64_t experts) {
  const int64_t slots = ceil_div(rows, kTile) + experts;
  LOOM_ASSERT(slots < (int64_t{1} << 31), "grouped_linear: too many rows for the grid");
  return static_cast<unsigned>(slots);
}

unsigned tiles_of(int64_t width, const char* what) {
  const int64_t tiles = ceil_div(width, kTile);
  LOOM_ASSERT(tiles <= 65535, std::string("grouped_linear: ") + what + " too wide for the grid");
  return static_cast<unsigned>(tiles);
}

}  // namespace

void grouped_linear_forward(bf16* out, const bf16* x, const bf16* weight, const int32_t* offsets,
                            int64_t experts, int64_t rows, int64_t n, int64_t k, cudaStream_t stream) {
  if (rows == 0 || n == 0 || experts == 0) return;
  const dim3 grid(row_tile_slots(rows, experts), tiles_of(n, "n"));
  grouped_forward_kernel<<<grid, kThreads, 0, stream>>>(out, x, weight, offsets, static_cast<int>(experts),
                                                        rows, n, k);
  LOOM_LAUNCH_CHECK();
}

void grouped_linear_backward_input(bf16* d_x, const bf16* d_out, const bf16* weight, const int32_t* offsets,
                                   int64_t experts, int64_t rows, int64_t n, int64_t k, cudaStream_t stream) {
  if (rows == 0 || k == 0 || experts == 0) return;
  const dim3 grid(row_tile_slots(rows, experts), tiles_of(k, "k"));
  grouped_backward_input_kernel<<<grid, kThreads, 0, stream>>>(d_x, d_out, weight, offsets,
                                                               static_cast<int>(experts), rows, n, k);
  LOOM_LAUNCH_CHECK();
}

void grouped_linear_backward_weight(float* d_weight, const bf16* d_out, const bf16* x, const int32_t* offsets,
                                    int64_t experts, int64_t rows, int64_t n, int64_t k,
                                    cudaStream_t stream) {
  if (rows == 0 || n == 0 || k == 0 || experts == 0) return;
  LOOM_ASSERT(experts <= 65535, "grouped_linear: too many experts for the grid");
  const dim3 grid(tiles_of(k, "k"), tiles_of(n, "n"), static_cast<unsigned>(experts));
  grouped_backward_weight_kernel<<<grid, kThreads, 0, stream>>>(d_weight, d_out, x, offsets, rows, n, k);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
