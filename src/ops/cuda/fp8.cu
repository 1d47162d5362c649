// FP8 casts (ops.h amax, fp8_cast, and the block-scaled fp8_cast_rows / _columns / _blocks;
// core/fp8.h states the numbers): the amax of a tensor and its scaled FP8 form, row-major
// and/or transposed, from one read of the bf16 tensor; under block scaling each block's amax
// and scale are found in the cast itself.
#include <cuda_fp8.h>

#include <cfloat>

#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"

namespace loom::cuda {
namespace {

__device__ inline float magnitude(float v) {
  return fabsf(v);
}
__device__ inline float magnitude(bf16 v) {
  return fabsf(__bfloat162float(v));
}

template <typename T>
__global__ void amax_kernel(float* amax, const T* x, int64_t n) {
  float most = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    most = fmaxf(most, magnitude(x[i]));
  block_amax_into(amax, most);
}

// The same on eight bf16 values a thread through 16-byte loads (n a multiple of 8).
__global__ void amax_bf16x8_kernel(float* amax, const bf16* x, int64_t n) {
  float most = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n / 8;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float v[8];
    unpack_bf16x8(reinterpret_cast<const uint4*>(x)[i], v);
#pragma unroll
    for (int e = 0; e < 8; ++e) most = fmaxf(most, fabsf(v[e]));
  }
  block_amax_into(amax, most);
}

// core/fp8.h fp8_scale, with IEEE division whatever the compiler's flags.
__device__ inline float fp8_scale(float amax, float format_max) {
  if (!(amax > 0.0f) || isinf(amax)) return 1.0f;
  const float scale = __fdiv_rn(format_max, amax);
  return isinf(scale) ? FLT_MAX : scale;
}

__device__ inline uint8_t to_fp8(float v, float scale, __nv_fp8_interpretation_t format) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, scale), __NV_SATFINITE, format);
}

// One 64 × 64 tile of x [rows, cols] a block of 256 threads: each thread reads eight
// neighbouring values of a row (a 16-byte load) and writes their eight FP8 bytes to out (8
// bytes); the tile's bytes go through shared memory as 32-bit words to out_t [cols, ld]: each
// thread transposes one 4 × 4 block of bytes in registers and writes four words, one to each
// of four rows of out_t, zeros past x's rows. cols and ld multiples of 8 (ld of 4 suffices).
constexpr int kTile = 64;
constexpr int kTileWords = kTile / 4;
__global__ void fp8_cast_kernel(uint8_t* out, uint8_t* out_t, int64_t ld, float* scale_inv, const bf16* x,
                                const float* amax, int64_t rows, int64_t cols, float format_max,
                                __nv_fp8_interpretation_t format) {
  __shared__ uint32_t tile[kTile][kTileWords + 1];  // +1: rows 4 apart fall in other banks
  const float scale = fp8_scale(*amax, format_max);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *scale_inv = __fdiv_rn(1.0f, scale);
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile,
                col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int lane_col = (threadIdx.x % 8) * 8, lane_row = static_cast<int>(threadIdx.x / 8);
#pragma unroll
  for (int pass = 0; pass < 2; ++pass) {
    const int r = lane_row + pass * 32;
    const int64_t row = row0 + r, col = col0 + lane_col;
    uint2 q = {0u, 0u};
    if (row < rows && col < cols) {
      float v[8];
      unpack_bf16x8(*reinterpret_cast<const uint4*>(x + row * cols + col), v);
      uint8_t bytes[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) bytes[e] = to_fp8(v[e], scale, format);
      q = *reinterpret_cast<const uint2*>(bytes);
      if (out) *reinterpret_cast<uint2*>(out + row * cols + col) = q;
    }
    tile[r][lane_col / 4] = q.x;
    tile[r][lane_col / 4 + 1] = q.y;
  }
  if (!out_t) return;
  __syncthreads();
  // Thread: tile rows 4·block_row.. (out_t's columns), tile word column `word` (out_t's rows
  // 4·word..); block_row fastest, so a warp writes 64 bytes of each of two rows of out_t.
  const int block_row = static_cast<int>(threadIdx.x % 16), word = static_cast<int>(threadIdx.x / 16);
  uint32_t in[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) in[i] = tile[4 * block_row + i][word];
  // Byte j of transposed word k is byte k of word j.
  const uint32_t lo01 = __byte_perm(in[0], in[1], 0x5140), hi01 = __byte_perm(in[0], in[1], 0x7362);
  const uint32_t lo23 = __byte_perm(in[2], in[3], 0x5140), hi23 = __byte_perm(in[2], in[3], 0x7362);
  const uint32_t t[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                         __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
  const int64_t row = row0 + 4 * block_row;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t col = col0 + 4 * word + k;
    if (col < cols && row < ld) *reinterpret_cast<uint32_t*>(out_t + col * ld + row) = t[k];
  }
}

