// Tensor allocation by kind, with the peak the run reports as max_mem_gib.
//
// The model asks for activations and scratch through a TensorAllocator, so the same model
// code runs on host memory (HostArena here) or on the GPU (the CUDA backend's arenas).
// `what` names the request, so an out-of-memory can say what was being allocated.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace loom {

class TensorAllocator {
 public:
  virtual ~TensorAllocator() = default;
  virtual Tensor allocate(Shape shape, DType dtype, const char* what) = 0;
  // Frees everything allocated since construction or the last release_all.
  virtual void release_all() = 0;
  // A point in the allocation order: release_to(mark()) later frees, last in first out,
  // everything allocated after it (activation recompute frees a chunk's recomputed tensors
  // this way while the tensors allocated before stay).
  virtual size_t mark() const = 0;
  virtual void release_to(size_t mark) = 0;
  virtual int64_t bytes_in_use() const = 0;
  virtual int64_t peak_bytes() const = 0;
};

// Host memory, zero-filled on allocation.
class HostArena final : public TensorAllocator {
 public:
  Tensor allocate(Shape shape, DType dtype, const char* what) override;
  void release_all() override;
  size_t mark() const override { return blocks_.size(); }
  void release_to(size_t mark) override;
  int64_t bytes_in_use() const override { return in_use_; }
  int64_t peak_bytes() const override { return peak_; }

 private:
  std::vector<std::unique_ptr<uint8_t[]>> blocks_;
  std::vector<int64_t> block_bytes_;
  int64_t in_use_ = 0;
  int64_t peak_ = 0;
};

}  // namespace loom
