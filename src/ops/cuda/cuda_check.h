// Error checks for CUDA runtime and cuBLASLt calls that carry context: the call, the file
// and line, and what loom was doing. A failure is a RuntimeFailure (exit 3).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string>

#include "core/error.h"

namespace loom {

inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess)
    throw_runtime_failure(
        std::string(file) + ":" + std::to_string(line),
        std::string(call) + " failed: " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")");
}

inline void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw_runtime_failure(
        std::string(file) + ":" + std::to_string(line),
        std::string(call) + " failed: cuBLAS status " + std::to_string(static_cast<int>(status)));
}

}  // namespace loom

#define LOOM_CUDA_CHECK(call) ::loom::cuda_check((call), #call, __FILE__, __LINE__)
#define LOOM_CUBLAS_CHECK(call) ::loom::cublas_check((call), #call, __FILE__, __LINE__)
