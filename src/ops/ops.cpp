#include "ops/ops.h"

#include <string>

namespace loom {

int64_t lora_up_check(const char* op, Tensor out, Tensor t, const std::vector<LoraUp>& adapters, DType act,
                      DType weight, bool grads) {
  if (adapters.empty() || out.shape.ndim != 2 || t.shape.ndim != 2 || t.shape[1] % adapters.size() != 0)
    throw InputError(std::string(op) + ": expected out [T, N] and t [T, J·r] for J = " +
                     std::to_string(adapters.size()) + " adapters");
  const int64_t tokens = out.shape[0], n = out.shape[1];
  const int64_t r = t.shape[1] / static_cast<int64_t>(adapters.size());
  check_tensor(op, "out", out, act, {tokens, n});
  check_tensor(op, "t", t, act, {tokens, t.shape[1]});
  for (const LoraUp& a : adapters) {
    if (a.b.shape.ndim != 2 || a.column < 0 || a.column + a.b.shape[0] > n)
      throw InputError(std::string(op) + ": an adapter's B [N_j, r] must fit in out's " + std::to_string(n) +
                       " columns from its column " + std::to_string(a.column));
    check_tensor(op, "b", a.b, weight, {a.b.shape[0], r});
    if (grads) check_tensor(op, "d_b", a.d_b, DType::f32, {a.b.shape[0], r});
  }
  return r;
}

void lora_dropout_check(Tensor out, Tensor x, const LoraDropoutMask& mask, DType act) {
  if (x.shape.ndim != 2) throw InputError("lora_dropout: expected x [T, K], found " + x.shape.str());
  const int64_t tokens = x.shape[0], k = x.shape[1];
  check_tensor("lora_dropout", "x", x, act, {tokens, k});
  check_tensor("lora_dropout", "out", out, act, {tokens, k});
  check_tensor("lora_dropout", "tokens", mask.tokens, DType::i32, {tokens, 2});
  if (mask.tokens.device != x.device || out.device != x.device)
    throw InputError("lora_dropout: out, x and the mask's tokens must be on one device");
  if (mask.feature_begin < 0)
    throw InputError("lora_dropout: feature_begin " + std::to_string(mask.feature_begin) + " < 0");
}

void Ops::attention_context_forward(Tensor, Tensor, Tensor, Tensor, const ContextSpans&, const HeadLayout&) {
  throw_runtime_failure("layout.cp", "context-parallel attention is not an op of this backend");
}

void Ops::attention_context_backward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                     const ContextSpans&, const HeadLayout&) {
  throw_runtime_failure("layout.cp", "context-parallel attention is not an op of this backend");
}

void Ops::attention_block_forward(Tensor, Tensor, Tensor, Tensor, Tensor, const ContextSpans&,
                                  const HeadLayout&) {
  throw_runtime_failure("layout.cp_comm",
                        "the ring form of context parallelism runs on CPU ranks only so far");
}

void Ops::attention_block_merge(Tensor, Tensor, Tensor, Tensor) {
  throw_runtime_failure("layout.cp_comm",
                        "the ring form of context parallelism runs on CPU ranks only so far");
}

void Ops::attention_block_backward(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor,
                                   const ContextSpans&, const HeadLayout&) {
  throw_runtime_failure("layout.cp_comm",
                        "the ring form of context parallelism runs on CPU ranks only so far");
}

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