// core/fp8.h fp8_block_scale: fp8_scale's power of two at or below (mantissa bits cleared).
__device__ inline float fp8_block_scale(float amax, float format_max) {
  return __uint_as_float(__float_as_uint(fp8_scale(amax, format_max)) & 0xff800000u);
}

// 1 × 128 blocks along the rows of x [rows, cols]: half a warp a block, each thread eight
// values (a 16-byte load), the block's amax by shuffles within the half warp; 16 blocks (16
// rows of one column block) a thread block. Rows past x's compute on zeros and store nothing.
__global__ void fp8_cast_rows_kernel(uint8_t* out, float* scale_inv, const bf16* x, int64_t rows,
                                     int64_t cols, float format_max, __nv_fp8_interpretation_t format) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * 16 + threadIdx.x / 16;
  const int64_t block = blockIdx.y, col = block * 128 + (threadIdx.x % 16) * 8;
  float v[8] = {};
  if (row < rows) unpack_bf16x8(*reinterpret_cast<const uint4*>(x + row * cols + col), v);
  float most = 0.0f;
#pragma unroll
  for (int e = 0; e < 8; ++e) most = fmaxf(most, fabsf(v[e]));
  for (int offset = 8; offset > 0; offset /= 2)
    most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, offset));
  if (row >= rows) return;
  const float scale = fp8_block_scale(most, format_max);
  if (threadIdx.x % 16 == 0) scale_inv[block * rows + row] = __fdiv_rn(1.0f, scale);
  alignas(8) uint8_t bytes[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) bytes[e] = to_fp8(v[e], scale, format);
  *reinterpret_cast<uint2*>(out + row * cols + col) = *reinterpret_cast<const uint2*>(bytes);
}

