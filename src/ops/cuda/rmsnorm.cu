// RMSNorm forward (plain and with the residual add fused in front) and backward.
// One block per token (the backward: per token of a grid-stride loop), each thread holding
// kVecs 16-byte vectors of eight values of the row in registers, so a row is read from
// memory once. Hidden sizes are 1,024 to 5,120 and a multiple of 8: with up to 256 threads that is
// one to three vectors a thread.
#include <algorithm>
#include <type_traits>

#include "core/error.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/launch.h"
#include "ops/op_workspace.h"

namespace loom::cuda {
namespace {

constexpr int kMaxThreads = 256;
constexpr int kMaxVecs = 4;  // hidden ≤ 8 · 256 · 4 = 8,192

struct RowShape {
  int threads;  // a multiple of 32
  int vecs;     // 16-byte vectors per thread
};

RowShape row_shape(int64_t hidden) {
  LOOM_ASSERT(hidden % 8 == 0 && hidden <= 8 * kMaxThreads * kMaxVecs,
              "rmsnorm: the CUDA kernels need a hidden size that is a multiple of 8 and at most 8,192");
  // As few vectors a thread as 256 threads allow, then as few threads as hold the row: at
  // hidden 2,560, 160 threads of 2 vectors rather than 256 whose second vector is a quarter
  // used (the backward's registers allow two blocks of 256 a multiprocessor, three of 160).
  const int64_t vectors = hidden / 8;
  const int64_t vecs = ceil_div(vectors, kMaxThreads);
  return {static_cast<int>(ceil_div(ceil_div(vectors, vecs), 32) * 32), static_cast<int>(vecs)};
}

// `amax` (may be null, here and in the backward): max |out| joined into it (ops.h out_amax).
template <int kVecs>
__global__ void rmsnorm_forward_kernel(bf16* out, float* rstd, float* amax, bf16* residual_out, const bf16* x,
                                       const bf16* delta, const bf16* weight, int64_t hidden, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x * hidden, vectors = hidden / 8;
  float values[kVecs][8];
  float sum_sq = 0;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (v >= vectors) continue;
    load_bf16x8(x + row + v * 8, values[j]);
    if (delta) {
      float d[8];
      load_bf16x8(delta + row + v * 8, d);
#pragma unroll
      for (int e = 0; e < 8; ++e) values[j][e] = __bfloat162float(__float2bfloat16(values[j][e] + d[e]));
      store_bf16x8(residual_out + row + v * 8, values[j]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_sq += values[j][e] * values[j][e];
  }
  const float r = rsqrtf(block_sum(sum_sq, shared) / static_cast<float>(hidden) + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
  float most = 0.0f;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (v >= vectors) continue;
    float w[8], o[8];
    load_bf16x8(weight + v * 8, w);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      o[e] = values[j][e] * r * w[e];
      most = fmaxf(most, stored_magnitude(o[e]));
    }
    store_bf16x8(out + row + v * 8, o);
  }
  if (amax) block_amax_into(amax, most);
}

// d_x and this block's partial of d_weight over tokens blockIdx.x, + gridDim.x, ...
// The loop is latency-bound (a block reduction a token), so a token's loads (x, dy, and
// d_x, which the backward adds to) are issued one token ahead, into registers held as
// 16-byte words: the next token's bytes are in flight while this one is reduced.
template <int kVecs>
__global__ void rmsnorm_backward_kernel(bf16* d_x, float* weight_partials, float* amax, const bf16* d_out,
                                        const bf16* x, const bf16* weight, const float* rstd, int64_t tokens,
                                        int64_t hidden) {
  __shared__ float shared[32];
  const int64_t vectors = hidden / 8;
  struct TokenWords {
    uint4 x[kVecs], dy[kVecs], dx[kVecs];
    float r;
  };
  auto load = [&](int64_t t, TokenWords& words) {
    if (t >= tokens) return;
    words.r = rstd[t];
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (v >= vectors) continue;
      const int64_t at = t * hidden + v * 8;
      words.x[j] = *reinterpret_cast<const uint4*>(x + at);
      words.dy[j] = *reinterpret_cast<const uint4*>(d_out + at);
      words.dx[j] = *reinterpret_cast<const uint4*>(d_x + at);
    }
  };
  float w[kVecs][8], acc[kVecs][8];
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
#pragma unroll
    for (int e = 0; e < 8; ++e) w[j][e] = acc[j][e] = 0;
    if (v < vectors) load_bf16x8(weight + v * 8, w[j]);
  }
  TokenWords next;
  load(blockIdx.x, next);
  float most = 0.0f;
  for (int64_t t = blockIdx.x; t < tokens; t += gridDim.x) {
    const TokenWords now = next;
    load(t + gridDim.x, next);
    const float r = now.r;
    const int64_t row = t * hidden;
    float xs[kVecs][8], dy[kVecs][8];
    float dot = 0;  // Σ w·dy·x̂
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (v >= vectors) continue;
      unpack_bf16x8(now.x[j], xs[j]);
      unpack_bf16x8(now.dy[j], dy[j]);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot += w[j][e] * dy[j][e] * xs[j][e] * r;
    }
    const float mean = block_sum(dot, shared) / static_cast<float>(hidden);
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
      if (v >= vectors) continue;
      float dx[8];
      unpack_bf16x8(now.dx[j], dx);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float x_hat = xs[j][e] * r;
        dx[e] += r * (w[j][e] * dy[j][e] - x_hat * mean);
        most = fmaxf(most, stored_magnitude(dx[e]));
        acc[j][e] += dy[j][e] * x_hat;
      }
      store_bf16x8(d_x + row + v * 8, dx);
    }
  }
  float* partial = weight_partials + blockIdx.x * hidden;
