// A build without the CUDA backend has no GPU arms (optimizer_arm.h).
#include "check/optimizer_arm.h"
#include "core/error.h"

namespace loom {

OptimizerArmSet optimizer_arms_cuda(bool offload) {
  throw_input_error(
      offload ? "--offload" : "--device cuda",
      "this build of loom has no CUDA backend (nvcc was not found, or LOOM_ENABLE_CUDA was OFF), so "
      "the CUDA and optimizer offload arms are not built; expected --device cpu without --offload");
}

}  // namespace loom
