// The CUDA twin of ops/activation_offload.h: chunk inputs in pinned (page-locked) host
// memory, copied on a stream of their own so that the copy engines move them beside the
// layers' kernels; events order the two streams: a slot is written only after its previous
// chunk's copy to the host has read it, a prefetch writes a slot only after the compute
// stream is done with its previous chunk, and a chunk is recomputed only after its copy back.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "ops/activation_offload.h"

namespace loom {

// `compute`: the stream the model's ops run on (CudaOps::stream).
std::unique_ptr<ActivationOffload> cuda_activation_offload(cudaStream_t compute);

}  // namespace loom
