#include <array>
#include <atomic>
#include <cstdio>
#include <string>

#include "core/error.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"
#include "ops/cuda/launch.h"

namespace loom {

int cuda_device_count() {
  int count = 0;
  // No driver or no device both mean "no GPU here", not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string cuda_device_description(int index) {
  cudaDeviceProp prop{};
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB",
                static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
         memory + ")";
}

namespace cuda {

int multiprocessor_count() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  // Per device, 0 until read: a process may drive several GPUs from its threads.
  constexpr int kMostDevices = 64;
  static std::array<std::atomic<int>, kMostDevices> counts{};
  LOOM_ASSERT(device < kMostDevices, "multiprocessor_count: device index past the cache");
  int count = counts[static_cast<size_t>(device)].load(std::memory_order_relaxed);
  if (count == 0) {
    LOOM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    counts[static_cast<size_t>(device)].store(count, std::memory_order_relaxed);
  }
  return count;
}

}  // namespace cuda
}  // namespace loom
