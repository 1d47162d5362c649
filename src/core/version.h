// Which loom this is, for `loom --version`, result.yaml (result.loom) and benchmark records:
// the version of the top CMakeLists.txt's project() and the git commit the build was
// configured from (cmake/git_commit.cmake; "unknown" without git, as from a release tarball).
#pragma once

#include <string>

namespace loom {

// "0.1.0 (commit 0123456789ab)"
std::string loom_version();

}  // namespace loom
