// The CUDA engine's entry points in a build without the CUDA backend (no nvcc).
#include "train/engine.h"

namespace loom {

std::unique_ptr<TrainEngine> cuda_engine_create(const Qwen3Config&, const ParamTable&, ParamSource&,
                                                const EngineOptions&) {
  return nullptr;
}

std::unique_ptr<TrainEngine> parallel_cuda_engine_create(const Qwen3Config&, const ParamTable&, ParamSource&,
                                                         const EngineOptions&, Groups&, Groups&) {
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
