#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace loom {

void throw_input_error(const std::string& where, const std::string& what) {
  throw InputError(where + ": " + what);
}

void throw_runtime_failure(const std::string& where, const std::string& what) {
  throw RuntimeFailure(where + ": " + what);
}

void assert_fail(const char* cond, const std::string& msg, const char* file, int line) {
  std::fprintf(stderr, "loom: internal error at %s:%d: %s (%s)\n", file, line, msg.c_str(), cond);
  std::abort();
}

}  // namespace loom
