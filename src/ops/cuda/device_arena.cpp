#include "ops/cuda/device_arena.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace loom {
namespace {

constexpr int64_t kAlignment = 256;
std::atomic<int64_t> g_reserved{0};
std::atomic<int64_t> g_peak_reserved{0};

int64_t align_up(int64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

DeviceArena::DeviceArena(std::string name, int64_t block_bytes)
    : name_(std::move(name)), first_block_bytes_(align_up(block_bytes)) {}

DeviceArena::~DeviceArena() {
  for (Block& b : blocks_) {
    cudaFree(b.data);  // a destructor cannot throw; a failed free leaves nothing to undo
    g_reserved -= b.bytes;
  }
}

int64_t DeviceArena::reserved_bytes() const {
  int64_t total = 0;
  for (const Block& b : blocks_) total += b.bytes;
  return total;
}

void DeviceArena::add_block(int64_t bytes, const char* what, int64_t request) {
  void* data = nullptr;
  const cudaError_t status = cudaMalloc(&data, static_cast<size_t>(bytes));
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw_runtime_failure(
        "GPU memory", "out of memory allocating " + std::string(what) + " (" + gib(request) + ") in the " +
                          name_ + " arena: it holds " + gib(in_use_) + " and would reserve " +
                          gib(reserved_bytes() + bytes) + "; all arenas reserve " + gib(g_reserved.load()) +
                          " + this block; the GPU has " + gib(static_cast<int64_t>(free_bytes)) +
                          " free of " + gib(static_cast<int64_t>(total_bytes)) + " (" +
                          cudaGetErrorString(status) + ")");
  }
  blocks_.push_back({static_cast<uint8_t*>(data), bytes, 0});
  const int64_t now = g_reserved += bytes;
  int64_t peak = g_peak_reserved.load();
  while (now > peak && !g_peak_reserved.compare_exchange_weak(peak, now)) {
  }
}

void* DeviceArena::allocate_bytes(int64_t bytes, const char* what) {
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

Tensor DeviceArena::allocate(Shape shape, DType dtype, const char* what) {
  const int64_t bytes = shape.numel() * static_cast<int64_t>(dtype_size(dtype));
  return Tensor{allocate_bytes(bytes, what), shape, dtype, Device::cuda};
}

void DeviceArena::release_all() {
  // A pass that spilled into several blocks gets one block of its peak next time; the old
  // blocks may still be read by queued kernels, so wait for the device first.
  if (blocks_.size() > 1) {
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());
    const int64_t total = align_up(std::max(peak_, reserved_bytes()));
    for (Block& b : blocks_) {
      LOOM_CUDA_CHECK(cudaFree(b.data));
      g_reserved -= b.bytes;
    }
    blocks_.clear();
    add_block(total, "the arena's consolidated block", total);
  }
  for (Block& b : blocks_) b.used = 0;
  allocations_.clear();
  in_use_ = 0;
}

void DeviceArena::release_to(size_t mark) {
  LOOM_ASSERT(mark <= allocations_.size(), "release_to a mark that is not in this arena");
  // Freed memory is reused by later kernels of the same stream only, so no wait is needed.
  while (allocations_.size() > mark) {
    const Allocation a = allocations_.back();
    allocations_.pop_back();
    in_use_ -= blocks_[a.block].used - a.used_before;
    blocks_[a.block].used = a.used_before;
  }
}

int64_t device_arenas_reserved_bytes() {
  return g_reserved.load();
}
int64_t device_arenas_peak_reserved_bytes() {
  return g_peak_reserved.load();
}

}  // namespace loom
