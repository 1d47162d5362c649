#include "core/block_arena.h"

#include <algorithm>

#include "core/error.h"

namespace loom {

BlockArena::BlockArena(std::string name, int64_t first_block_bytes, Device device)
    : name_(std::move(name)), first_block_bytes_(align_up(first_block_bytes)), device_(device) {}

int64_t BlockArena::reserved_bytes() const {
  int64_t total = 0;
  for (const Block& b : blocks_) total += b.bytes;
  return total;
}

void BlockArena::add_block(int64_t bytes, const char* what, int64_t request) {
  blocks_.push_back({block_new(bytes, what, request), bytes, 0});
}

void BlockArena::free_blocks() {
  for (Block& b : blocks_) block_free(b.data, b.bytes);
  blocks_.clear();
}

void* BlockArena::allocate_bytes(int64_t bytes, const char* what) {
  LOOM_ASSERT(bytes >= 0, "negative allocation");
  const int64_t size = align_up(std::max<int64_t>(bytes, 1));
  size_t index = 0;
  while (index < blocks_.size() && blocks_[index].bytes - blocks_[index].used < size) ++index;
  if (index == blocks_.size()) {
    const int64_t want = blocks_.empty() ? std::max(first_block_bytes_, size) : size;
    add_block(want, what, bytes);
  }
  Block* block = &blocks_[index];
  allocations_.push_back({index, block->used});
  void* data = block->data + block->used;
  block->used += size;
  in_use_ += size;
  peak_ = std::max(peak_, in_use_);
  return data;
}

Tensor BlockArena::allocate(Shape shape, DType dtype, const char* what) {
  const int64_t bytes = shape.numel() * static_cast<int64_t>(dtype_size(dtype));
  return Tensor{allocate_bytes(bytes, what), shape, dtype, device_};
}

void BlockArena::release_all() {
  // A pass that spilled into several blocks gets one block of its peak next time.
  if (blocks_.size() > 1) {
    before_merge();
    const int64_t total = align_up(std::max(peak_, reserved_bytes()));
    free_blocks();
    add_block(total, "the arena's consolidated block", total);
  }
  for (Block& b : blocks_) b.used = 0;
  allocations_.clear();
  in_use_ = 0;
}

void BlockArena::release_to(size_t mark) {
  LOOM_ASSERT(mark <= allocations_.size(), "release_to a mark that is not in this arena");
  while (allocations_.size() > mark) {
    const Allocation a = allocations_.back();
    allocations_.pop_back();
    in_use_ -= blocks_[a.block].used - a.used_before;
    blocks_[a.block].used = a.used_before;
  }
}

}  // namespace loom
