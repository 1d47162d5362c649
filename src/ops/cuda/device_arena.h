// DeviceArena: GPU memory for one kind of tensor (weights, main grads, optimizer state,
// activations), with the true peak the run reports as max_mem_gib.
//
// Allocations are bump-allocated out of cudaMalloc'd blocks, 256-byte aligned (what
// cuBLASLt and cuDNN want). release_all() keeps the blocks; when a pass needed more than
// one block, they are replaced by one block of the pass's peak, so from the second step on
// an activation arena is one cudaMalloc that never changes. An allocation the GPU cannot
// hold is a RuntimeFailure (exit 3) naming what was being allocated, the arena, and what
// this arena and the whole process hold and ask for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"

namespace loom {

class DeviceArena final : public TensorAllocator {
 public:
  // `name` appears in out-of-memory messages ("activations"); `block_bytes` is the size of
  // the first block (0: the first request's size).
  explicit DeviceArena(std::string name, int64_t block_bytes = 0);
  ~DeviceArena() override;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  Tensor allocate(Shape shape, DType dtype, const char* what) override;
  void* allocate_bytes(int64_t bytes, const char* what);
  void release_all() override;
  // Whether release_all() will wait for the whole device first: the pass since the last one
  // spilled into several blocks, which it replaces by one.
  bool release_waits() const { return blocks_.size() > 1; }
  size_t mark() const override { return allocations_.size(); }
  void release_to(size_t mark) override;
  int64_t bytes_in_use() const override { return in_use_; }
  int64_t peak_bytes() const override { return peak_; }
  // Bytes cudaMalloc'd by this arena now.
  int64_t reserved_bytes() const;

 private:
  struct Block {
    uint8_t* data = nullptr;
    int64_t bytes = 0;
    int64_t used = 0;
  };
  void add_block(int64_t bytes, const char* what, int64_t request);

  std::string name_;
  int64_t first_block_bytes_;
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

// Bytes cudaMalloc'd by every DeviceArena of the process, now and at most (library
// workspaces included where they are arena allocations).
int64_t device_arenas_reserved_bytes();
int64_t device_arenas_peak_reserved_bytes();

}  // namespace loom
