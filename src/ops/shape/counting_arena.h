// CountingArena: a GPU arena that holds no memory. It lays allocations out by the engine's
// own policy (core/block_arena.h) in an address space of its own, so that `loom plan`'s dry
// run (plan/dry_run.h) reads what each of the engine's arenas would reserve; its tensors'
// pointers are distinct and never null (model code tests them) but must never be read.
#pragma once

#include <cstdint>
#include <string>

#include "core/block_arena.h"

namespace loom {

class CountingArena final : public BlockArena {
 public:
  explicit CountingArena(std::string name, int64_t first_block_bytes = 0)
      : BlockArena(std::move(name), first_block_bytes, Device::cuda) {}
  ~CountingArena() override { free_blocks(); }

 protected:
  uint8_t* block_new(int64_t bytes, const char* what, int64_t request) override;
  void block_free(uint8_t*, int64_t) override {}
};

}  // namespace loom
