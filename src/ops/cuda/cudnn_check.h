// cuDNN's and cudnn-frontend's failures as loom's RuntimeFailure (exit 3): the two SDPA
// runners' one check (attention.cpp, context_attention.cpp).
#pragma once

#include <cudnn.h>

#include <string>

#include "core/error.h"

// The frontend's JSON serialisation is for graph caching across processes, which loom
// does not do; skipping it keeps its bundled JSON library out of the build.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

namespace loom {

inline void cudnn_check(cudnnStatus_t status, const char* call) {
  if (status != CUDNN_STATUS_SUCCESS)
    throw_runtime_failure("cuDNN", std::string(call) + " failed: " + cudnnGetErrorString(status));
}

inline void fe_check(cudnn_frontend::error_t status, const std::string& what) {
  if (!status.is_good()) throw_runtime_failure("cuDNN SDPA", what + ": " + status.get_message());
}

}  // namespace loom
