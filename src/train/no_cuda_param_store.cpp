// The CUDA store's entry points in a build without the CUDA backend (no nvcc).
#include "train/cuda_device.h"
#include "train/param_store.h"

namespace loom {

std::unique_ptr<ParamStore> cuda_param_store_create(const ParamStoreShape&, const EngineOptions&) {
  return nullptr;
}

void cuda_select_device(int) {}

int cuda_visible_devices() {
  return 0;
}

bool cuda_engine_available(std::string* why) {
  if (why) *why = "this loom was built without the CUDA backend (nvcc was not found at configure time)";
  return false;
}

}  // namespace loom