// 1 × 128 blocks along the columns of x [rows, cols], written transposed: out_t [cols, ld].
// A thread block takes 128 rows × 64 columns: each thread eight neighbouring values of a row
// (16-byte loads) in four rows 32 apart, kept in registers; the column maxima meet in shared
// memory, then the FP8 bytes go through a shared tile to be written 128 contiguous bytes a
// row of out_t. Rows past x's are zeros (their block's amax is that of the rest, or 0).
constexpr int kColumnTile = 64;
constexpr int kColumnStride = kColumnTile + 1;  // bytes: the transposed reads fall in other banks
__global__ void fp8_cast_columns_kernel(uint8_t* out_t, int64_t ld, float* scale_inv, const bf16* x,
                                        int64_t rows, int64_t cols, float format_max,
                                        __nv_fp8_interpretation_t format) {
  __shared__ float partial[32][kColumnTile];
  __shared__ float scales[kColumnTile];
  __shared__ uint8_t tile[128 * kColumnStride];
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * kColumnTile,
                row0 = static_cast<int64_t>(blockIdx.y) * 128;
  const int lane_col = (threadIdx.x % 8) * 8, lane_row = static_cast<int>(threadIdx.x / 8);
  float v[4][8] = {};
  float most[8] = {};
#pragma unroll
  for (int pass = 0; pass < 4; ++pass) {
    const int64_t row = row0 + pass * 32 + lane_row;
    if (row < rows) unpack_bf16x8(*reinterpret_cast<const uint4*>(x + row * cols + col0 + lane_col), v[pass]);
#pragma unroll
    for (int e = 0; e < 8; ++e) most[e] = fmaxf(most[e], fabsf(v[pass][e]));
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) partial[lane_row][lane_col + e] = most[e];
  __syncthreads();
  if (threadIdx.x < kColumnTile) {
    float column = 0.0f;
    for (int i = 0; i < 32; ++i) column = fmaxf(column, partial[i][threadIdx.x]);
    const float scale = fp8_block_scale(column, format_max);
    scales[threadIdx.x] = scale;
    scale_inv[blockIdx.y * cols + col0 + threadIdx.x] = __fdiv_rn(1.0f, scale);
  }
  __syncthreads();
#pragma unroll
  for (int pass = 0; pass < 4; ++pass)
#pragma unroll
    for (int e = 0; e < 8; ++e)
      tile[(pass * 32 + lane_row) * kColumnStride + lane_col + e] =
          to_fp8(v[pass][e], scales[lane_col + e], format);
  __syncthreads();
  // Thread: 32 bytes (rows seg..seg+31 of the tile) of out_t's row col0 + out_row.
  const int out_row = static_cast<int>(threadIdx.x / 4), seg = static_cast<int>(threadIdx.x % 4) * 32;
  alignas(16) uint8_t bytes[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) bytes[i] = tile[(seg + i) * kColumnStride + out_row];
  auto* target = reinterpret_cast<uint4*>(out_t + (col0 + out_row) * ld + row0 + seg);
  target[0] = *reinterpret_cast<const uint4*>(bytes);
  target[1] = *reinterpret_cast<const uint4*>(bytes + 16);
}

// 128 × 128 blocks of w [rows, cols]: a thread block a block, each thread eight neighbouring
// values of a row (16-byte loads) in eight rows 16 apart; the block's amax by shuffles and
// shared memory; out written directly, out_t through a shared tile, 64 contiguous bytes a
// thread. Thread 0 writes the block's inverse scale to both layouts and, in the last block of
// a row of scales, that row's padding.
constexpr int kBlockStride = 128 + 1;  // bytes: the transposed reads fall in other banks
__global__ void fp8_cast_blocks_kernel(uint8_t* out, uint8_t* out_t, float* scale_inv, int64_t ld,
                                       float* scale_inv_t, int64_t ld_t, const bf16* w, int64_t rows,
                                       int64_t cols, float format_max, __nv_fp8_interpretation_t format) {
  __shared__ uint8_t tile[128 * kBlockStride];
  __shared__ float warps[8];
  const int64_t col0 = static_cast<int64_t>(blockIdx.x) * 128, row0 = static_cast<int64_t>(blockIdx.y) * 128;
  const int lane_col = (threadIdx.x % 16) * 8, lane_row = static_cast<int>(threadIdx.x / 16);
  float v[8][8];
  float most = 0.0f;
#pragma unroll
  for (int pass = 0; pass < 8; ++pass) {
    unpack_bf16x8(*reinterpret_cast<const uint4*>(w + (row0 + pass * 16 + lane_row) * cols + col0 + lane_col),
                  v[pass]);
#pragma unroll
    for (int e = 0; e < 8; ++e) most = fmaxf(most, fabsf(v[pass][e]));
  }
  for (int offset = 16; offset > 0; offset /= 2)
    most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, offset));
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = most;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 8; ++i) most = fmaxf(most, warps[i]);
  const float scale = fp8_block_scale(most, format_max);
  if (threadIdx.x == 0) {
    const float inv = __fdiv_rn(1.0f, scale);
    scale_inv[blockIdx.y * ld + blockIdx.x] = inv;
    scale_inv_t[blockIdx.x * ld_t + blockIdx.y] = inv;
    if (blockIdx.x == gridDim.x - 1)
      for (int64_t j = gridDim.x; j < ld; ++j) scale_inv[blockIdx.y * ld + j] = 0.0f;
    if (blockIdx.y == gridDim.y - 1)
      for (int64_t j = gridDim.y; j < ld_t; ++j) scale_inv_t[blockIdx.x * ld_t + j] = 0.0f;
  }
