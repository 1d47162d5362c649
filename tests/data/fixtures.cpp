#include "fixtures.h"

#include <zlib.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace loom::test {

std::vector<std::string> read_lines_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  std::string all;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) all.append(buf, static_cast<size_t>(n));
  gzclose(f);
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < all.size()) {
    size_t end = all.find('\n', begin);
    if (end == std::string::npos) end = all.size();
    lines.push_back(all.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace loom::test