#pragma unroll
  for (int j = 0; j < kVecs; ++j) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (v >= vectors) continue;
    auto* out = reinterpret_cast<float4*>(partial + v * 8);
    out[0] = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
    out[1] = make_float4(acc[j][4], acc[j][5], acc[j][6], acc[j][7]);
  }
  if (amax) block_amax_into(amax, most);
}

// d_weight[col] += Σ_b partials[b][col]. A block takes 32 columns; its thread (col, row)
// adds blocks row, row + 32, ... of its column, then the 32 row sums are added in a fixed
// tree, so the order depends on nothing but the block count. One thread a column walking
// all the partials in turn would keep a handful of multiprocessors busy with a
// latency-bound chain of loads.
constexpr int kPartialColumns = 32, kPartialRows = 32;

__global__ void add_partials_kernel(float* d_weight, const float* partials, int64_t blocks, int64_t width) {
  __shared__ float sums[kPartialRows][kPartialColumns + 1];
  const int64_t col = blockIdx.x * static_cast<int64_t>(kPartialColumns) + threadIdx.x;
  float sum = 0;
  if (col < width) {
#pragma unroll 8
    for (int64_t b = threadIdx.y; b < blocks; b += kPartialRows) sum += partials[b * width + col];
  }
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kPartialRows / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.y) < stride)
      sums[threadIdx.y][threadIdx.x] += sums[threadIdx.y + stride][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && col < width) d_weight[col] += sums[0][threadIdx.x];
}

// The backward's weight-gradient partials (ops/op_workspace.h): each block adds its tokens'
// dy·x̂ per column in registers, then add_partials adds the partials in a fixed order.
int64_t weight_grad_blocks(int64_t tokens) {
  return op_workspace::rmsnorm_weight_grad_blocks(tokens, multiprocessor_count());
}

// Runs launch(std::integral_constant<int, kVecs>) for the row shape's vector count, so
// each kernel is instantiated for 1 to kMaxVecs vectors a thread.
template <typename Launch>
void with_vecs(int vecs, Launch launch) {
  switch (vecs) {
    case 1: launch(std::integral_constant<int, 1>{}); break;
    case 2: launch(std::integral_constant<int, 2>{}); break;
    case 3: launch(std::integral_constant<int, 3>{}); break;
    default: launch(std::integral_constant<int, kMaxVecs>{}); break;
  }
  LOOM_LAUNCH_CHECK();
}

}  // namespace

void add_partials(float* d_weight, const float* partials, int64_t blocks, int64_t width,
                  cudaStream_t stream) {
  const dim3 threads(kPartialColumns, kPartialRows);
  add_partials_kernel<<<static_cast<unsigned>(ceil_div(width, kPartialColumns)), threads, 0, stream>>>(
      d_weight, partials, blocks, width);
  LOOM_LAUNCH_CHECK();
}

void rmsnorm_forward(bf16* out, float* rstd, float* amax, const bf16* x, const bf16* weight, int64_t tokens,
                     int64_t hidden, float eps, cudaStream_t stream) {
  if (amax) LOOM_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (tokens == 0) return;
  const RowShape shape = row_shape(hidden);
  with_vecs(shape.vecs, [&](auto vecs) {
    rmsnorm_forward_kernel<decltype(vecs)::value>
        <<<static_cast<unsigned>(tokens), shape.threads, 0, stream>>>(out, rstd, amax, nullptr, x, nullptr,
                                                                      weight, hidden, eps);
  });
}

void residual_rmsnorm_forward(bf16* residual_out, bf16* out, float* rstd, float* amax, const bf16* residual,
                              const bf16* delta, const bf16* weight, int64_t tokens, int64_t hidden,
                              float eps, cudaStream_t stream) {
  if (amax) LOOM_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (tokens == 0) return;
  const RowShape shape = row_shape(hidden);
  with_vecs(shape.vecs, [&](auto vecs) {
    rmsnorm_forward_kernel<decltype(vecs)::value>
        <<<static_cast<unsigned>(tokens), shape.threads, 0, stream>>>(out, rstd, amax, residual_out, residual,
                                                                      delta, weight, hidden, eps);
  });
}

int64_t rmsnorm_backward_scratch_bytes(int64_t tokens, int64_t hidden) {
  return op_workspace::rmsnorm_backward_bytes(tokens, hidden, multiprocessor_count());
}

void rmsnorm_backward(bf16* d_x, float* d_weight, float* amax, const bf16* d_out, const bf16* x,
                      const bf16* weight, const float* rstd, int64_t tokens, int64_t hidden, Scratch scratch,
                      cudaStream_t stream) {
  if (amax) LOOM_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  if (tokens == 0) return;
  const int64_t blocks = weight_grad_blocks(tokens);
  LOOM_ASSERT(scratch.bytes >= rmsnorm_backward_scratch_bytes(tokens, hidden),
              "rmsnorm_backward scratch too small");
  float* partials = static_cast<float*>(scratch.data);
  const RowShape shape = row_shape(hidden);
  with_vecs(shape.vecs, [&](auto vecs) {
    rmsnorm_backward_kernel<decltype(vecs)::value>
        <<<static_cast<unsigned>(blocks), shape.threads, 0, stream>>>(d_x, partials, amax, d_out, x, weight,
                                                                      rstd, tokens, hidden);
  });
  if (d_weight) add_partials(d_weight, partials, blocks, hidden, stream);  // null: a frozen norm
}

}  // namespace loom::cuda