#pragma unroll
  for (int pass = 0; pass < 8; ++pass) {
    const int r = pass * 16 + lane_row;
    alignas(8) uint8_t bytes[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      bytes[e] = to_fp8(v[pass][e], scale, format);
      tile[r * kBlockStride + lane_col + e] = bytes[e];
    }
    *reinterpret_cast<uint2*>(out + (row0 + r) * cols + col0 + lane_col) =
        *reinterpret_cast<const uint2*>(bytes);
  }
  __syncthreads();
  // Thread: 64 bytes (tile rows seg..seg+63) of out_t's row col0 + out_row.
  const int out_row = static_cast<int>(threadIdx.x / 2), seg = static_cast<int>(threadIdx.x % 2) * 64;
  auto* target = reinterpret_cast<uint4*>(out_t + (col0 + out_row) * rows + row0 + seg);
#pragma unroll
  for (int part = 0; part < 4; ++part) {
    alignas(16) uint8_t bytes[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) bytes[i] = tile[(seg + part * 16 + i) * kBlockStride + out_row];
    target[part] = *reinterpret_cast<const uint4*>(bytes);
  }
}

// The census of a cast (ops.h fp8_census): eight values a thread (cols a multiple of 8, so the
// eight share one block's scale), the counts summed within the warp and added once a warp,
// the amax through block_amax_into. scale_layout: 0 one scale, 1 vec128 [cols/128, rows],
// 2 block128x128 [rows/128, scale_ld].
__global__ void fp8_census_kernel(unsigned long long* counts, float* amax, const bf16* x, const uint8_t* q,
                                  const float* scale_inv, int scale_layout, int64_t scale_ld, int64_t rows,
                                  int64_t cols, float bound) {
  float most = 0.0f;
  unsigned long long flushed = 0, clamped = 0;
  const int64_t chunks = rows * cols / 8;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i * 8 / cols, col = i * 8 % cols;
    const float inverse = scale_layout == 0   ? scale_inv[0]
                          : scale_layout == 1 ? scale_inv[(col / 128) * rows + row]
                                              : scale_inv[(row / 128) * scale_ld + col / 128];
    const float limit = __fmul_rn(bound, inverse);
    float v[8];
    unpack_bf16x8(reinterpret_cast<const uint4*>(x)[i], v);
    const uint2 packed = reinterpret_cast<const uint2*>(q)[i];
    const auto* bytes = reinterpret_cast<const uint8_t*>(&packed);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      most = fmaxf(most, fabsf(v[e]));
      flushed += v[e] != 0.0f && (bytes[e] & 0x7f) == 0;
      clamped += fabsf(v[e]) > limit;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    flushed += __shfl_xor_sync(0xffffffffu, flushed, offset);
    clamped += __shfl_xor_sync(0xffffffffu, clamped, offset);
  }
  if (threadIdx.x % 32 == 0 && (flushed | clamped) != 0) {
    atomicAdd(counts, flushed);
    atomicAdd(counts + 1, clamped);
  }
  block_amax_into(amax, most);
}

unsigned amax_grid(int64_t n) {
  return elementwise_grid(n) > 0 ? elementwise_grid(n) : 1;
}

}  // namespace

