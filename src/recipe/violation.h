// Violation: one thing wrong with a recipe, as `loom recipe validate` prints it.
#pragma once

#include <string>
#include <vector>

namespace loom {

struct Violation {
  std::string file;   // the recipe file
  int line = 0;       // 1-based line of the field in the file; 0 when not known
  std::string field;  // the field path, dotted ("layout.tp", "correctness.component_tests[0].date");
                      // a rule over several fields names them all, joined by ", "
  std::string what;   // "found X, expected Y", plus "; did you mean 'Z'?" for unknown keys

  // "FILE:LINE: FIELD: WHAT" (":LINE" only when known).
  std::string to_string() const;
};

// The violations one per line, in order: the message of the InputError recipe_load throws.
std::string violations_to_string(const std::vector<Violation>& violations);

}  // namespace loom
