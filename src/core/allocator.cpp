#include "core/allocator.h"

#include <algorithm>

namespace loom {

Tensor HostArena::allocate(Shape shape, DType dtype, const char* /*what*/) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  // value-initialised: zero-filled, so no op ever reads uninitialised memory.
  blocks_.push_back(std::make_unique<uint8_t[]>(std::max<size_t>(bytes, 1)));
  in_use_ += static_cast<int64_t>(bytes);
  peak_ = std::max(peak_, in_use_);
  return Tensor{blocks_.back().get(), shape, dtype, Device::cpu};
}

void HostArena::release_all() {
  blocks_.clear();
  in_use_ = 0;
}

}  // namespace loom
