// Gradient norm and clipping, as Megatron's get_grad_norm_fp32 and clip_grad_by_total_norm_fp32
// (core 0.16) over the fp32 main grads.
//
// Megatron sums squares per shard, all-reduces the sums, takes sqrt in Python double, computes
// clip_coeff = clip / (norm + 1e-6) in double and multiplies the grads by it (as a float) only
// when clip_coeff < 1.0. Note that this also scales grads whose norm is just below the clip:
// any norm > clip − 1e-6. A NaN norm gives a NaN coefficient, which is not < 1: no scaling.
#pragma once

#include <cstdint>

namespace loom {

// Elements per partial sum of grad_sum_squares.
inline constexpr int64_t kGradNormChunk = 1 << 16;

// Σ g² over grad[0, n), each g² exact in double. Deterministic regardless of thread count: the
// array is cut into fixed chunks of kGradNormChunk elements, each chunk summed in order in
// double, and the chunk sums added in chunk order. Sum these across shards (DP, TP, PP) before
// the sqrt.
double grad_sum_squares(const float* grad, int64_t n);

// sqrt(grad_sum_squares(grad, n)): the L2 norm of one unsharded array.
double grad_norm_l2(const float* grad, int64_t n);

// clip / (norm + 1e-6) when that is < 1, else 1. clip ≤ 0 means no clipping (Megatron only
// clips when clip_grad > 0) and gives 1.
float grad_clip_coefficient(double norm, double clip);

// grad[i] *= factor in fp32 (TE multi_tensor_scale), threaded.
void grad_scale(float* grad, int64_t n, float factor);

}  // namespace loom
