// Readers of the golden fixtures' files (README.md) the golden tests share.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "ops/cpu/cpu_ops.h"
#include "train/rows.h"

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

// Writes to `path` (safetensors, "logits" fp32 [rows, T, vocab]) the logits loom's CPU model
// computes from the HF checkpoint `dir` on every row of `rows`: what check_hf_load.py's
// --logits compares a load in transformers (or PEFT) with.
inline void write_checkpoint_logits(const std::string& dir, const RowSet& rows, const std::string& path) {
  const ModelConfig config = hf_checkpoint_read_config(dir);
  const ParamTable table = param_table_build(config);
  std::vector<float> params(static_cast<size_t>(table.total_numel));
  hf_checkpoint_load_params(dir, config, table, params.data());
  CpuOps ops;
  DecoderModel model(config, table, ops);
  ModelTensors tensors{param_views(table, params.data()), {}};
  std::vector<int64_t> all_rows(static_cast<size_t>(rows.rows));
  for (size_t i = 0; i < all_rows.size(); ++i) all_rows[i] = static_cast<int64_t>(i);
  MicroBatchData mb = micro_batch_build(rows, all_rows);
  const int64_t t = static_cast<int64_t>(mb.ids.size());
  std::vector<float> logits(static_cast<size_t>(t * config.vocab_size));
  HostArena scratch;
  model.forward_logits(tensors, mb.view(), scratch, Tensor{logits.data(), {t, config.vocab_size}});
  safetensors_write(
      path,
      {{"logits", DType::f32, {rows.rows, rows.row_tokens, config.vocab_size}, logits.data(), DType::f32}});
}

}  // namespace loom::test
