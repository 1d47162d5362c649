// Reading the committed fixtures of tests/data.
#pragma once

#include <string>
#include <vector>

namespace loom::test {

// The lines of a text file, gzip-compressed or not (zlib reads both).
std::vector<std::string> read_lines_gz(const std::string& path);

// Bytes from lowercase or uppercase hex digits.
std::string from_hex(const std::string& hex);

}  // namespace loom::test
