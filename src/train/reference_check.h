// The check of a finished run against the reference run its recipe names (train.reference),
// for result.yaml's correctness block: the configuration rules, the convergence check of the
// two loss curves and the optimizer component test on this run's device (check/correctness.h).
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

#include "recipe/recipe.h"

namespace loom {

struct ReferenceCheck {
  YAML::Node block;  // the correctness block
  bool passed = false;
  std::string summary;  // the block's summary sentence
};

// `metrics_path`: this run's metrics.jsonl. InputError for a reference that does not load.
ReferenceCheck reference_check_run(const Recipe& recipe, const std::string& metrics_path);

}  // namespace loom
