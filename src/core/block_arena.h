// BlockArena: the allocation policy of loom's GPU arenas (ops/cuda/device_arena.h), apart
// from where its blocks come from, so that `loom plan`'s dry run (ops/shape/) counts an
// arena's bytes by the very code that lays out the engine's.
//
// Allocations are bump-allocated out of blocks, 256-byte aligned (what cuBLASLt and cuDNN
// want). A request that fits no block's free end gets a block of its own (the first block
// is at least `first_block_bytes`). release_all() keeps the blocks; when a pass needed more
// than one, they are replaced by one block of max(peak, reserved): so an arena whose freed
// temporaries left gaps (release_to, then a larger request) reserves more than its peak,
// and from the second pass on it is one block that never changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace loom {

class BlockArena : public TensorAllocator {
 public:
  static constexpr int64_t kAlignment = 256;
  static int64_t align_up(int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

  // `name` names the arena in messages; `device`: the device of its tensors.
  BlockArena(std::string name, int64_t first_block_bytes, Device device);
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;

  Tensor allocate(Shape shape, DType dtype, const char* what) override;
  void* allocate_bytes(int64_t bytes, const char* what);
  void release_all() override;
  // Whether release_all() will merge blocks: the pass since the last one spilled into
  // several.
  bool release_waits() const { return blocks_.size() > 1; }
  size_t mark() const override { return allocations_.size(); }
  void release_to(size_t mark) override;
  int64_t bytes_in_use() const override { return in_use_; }
  int64_t peak_bytes() const override { return peak_; }
  // Bytes of the blocks held now.
  int64_t reserved_bytes() const;
  const std::string& name() const { return name_; }

 protected:
  // A block of `bytes` (request: the allocation that asked for it, for messages), and its
  // return; block_free is called from the derived destructor's free_blocks too.
  virtual uint8_t* block_new(int64_t bytes, const char* what, int64_t request) = 0;
  virtual void block_free(uint8_t* data, int64_t bytes) = 0;
  // Before blocks are merged (the device arena waits for queued kernels that may read them).
  virtual void before_merge() {}
  // Frees every block: a derived class's destructor calls it (block_free is its own).
  void free_blocks();

 private:
  struct Block {
    uint8_t* data = nullptr;
    int64_t bytes = 0;
    int64_t used = 0;
  };
  void add_block(int64_t bytes, const char* what, int64_t request);

  std::string name_;
  int64_t first_block_bytes_;
  Device device_;
  // Each allocation since the last release_all: its block and that block's fill before it,
  // so release_to can undo allocations in reverse.
  struct Allocation {
    size_t block = 0;
    int64_t used_before = 0;
  };
  std::vector<Block> blocks_;
  std::vector<Allocation> allocations_;
  int64_t in_use_ = 0;
  int64_t peak_ = 0;
};

}  // namespace loom
