#include "core/quantized_tensor.h"

#include <string>

#include "core/error.h"

namespace loom {

QuantizedTensor quantized_allocate(TensorAllocator& memory, int64_t rows, int64_t cols,
                                   const QuantizedLayout& layout, const char* what) {
  QuantizedTensor q;
  q.scaling = layout.scaling;
  q.format = layout.format;
  const int64_t padded = layout.padded_rows > 0 ? layout.padded_rows : rows;
  LOOM_ASSERT(padded >= rows, "a transposed FP8 copy holds at least the tensor's rows");
  const std::string name(what);
  const auto allocate = [&](Shape shape, DType dtype, const std::string& suffix) {
    return memory.allocate(std::move(shape), dtype, (name + suffix).c_str());
  };
  if (layout.scaling == Fp8Scaling::block) {
    q.blocks = q.blocks_t = layout.weight_blocks ? Fp8Blocks::block128x128 : Fp8Blocks::vec128;
    if (layout.rows) {
      q.data = allocate({rows, cols}, layout.format, "");
      q.scale_inv = allocate(fp8_block_scales_shape(q.blocks, rows, cols), DType::f32, " (block scales)");
    }
    if (layout.transposed) {
      q.data_t = allocate({cols, padded}, layout.format, " (transposed)");
      q.scale_inv_t = allocate(fp8_block_scales_shape(q.blocks_t, cols, padded), DType::f32,
                               " (transposed, block scales)");
    }
    return q;
  }
  LOOM_ASSERT(!layout.weight_blocks, "128 x 128 blocks are block scaling's");
  if (layout.rows) q.data = allocate({rows, cols}, layout.format, "");
  if (layout.transposed) q.data_t = allocate({cols, padded}, layout.format, " (transposed)");
  q.scale_inv = layout.scale_inv.data ? layout.scale_inv : allocate({1}, DType::f32, " (scale)");
  q.amax = layout.amax.data ? layout.amax : allocate({1}, DType::f32, " (amax)");
  q.scale_inv_t = q.scale_inv;
  return q;
}

}  // namespace loom
