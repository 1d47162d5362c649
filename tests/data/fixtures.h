// Fixtures of tests/data: the committed files, temporary folders.
#pragma once

#include <string>
#include <vector>

namespace loom::test {

// The lines of a text file, gzip-compressed or not (zlib reads both).
std::vector<std::string> read_lines_gz(const std::string& path);

// Bytes from lowercase or uppercase hex digits.
std::string from_hex(const std::string& hex);

// A fresh empty folder for one test, unique to this process and `name`; removed (with
// what is in it) when the value dies.
struct TempDir {
  explicit TempDir(const std::string& name);
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
  std::string operator/(const std::string& child) const { return path + "/" + child; }
};

// A whole file's bytes, and writing them.
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);

}  // namespace loom::test
