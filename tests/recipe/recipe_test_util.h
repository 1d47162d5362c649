// Helpers of the recipe tests: recipe files in a scratch folder (support/temp_dir.h), the
// line of a text, and the seed recipe's path.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "recipe/violation.h"
#include "support/temp_dir.h"

namespace loom::test {

inline std::string source_path(const std::string& relative) {
  return std::string(LOOM_SOURCE_DIR) + "/" + relative;
}

inline const std::string& seed_path() {
  static const std::string path = source_path("recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml");
  return path;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// The 1-based line of the first line of `text` that contains `needle`; 0 when none does.
inline int line_of(const std::string& text, const std::string& needle) {
  int line = 1;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.substr(start, end - start).find(needle) != std::string::npos) return line;
    start = end + 1;
    ++line;
  }
  return 0;
}

// The violation naming exactly `field`, or nullptr.
inline const Violation* find_violation(const std::vector<Violation>& violations, const std::string& field) {
  for (const Violation& v : violations)
    if (v.field == field) return &v;
  return nullptr;
}

}  // namespace loom::test
