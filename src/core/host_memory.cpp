#include "core/host_memory.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace loom {

int64_t host_memory_available_bytes() {
  if (const char* forced = std::getenv("LOOM_TEST_HOST_AVAILABLE_BYTES")) return std::atoll(forced);
  std::ifstream meminfo("/proc/meminfo");
  const std::string key = "MemAvailable:";
  for (std::string line; std::getline(meminfo, line);)
    if (line.compare(0, key.size(), key) == 0) return std::atoll(line.c_str() + key.size()) * 1024;  // kB
  return -1;
}

}  // namespace loom
