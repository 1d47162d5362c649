// What CUDA devices this process sees. Used to pick the backend and to skip GPU tests with
// a visible message on machines without a GPU.
#pragma once

#include <string>

namespace loom {

// Number of usable CUDA devices; 0 when there is no driver or no GPU (never throws).
int cuda_device_count();
// "NVIDIA H200 (sm_90, 139.8 GiB)" for device `index`; throws RuntimeFailure on error.
std::string cuda_device_description(int index);

}  // namespace loom