void amax(float* result, const bf16* x, int64_t n, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(float), stream));
  if (n == 0) return;
  if (n % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
    amax_bf16x8_kernel<<<amax_grid(n / 8), 256, 0, stream>>>(result, x, n);
  else
    amax_kernel<<<amax_grid(n), 256, 0, stream>>>(result, x, n);
  LOOM_LAUNCH_CHECK();
}

void amax(float* result, const float* x, int64_t n, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(result, 0, sizeof(float), stream));
  if (n == 0) return;
  amax_kernel<<<amax_grid(n), 256, 0, stream>>>(result, x, n);
  LOOM_LAUNCH_CHECK();
}

void fp8_cast(uint8_t* out, uint8_t* out_t, int64_t out_t_rows, float* scale_inv, const bf16* x,
              const float* amax, int64_t rows, int64_t cols, bool e5m2, cudaStream_t stream) {
  const int64_t tiled_rows = out_t ? out_t_rows : rows;  // the zero columns of out_t are written too
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)),
                  static_cast<unsigned>(ceil_div(tiled_rows, kTile)));
  fp8_cast_kernel<<<grid, 256, 0, stream>>>(out, out_t, out_t_rows, scale_inv, x, amax, rows, cols,
                                            e5m2 ? 57344.0f : 448.0f, e5m2 ? __NV_E5M2 : __NV_E4M3);
  LOOM_LAUNCH_CHECK();
}

void fp8_cast_rows(uint8_t* out, float* scale_inv, const bf16* x, int64_t rows, int64_t cols, bool e5m2,
                   cudaStream_t stream) {
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(rows, 16)), static_cast<unsigned>(cols / 128));
  fp8_cast_rows_kernel<<<grid, 256, 0, stream>>>(out, scale_inv, x, rows, cols, e5m2 ? 57344.0f : 448.0f,
                                                 e5m2 ? __NV_E5M2 : __NV_E4M3);
  LOOM_LAUNCH_CHECK();
}

void fp8_cast_columns(uint8_t* out_t, int64_t out_t_rows, float* scale_inv, const bf16* x, int64_t rows,
                      int64_t cols, bool e5m2, cudaStream_t stream) {
  if (out_t_rows == 0) return;
  const dim3 grid(static_cast<unsigned>(cols / kColumnTile), static_cast<unsigned>(out_t_rows / 128));
  fp8_cast_columns_kernel<<<grid, 256, 0, stream>>>(out_t, out_t_rows, scale_inv, x, rows, cols,
                                                    e5m2 ? 57344.0f : 448.0f, e5m2 ? __NV_E5M2 : __NV_E4M3);
  LOOM_LAUNCH_CHECK();
}

void fp8_cast_blocks(uint8_t* out, uint8_t* out_t, float* scale_inv, int64_t ld, float* scale_inv_t,
                     int64_t ld_t, const bf16* w, int64_t rows, int64_t cols, bool e5m2,
                     cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(cols / 128), static_cast<unsigned>(rows / 128));
  fp8_cast_blocks_kernel<<<grid, 256, 0, stream>>>(out, out_t, scale_inv, ld, scale_inv_t, ld_t, w, rows,
                                                   cols, e5m2 ? 57344.0f : 448.0f,
                                                   e5m2 ? __NV_E5M2 : __NV_E4M3);
  LOOM_LAUNCH_CHECK();
}

void fp8_census(int64_t* counts, float* amax, const bf16* x, const uint8_t* q, const float* scale_inv,
                int scale_layout, int64_t scale_ld, int64_t rows, int64_t cols, bool e5m2,
                cudaStream_t stream) {
  const int64_t chunks = rows * cols / 8;
  if (chunks == 0) return;
  fp8_census_kernel<<<amax_grid(chunks), 256, 0, stream>>>(reinterpret_cast<unsigned long long*>(counts),
                                                           amax, x, q, scale_inv, scale_layout, scale_ld,
                                                           rows, cols, e5m2 ? 61440.0f : 464.0f);
  LOOM_LAUNCH_CHECK();
}

}  // namespace loom::cuda
