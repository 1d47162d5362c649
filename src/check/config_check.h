// `loom check config CANDIDATE REFERENCE`: the configuration rules of the correctness check.
// A candidate recipe is compared with a reference recipe class by class; every class that
// changes numerics must match, layout fields may differ (that is what a check compares).
//
//   model      the model's name (without its "org/" prefix); the architecture (every
//              ModelConfig field but the token ids); the init's kind, and train.seed for a
//              random init (an HF checkpoint's weights are not read: its path is reported)
//   data       workload.row_tokens and the rows' checksum: workload.dataset.rows_sha256, or
//              the rows_sha256 of train.data.path's row-store manifest.json, or, for a .jsonl
//              rows file, the file's bytes; no common checksum fails
//   schedule   workload.global_batch, the steps (train.steps, else result.steps_per_run),
//              train.optimizer lr, min_lr, decay, warmup_fraction
//   optimizer  train.optimizer beta1, beta2, eps, weight_decay, clip_grad
//   precision  workload.precision
//   loss       the loss-mask rule (workload.dataset.build.loss_mask) where both give one;
//              the loss itself is loom's per-token SFT loss (docs/numerics.md) in every recipe
// Fields a recipe leaves out take the schema defaults (recipe.h), so an omitted
// train.optimizer is the seed's. Reported, allowed to differ: layout.*, gpu.*, train.device.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "recipe/recipe.h"

namespace loom {

struct ConfigClassResult {
  std::string name;  // model | data | schedule | optimizer | precision | loss
  bool pass = false;
  std::vector<std::string> differences;  // "field: candidate vs reference", or why it cannot be checked
  std::vector<std::string> notes;        // what was compared, what could not be
};

struct ConfigCheckReport {
  std::string candidate, reference;  // the recipe files
  std::vector<ConfigClassResult> classes;
  std::vector<std::string> layout_differences;  // allowed
  bool passed = false;

  const ConfigClassResult& result_of(const std::string& name) const;
};

ConfigCheckReport config_check(const Recipe& candidate, const Recipe& reference);

// One field of a class as text ("train.optimizer.lr", "0.003"); doubles in their shortest
// text that reads back the same.
struct ConfigField {
  std::string cls;  // model | data | schedule | optimizer | precision | loss | layout
  std::string name, value;
};
// The fields config_check compares, of one recipe, class by class: model, data
// (workload.row_tokens only: the rows' checksum is the caller's to add), schedule,
// optimizer, precision, loss (when the recipe gives its rule). A resume checkpoint records
// them (run_identity, train/resume.h).
std::vector<ConfigField> config_numerics_fields(const Recipe& recipe);
// The fields that may differ: layout.*, gpu.count, train.device.
std::vector<ConfigField> config_layout_fields(const Recipe& recipe);
// Loads both recipes for inspection (recipe_load, RecipeUse::inspect: no checkpoint needed);
// InputError for a recipe that does not load.
ConfigCheckReport config_check_files(const std::string& candidate, const std::string& reference);

std::string config_report_text(const ConfigCheckReport& report);
nlohmann::ordered_json config_report_json(const ConfigCheckReport& report);

// "tp 4, pp 2, cp 1, dp 1, sequence parallel, max 16384 tokens/GPU, no recompute, no offload"
std::string layout_summary(const LayoutSpec& layout);

}  // namespace loom
