// Errors that carry context, and the exit codes of docs/interface.md.
//
// Bad input (a recipe field, a config.json key, a tensor in a safetensors file, a line of
// a rows file) raises InputError: the CLI prints its one message and exits 2. Failures of
// the machine (I/O, CUDA, NCCL) raise RuntimeFailure: exit 3. Messages name the file and
// the field, tensor or line, and say what was expected.
#pragma once

#include <stdexcept>
#include <string>

namespace loom {

enum class ExitCode : int { ok = 0, check_failed = 1, bad_input = 2, runtime_failure = 3 };

class LoomError : public std::runtime_error {
 public:
  LoomError(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// Bad input: exit 2.
class InputError : public LoomError {
 public:
  explicit InputError(const std::string& message) : LoomError(ExitCode::bad_input, message) {}
};

// A failure of the machine or a library: exit 3.
class RuntimeFailure : public LoomError {
 public:
  explicit RuntimeFailure(const std::string& message) : LoomError(ExitCode::runtime_failure, message) {}
};

// "where: what" in one line, the shape every message takes.
[[noreturn]] void throw_input_error(const std::string& where, const std::string& what);
[[noreturn]] void throw_runtime_failure(const std::string& where, const std::string& what);

// Internal invariants (a programming error, not bad input): aborts with file:line context.
#define LOOM_ASSERT(cond, msg)                                                                  \
  do {                                                                                          \
    if (!(cond)) ::loom::assert_fail(#cond, (msg), __FILE__, __LINE__);                         \
  } while (0)

[[noreturn]] void assert_fail(const char* cond, const std::string& msg, const char* file, int line);

}  // namespace loom
