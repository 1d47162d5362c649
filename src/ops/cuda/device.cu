#include <cstdio>
#include <string>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"

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

}  // namespace loom
