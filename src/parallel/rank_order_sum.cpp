#include "parallel/rank_order_sum.h"

#include <cstdint>

#include "core/error.h"

namespace loom {

namespace {

template <typename T>
void sum_plain(void* out, const std::vector<const void*>& inputs, size_t offset, size_t count) {
  T* dst = static_cast<T*>(out);
  for (size_t j = 0; j < count; ++j) {
    T acc = static_cast<const T*>(inputs[0])[offset + j];
    for (size_t r = 1; r < inputs.size(); ++r) acc += static_cast<const T*>(inputs[r])[offset + j];
    dst[j] = acc;
  }
}

}  // namespace

void sum_in_rank_order(void* out, const std::vector<const void*>& inputs, size_t offset, size_t count,
                       DType dtype) {
  LOOM_ASSERT(!inputs.empty(), "a sum needs at least one rank");
  switch (dtype) {
    case DType::f32: sum_plain<float>(out, inputs, offset, count); return;
    case DType::f64: sum_plain<double>(out, inputs, offset, count); return;
    case DType::i32: {
      // Unsigned arithmetic wraps as NCCL's int32 sum does (signed overflow is undefined).
      auto* dst = static_cast<int32_t*>(out);
      for (size_t j = 0; j < count; ++j) {
        uint32_t acc = 0;
        for (const void* in : inputs)
          acc += static_cast<uint32_t>(static_cast<const int32_t*>(in)[offset + j]);
        dst[j] = static_cast<int32_t>(acc);
      }
      return;
    }
    case DType::bf16: {
      auto* dst = static_cast<bf16*>(out);
      for (size_t j = 0; j < count; ++j) {
        float acc = bf16_to_float(static_cast<const bf16*>(inputs[0])[offset + j]);
        for (size_t r = 1; r < inputs.size(); ++r)
          acc += bf16_to_float(static_cast<const bf16*>(inputs[r])[offset + j]);
        dst[j] = float_to_bf16(acc);
      }
      return;
    }
    default: LOOM_ASSERT(false, "sum of an unsupported dtype");
  }
}

}  // namespace loom
