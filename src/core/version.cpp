#include "core/version.h"

#include "build_info.h"

namespace loom {

std::string loom_version() {
  return LOOM_VERSION " (commit " LOOM_GIT_COMMIT ")";
}

}  // namespace loom
