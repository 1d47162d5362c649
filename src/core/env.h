// The process environment's switches: LOOM_OP_PROFILE, the measurement switches of docs/performance.md
// and the LOOM_TEST_ hooks.
#pragma once

#include <cstdlib>
#include <cstring>

namespace loom {

// Whether the environment variable `name` is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
  const char* set = std::getenv(name);
  return set && std::strcmp(set, value) == 0;
}

// A switch: set to "1".
inline bool env_flag(const char* name) {
  return env_is(name, "1");
}

}  // namespace loom
