// What every fuzz target of this folder shares (README.md): the outcome it accepts, and the
// scratch files through which a target hands its input to a parser that reads a path.
//
// A parser given bad bytes may only return or throw InputError (exit 2, its message naming
// the file and field). Any other exception escaping it is a finding: it is printed and the
// target aborts, which libFuzzer reports as a crash with the input that caused it, as it
// does a sanitizer's report. LOOM_FUZZ_VERBOSE=1 prints each refusal (to see whether a seed
// is accepted, or which check refuses an input).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace loom::fuzz {

template <typename Parse>
void expect_parsed_or_input_error(Parse&& parse) {
  try {
    parse();
  } catch (const InputError& e) {
    static const bool verbose = std::getenv("LOOM_FUZZ_VERBOSE") != nullptr;
    if (verbose) std::fprintf(stderr, "fuzz: refused: %s\n", e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: an exception other than InputError escaped the parser: %s\n", e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "fuzz: a non-standard exception escaped the parser\n");
    std::abort();
  }
}

// A folder of this process's own under the temporary directory (/dev/shm when there is one:
// a target writes its input there on every run), removed when the process exits normally.
class ScratchDir {
 public:
  ScratchDir() {
    const std::filesystem::path base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
    root_ = base / ("loom-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(root_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(root_, ignored);
  }
  const std::filesystem::path& root() const { return root_; }
  // Writes `bytes` to root()/name and returns its path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::filesystem::path path = root_ / name;
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path.string();
  }

 private:
  std::filesystem::path root_;
};

// One input that stands for several files (a row store's folder): the files' bytes in a fixed
// order, separated by kFileSeparator. A missing section is a missing file.
inline constexpr std::string_view kFileSeparator = "\n--loom-fuzz-next-file--\n";

inline std::vector<std::string_view> split_files(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> files;
  for (size_t at = rest.find(kFileSeparator); at != std::string_view::npos; at = rest.find(kFileSeparator)) {
    files.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kFileSeparator.size());
  }
  files.push_back(rest);
  return files;
}

}  // namespace loom::fuzz
