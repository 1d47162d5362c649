// The loom binary as a user first meets it: `loom --version`, and `loom check optimizer`
// refusing a size the machine cannot hold instead of being killed by the kernel.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "core/version.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

struct Ran {
  int status = -1;
  std::string out, err;
};

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `ENV loom ARGS` with stdout and stderr in a scratch folder.
Ran loom(const std::string& env, const std::string& args) {
  const fs::path dir = fs::temp_directory_path() / ("loom_test_cli_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string command = env + " " + LOOM_BINARY + " " + args + " >" + (dir / "stdout").string() +
                              " 2>" + (dir / "stderr").string();
  const int status = std::system(command.c_str());
  Ran ran{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(dir / "stdout"), read_text(dir / "stderr")};
  fs::remove_all(dir);
  return ran;
}

TEST(LoomVersion, PrintsTheVersionAndTheCommitItWasBuiltFrom) {
  const Ran r = loom("", "--version");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "loom " + loom_version() + "\n");
  // A commit of 12 hex digits from a git checkout, "unknown" from a tree without git.
  EXPECT_TRUE(
      std::regex_match(r.out, std::regex(R"(loom \d+\.\d+\.\d+ \(commit ([0-9a-f]{12}|unknown)\)\n)")))
      << r.out;
}

// 24 GiB needed, 1 GiB available (the host-memory test hook stands in for MemAvailable):
// exit 2 at once, with the sizes and the way out; --size small runs under the same limit.
TEST(LoomCheckOptimizer, RefusesALargeRunTheHostCannotHoldAndNamesSizeSmall) {
  const std::string one_gib = "LOOM_TEST_HOST_AVAILABLE_BYTES=1073741824";
  const auto start = std::chrono::steady_clock::now();
  const Ran refused = loom(one_gib, "check optimizer --device cpu");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(refused.status, 2) << refused.err;
  EXPECT_EQ(refused.out, "");
  for (const char* part : {"24.0 GiB of host memory", "MemAvailable is 1.0 GiB", "--size small"})
    EXPECT_NE(refused.err.find(part), std::string::npos) << part << " not in: " << refused.err;
  EXPECT_LT(seconds, 10.0) << "the refusal came after work began";
  const Ran small = loom(one_gib, "check optimizer --device cpu --size small");
  EXPECT_EQ(small.status, 0) << small.err;
}

// A seed is a decimal integer of 0 to 2^64 - 1: CLI11 alone read "-1" and 2^64 both as
// 2^64 - 1.
TEST(LoomCheckOptimizer, RefusesASeedOutside64Bits) {
  for (const char* seed : {"-1", "18446744073709551616", "1e3"}) {
    const Ran r = loom("", std::string("check optimizer --device cpu --size small --seed '") + seed + "'");
    EXPECT_EQ(r.status, 2) << seed << ": " << r.err;
    EXPECT_NE(r.err.find("--seed"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("expected a decimal integer from 0 to 18446744073709551615"), std::string::npos)
        << r.err;
  }
}

}  // namespace
}  // namespace loom
