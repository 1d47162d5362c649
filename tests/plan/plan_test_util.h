// Helpers of the plan tests: a PlanInput for a built-in model on one H200, the term of a
// stage by name, the seed recipe's path.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "plan/plan.h"

namespace loom::test {

inline std::string source_path(const std::string& relative) {
  return std::string(LOOM_SOURCE_DIR) + "/" + relative;
}

// `model` on one H200, rows × row_tokens a micro-batch, global_batch rows a step.
inline PlanInput builtin_input(const std::string& model, int64_t rows, int64_t row_tokens = 8192,
                               int64_t global_batch = 0) {
  PlanInput in;
  EXPECT_TRUE(qwen3_config_builtin(model, &in.model)) << model;
  in.model_name = model;
  in.workload.row_tokens = row_tokens;
  in.workload.global_batch = global_batch > 0 ? global_batch : rows;
  in.layout.max_tokens_per_gpu = rows * row_tokens;
  in.gpu = *gpu_find("H200");
  in.gpu_source = "test";
  return in;
}

inline int64_t term(const StageMemory& stage, const std::string& name) {
  for (const MemoryTerm& t : stage.terms)
    if (t.name == name) return t.bytes;
  ADD_FAILURE() << "no memory term " << name;
  return -1;
}

inline bool has_term(const StageMemory& stage, const std::string& name) {
  for (const MemoryTerm& t : stage.terms)
    if (t.name == name) return true;
  return false;
}

inline double time_term(const TimePlan& plan, const std::string& name) {
  for (const TimeTerm& t : plan.terms)
    if (t.name == name) return t.seconds;
  return 0;
}

}  // namespace loom::test
