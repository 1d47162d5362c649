// A tensor in an FP8 format as the GEMMs read it (docs/numerics.md, "FP8 linear layers"):
// the value a linear layer makes from a bf16 tensor (Ops::quantize) and a GEMM consumes
// (Ops::gemm), as TransformerEngine's Float8Tensor carries its data, transpose and scales.
//
// Hopper's FP8 GEMMs read both operands with their summed dimension K contiguous (TN only),
// so a tensor that one GEMM sums over its columns and another over its rows keeps both
// orientations: `data` [R, C] and `data_t` [C, R'] (R' ≥ R: the token count padded to what
// the GEMM needs, the columns from R on written 0). A value holds whichever its GEMMs read.
//
// Scaling (workload.fp8.scaling):
//   tensor  one current scale for the whole tensor from its amax (core/fp8.h fp8_scale):
//           scale_inv and scale_inv_t are the same f32[1]; amax f32[1] is kept beside them
//   block   DeepSeek-V3's power-of-two scales per block of 128 values, found by the cast:
//           scale_inv holds data's in its `blocks` layout, scale_inv_t data_t's in
//           `blocks_t`; no amax
#pragma once

#include <cstdint>
#include <optional>

#include "core/allocator.h"
#include "core/fp8.h"
#include "core/tensor.h"

namespace loom {

// How FP8 tensors are scaled (above; workload.fp8.scaling).
enum class Fp8Scaling : uint8_t { tensor, block };

// The block layouts of a block-scaled operand's inverse scales, viewed as the row-major
// [R, K] a GEMM reads (K contiguous, summed), f32 in one of cuBLASLt's sm_90 layouts:
//   vec128        one per 128 consecutive values of a row: [ceil(K/128), R], R contiguous
//   block128x128  one per 128 × 128 block: [ceil(R/128), S], the K-block contiguous, S =
//                 ceil(K/128) rounded up to 4 (16-byte rows; the padding written 0). The
//                 unpadded case (S = ceil(K/128)) is the layout PyTorch's _scaled_mm checks;
//                 the padded stride follows cuBLASLt's 16-byte rule (test_cuda_fp8's
//                 BlockGemmReadsPaddedScaleRows)
enum class Fp8Blocks : uint8_t { vec128, block128x128 };

// The shape of the inverse scales of an operand [rows, cols] (cols contiguous, summed).
inline Shape fp8_block_scales_shape(Fp8Blocks blocks, int64_t rows, int64_t cols) {
  const auto blocks_of = [](int64_t n) { return (n + kFp8BlockSize - 1) / kFp8BlockSize; };
  if (blocks == Fp8Blocks::vec128) return {blocks_of(cols), rows};
  return {blocks_of(rows), (blocks_of(cols) + 3) / 4 * 4};
}

// One operand of a GEMM out = a · bᵀ, [rows, K] with K contiguous: a plain tensor of the
// activation dtype (scale_inv empty), or an FP8 tensor with its inverse scale: f32[1] under
// tensor scaling, else its blocks' in the `blocks` layout.
struct GemmOperand {
  Tensor data;
  Tensor scale_inv;
  std::optional<Fp8Blocks> blocks;
  bool quantized() const { return scale_inv.data != nullptr; }
};

struct QuantizedTensor {
  Fp8Scaling scaling = Fp8Scaling::tensor;
  DType format = DType::e4m3;
  Tensor data, data_t;
  Tensor scale_inv, scale_inv_t;
  Tensor amax;
  Fp8Blocks blocks = Fp8Blocks::vec128, blocks_t = Fp8Blocks::vec128;

  // The GEMM operand of each orientation: data [R, C] summed over C, data_t [C, R'] over R'.
  GemmOperand operand() const { return {data, scale_inv, block_layout(blocks)}; }
  GemmOperand transposed() const { return {data_t, scale_inv_t, block_layout(blocks_t)}; }

 private:
  std::optional<Fp8Blocks> block_layout(Fp8Blocks b) const {
    return scaling == Fp8Scaling::block ? std::optional<Fp8Blocks>(b) : std::nullopt;
  }
};

// What a quantized value of an [R, C] tensor holds (quantized_allocate).
struct QuantizedLayout {
  Fp8Scaling scaling = Fp8Scaling::tensor;
  DType format = DType::e4m3;
  bool rows = true;         // data [R, C]
  bool transposed = true;   // data_t [C, padded_rows]
  int64_t padded_rows = 0;  // R' of data_t (≥ R); 0: R
  // Block scaling: a weight's 128 × 128 blocks (both orientations), else 1 × 128 blocks
  // along each orientation's contiguous dimension.
  bool weight_blocks = false;
  // Tensor scaling: the amax's and inverse scale's memory (f32[1] each) where the caller has
  // it (a layer keeps them beside its activations for the backward; an op producing the
  // tensor wrote the amax into its slot), else allocated.
  Tensor amax, scale_inv;
};

// A quantized value of an [rows, cols] tensor laid out as `layout` says, its tensors from
// `memory` (`what` names them in an out-of-memory message).
QuantizedTensor quantized_allocate(TensorAllocator& memory, int64_t rows, int64_t cols,
                                   const QuantizedLayout& layout, const char* what);

}  // namespace loom
