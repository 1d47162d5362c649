// Running the loom binary (or another) as a child process, for the tests of its commands:
// exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "support/temp_dir.h"

namespace loom::test {

struct BinaryRun {
  int code = -1;  // the exit code; -1 when a signal ended it
  std::string out, err;
};

// Runs `binary args` through the shell in the current folder, `input` on its stdin; the
// three streams pass through files in `dir`.
inline BinaryRun run_binary(const std::string& binary, const std::string& args, const TempDir& dir,
                            const std::string& input = "") {
  const std::string in = dir.file("stdin"), out = dir.file("stdout"), err = dir.file("stderr");
  std::ofstream(in, std::ios::binary | std::ios::trunc) << input;
  const int status = std::system((binary + " " + args + " <" + in + " >" + out + " 2>" + err).c_str());
  const auto read = [](const std::string& path) {
    std::ifstream file(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read(out), read(err)};
}

}  // namespace loom::test
