// Helpers of the io tests: a scratch folder per test (support/temp_dir.h), raw files, and
// catching InputError.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "core/error.h"
#include "support/temp_dir.h"

namespace loom::test {

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A safetensors file as bytes: the 8-byte little-endian length of `header`, `header`, then
// `data_bytes` bytes of data (value i % 251 at i, so that copies are checkable).
inline std::string safetensors_bytes(const std::string& header, size_t data_bytes) {
  uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += header;
  for (size_t i = 0; i < data_bytes; ++i) out += static_cast<char>(i % 251);
  return out;
}

// The message of the InputError `f` throws; fails the test when it throws none.
inline std::string input_error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

}  // namespace loom::test

namespace loom::test {

// Asserts that `f` throws an InputError whose message holds every one of `needles`.
inline void expect_input_error(const std::function<void()>& f, std::initializer_list<std::string> needles) {
  std::string message = input_error_message(f);
  for (const std::string& needle : needles)
    EXPECT_NE(message.find(needle), std::string::npos) << "message: " << message << "\nlacks: " << needle;
}

}  // namespace loom::test

#define EXPECT_INPUT_ERROR(statement, ...)                                       \
  do {                                                                           \
    SCOPED_TRACE(#statement);                                                    \
    ::loom::test::expect_input_error([&] { (void)(statement); }, {__VA_ARGS__}); \
  } while (0)
