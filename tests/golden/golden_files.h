// Readers of the golden fixtures' files (README.md) the golden tests share.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace loom::test {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// The fp32 values of tensor `name` of a fixture's safetensors file (a test failure and none
// where the file lacks it).
inline std::vector<float> tensor_values(const SafetensorsFile& file, const std::string& name) {
  const SafetensorsEntry* e = file.find(name);
  if (!e) ADD_FAILURE() << file.path() << " has no tensor " << name;
  if (!e) return {};
  Tensor t = file.view(*e);
  EXPECT_EQ(t.dtype, DType::f32) << name;
  return {t.as<float>(), t.as<float>() + t.numel()};
}

}  // namespace loom::test
