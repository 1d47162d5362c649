#include "ops/ops.h"

namespace loom {

void Ops::quantize(QuantizedTensor& q, Tensor x, bool amax_written) {
  if (q.scaling == Fp8Scaling::block) {
    if (q.blocks == Fp8Blocks::block128x128) {
      fp8_cast_blocks(q.data, q.data_t, q.scale_inv, q.scale_inv_t, x, q.format);
      return;
    }
    if (q.data.data) fp8_cast_rows(q.data, q.scale_inv, x, q.format);
    if (q.data_t.data) fp8_cast_columns(q.data_t, q.scale_inv_t, x, q.format);
    return;
  }
  if (!amax_written) amax(q.amax, x);
  fp8_cast(q.data, q.data_t, q.scale_inv, x, q.amax, q.format);
}

void Ops::gemm(Tensor out, const GemmOperand& a, const GemmOperand& b, bool accumulate,
               bool fast_accumulation) {
  LOOM_ASSERT(a.quantized() == b.quantized(), "a GEMM's operands are both plain or both quantized");
  if (!a.quantized()) {
    LOOM_ASSERT(!accumulate, "a plain GEMM writes its output");
    linear_forward(out, a.data, b.data, Tensor{});
    return;
  }
  LOOM_ASSERT(a.blocks.has_value() == b.blocks.has_value(), "a GEMM's operands share their scaling");
  if (a.blocks)
    fp8_gemm_blocks(out, a.data, a.scale_inv, *a.blocks, b.data, b.scale_inv, *b.blocks, accumulate);
  else
    fp8_gemm(out, a.data, a.scale_inv, b.data, b.scale_inv, accumulate, fast_accumulation);
}

}  // namespace loom
