#include "core/allocator.h"

#include <algorithm>

#include "core/error.h"

namespace loom {

Tensor HostArena::allocate(Shape shape, DType dtype, const char* /*what*/) {
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  // value-initialised: zero-filled, so no op ever reads uninitialised memory.
  blocks_.push_back(std::make_unique<uint8_t[]>(std::max<size_t>(bytes, 1)));
  block_bytes_.push_back(static_cast<int64_t>(bytes));
  in_use_ += static_cast<int64_t>(bytes);
  peak_ = std::max(peak_, in_use_);
  return Tensor{blocks_.back().get(), shape, dtype, Device::cpu};
}

void HostArena::release_all() {
  blocks_.clear();
  block_bytes_.clear();
  in_use_ = 0;
}

void HostArena::release_to(size_t mark) {
  LOOM_ASSERT(mark <= blocks_.size(), "release_to a mark that is not in this arena");
  for (size_t i = mark; i < blocks_.size(); ++i) in_use_ -= block_bytes_[i];
  blocks_.resize(mark);
  block_bytes_.resize(mark);
}

}  // namespace loom
