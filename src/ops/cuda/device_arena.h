// DeviceArena: GPU memory for one kind of tensor (weights, main grads, optimizer state,
// activations), with the true peak the run reports as max_mem_gib.
//
// Its blocks are cudaMalloc'd; how allocations fill them, and when they are merged into one,
// is core/block_arena.h's (which `loom plan`'s dry run counts with too): from the second
// step on an activation arena is one cudaMalloc that never changes. An allocation the GPU
// cannot hold is a RuntimeFailure (exit 3) naming what was being allocated, the arena, and
// what this arena and the whole process hold and ask for.
#pragma once

#include <cstdint>
#include <string>

#include "core/block_arena.h"

namespace loom {

class DeviceArena final : public BlockArena {
 public:
  // `name` appears in out-of-memory messages ("activations"); `block_bytes` is the size of
  // the first block (0: the first request's size).
  explicit DeviceArena(std::string name, int64_t block_bytes = 0);
  ~DeviceArena() override;

 protected:
  uint8_t* block_new(int64_t bytes, const char* what, int64_t request) override;
  void block_free(uint8_t* data, int64_t bytes) override;
  // The old blocks may still be read by queued kernels: wait for the device first.
  void before_merge() override;

 private:
  bool destroying_ = false;  // a destructor cannot throw; a failed free leaves nothing to undo
};

// Bytes cudaMalloc'd by every DeviceArena of the process, now and at most (library
// workspaces included where they are arena allocations).
int64_t device_arenas_reserved_bytes();
int64_t device_arenas_peak_reserved_bytes();

}  // namespace loom
