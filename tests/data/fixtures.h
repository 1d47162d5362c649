// Fixtures of tests/data: the committed files (temporary folders: support/temp_dir.h).
#pragma once

#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace loom::test {

// The lines of a text file, gzip-compressed or not (zlib reads both).
std::vector<std::string> read_lines_gz(const std::string& path);

// Bytes from lowercase or uppercase hex digits.
std::string from_hex(const std::string& hex);

// A whole file's bytes, and writing them.
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);

}  // namespace loom::test
