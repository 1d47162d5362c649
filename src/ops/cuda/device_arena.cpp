#include "ops/cuda/device_arena.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"

namespace loom {
namespace {

std::atomic<int64_t> g_reserved{0};
std::atomic<int64_t> g_peak_reserved{0};

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

DeviceArena::DeviceArena(std::string name, int64_t block_bytes)
    : BlockArena(std::move(name), block_bytes, Device::cuda) {}

DeviceArena::~DeviceArena() {
  destroying_ = true;
  free_blocks();
}

uint8_t* DeviceArena::block_new(int64_t bytes, const char* what, int64_t request) {
  void* data = nullptr;
  const cudaError_t status = cudaMalloc(&data, static_cast<size_t>(bytes));
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw_runtime_failure(
        "GPU memory", "out of memory allocating " + std::string(what) + " (" + gib(request) + ") in the " +
                          name() + " arena: it holds " + gib(bytes_in_use()) + " and would reserve " +
                          gib(reserved_bytes() + bytes) + "; all arenas reserve " + gib(g_reserved.load()) +
                          " + this block; the GPU has " + gib(static_cast<int64_t>(free_bytes)) +
                          " free of " + gib(static_cast<int64_t>(total_bytes)) + " (" +
                          cudaGetErrorString(status) + ")");
  }
  const int64_t now = g_reserved += bytes;
  int64_t peak = g_peak_reserved.load();
  while (now > peak && !g_peak_reserved.compare_exchange_weak(peak, now)) {
  }
  return static_cast<uint8_t*>(data);
}

void DeviceArena::block_free(uint8_t* data, int64_t bytes) {
  if (destroying_)
    cudaFree(data);
  else
    LOOM_CUDA_CHECK(cudaFree(data));
  g_reserved -= bytes;
}

void DeviceArena::before_merge() {
  LOOM_CUDA_CHECK(cudaDeviceSynchronize());
}

int64_t device_arenas_reserved_bytes() {
  return g_reserved.load();
}
int64_t device_arenas_peak_reserved_bytes() {
  return g_peak_reserved.load();
}

}  // namespace loom
