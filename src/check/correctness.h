// result.yaml's `correctness` block (schema/recipe.schema.yaml) from the checks of this
// folder, for a run given a reference run.
//
// The trainer gathers the evidence (correctness_evidence: the configuration rules and the
// convergence check; component tests as it chooses, e.g. optimizer_check_run at --size small)
// and writes correctness_block(evidence) under the document's `correctness` key. The block's
// result is fail when any check failed, pending when none failed but no component test ran
// (the schema's verified status needs one), pass otherwise.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "check/config_check.h"
#include "check/convergence.h"
#include "check/optimizer_check.h"
#include "recipe/recipe.h"

namespace loom {

// One correctness.component_tests entry.
struct ComponentTestRecord {
  std::string test, shape, gpu, date, result, detail, note;
};

// The entry for an optimizer check; date "YYYY-MM-DD", command: how it was run (the note).
ComponentTestRecord component_test_record(const OptimizerCheckReport& report, const std::string& date,
                                          const std::string& command);

struct CorrectnessEvidence {
  std::string reference;  // the reference recipe, in words: its file and layout
  ConfigCheckReport configuration;
  ConvergenceReport convergence;
  std::string convergence_note;  // what the two arms were
  std::vector<ComponentTestRecord> component_tests;
};

// Runs the configuration rules on the two recipes (the reference loaded for inspection) and
// the convergence check on the two metrics files (files or run folders). InputError for a
// reference recipe or a metrics file that does not load.
CorrectnessEvidence correctness_evidence(const Recipe& candidate, const std::string& candidate_metrics,
                                         const std::string& reference_recipe,
                                         const std::string& reference_metrics,
                                         const ConvergenceThresholds& thresholds = {});

// The block. Figures are rounded for reading (correlation to 7 decimals, the final loss
// difference to 4 significant digits); an undefined correlation or final loss difference is
// left out and the convergence note says why.
YAML::Node correctness_block(const CorrectnessEvidence& evidence);

// Today's date in UTC, "YYYY-MM-DD".
std::string date_today_utc();

}  // namespace loom
