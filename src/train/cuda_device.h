// The GPUs a process sees and takes, for the CUDA engine (train/engine.h EngineDevice::cuda);
// without the CUDA backend they report none.
#pragma once

#include <string>

namespace loom {

// Makes `local_rank`'s GPU (of those visible, round robin) this process's current device: a
// GPU rank's first CUDA call. No-op without the CUDA backend.
void cuda_select_device(int local_rank);
// CUDA devices visible to this process (0 without the CUDA backend).
int cuda_visible_devices();
// Whether an EngineDevice::cuda engine can work here: the backend is built and a GPU is
// visible. `why` says what is missing.
bool cuda_engine_available(std::string* why);

}  // namespace loom
