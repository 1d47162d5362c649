// The recipe schema: schema/recipe.schema.yaml, embedded at build time, parsed into a tree
// of SchemaField, and the check of a YAML document against it.
//
// The schema file's header documents its keys (type, format, required, nullable, default,
// enum, min, max, exclusive_min, length, one_of, unit, doc). The check reports every
// violation of a document at once: wrong types, values outside enum or bounds, unknown keys
// (with the nearest known key as a suggestion), duplicate keys, and missing required
// fields for the recipe's status.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "recipe/violation.h"

namespace loom {

struct SchemaField {
  std::string name;                   // the key; "" for the root, list items and dict values
  std::string type;                   // int | number | bool | string | map | dict | list
  std::string format;                 // (string) "" | date | sha256 | url | path
  std::vector<std::string> required;  // statuses, "run" or "always"; empty: optional
  bool nullable = false;
  bool one_of = false;       // (map) exactly one of the fields present
  YAML::Node default_value;  // undefined when the field has no default
  std::vector<std::string> enum_values;
  std::optional<double> min, max, exclusive_min;
  std::optional<int64_t> length;  // (list)
  std::string unit, doc;
  std::vector<SchemaField> fields;             // (map)
  std::shared_ptr<const SchemaField> element;  // (list) items, (dict) values

  const SchemaField* field(const std::string& key) const;  // nullptr when unknown
};

// The text of schema/recipe.schema.yaml as it was when loom was built.
std::string_view recipe_schema_text();

// Parses a schema; `where` names it in errors. A malformed schema is a defect of the
// build (the text is embedded), so it fails an assertion naming the bad entry.
SchemaField schema_parse(std::string_view text, const std::string& where);
// The embedded schema, parsed (once).
const SchemaField& recipe_schema();

// The field at a dotted path ("train.optimizer.lr"); a dict's value for any key under it.
// nullptr when the path names no field.
const SchemaField* schema_find(const SchemaField& root, const std::vector<std::string>& path);

// Under which conditions fields count as required.
struct SchemaContext {
  std::string file;                     // named in every violation
  std::string status;                   // draft | measured | verified
  bool run = false;                     // fields `required: [run]` are required (loom train)
  std::vector<std::string> overridden;  // dotted paths set by --set: they have no line
};

// Appends every violation of `document` against `root` to `out`.
void schema_check(const YAML::Node& document, const SchemaField& root, const SchemaContext& context,
                  std::vector<Violation>* out);

// Whether `required` holds under the context: "always", the status, or "run" when running.
bool schema_required(const SchemaField& field, const SchemaContext& context);

// The candidate nearest to `name` by edit distance, or "" when none is near enough
// (distance at most max(2, |name| / 3)): the "did you mean" of unknown keys.
std::string schema_suggest(const std::string& name, const std::vector<std::string>& candidates);

// "an integer >= 1", "one of cuda, cpu", "a map": what a field expects, for messages.
std::string schema_describe(const SchemaField& field);

// Scalars read with the schema's typing: a quoted scalar ('8') is a string, never a number
// or a bool. int: decimal digits with an optional sign; number: decimal or exponent
// notation (no hex, inf or nan); bool: true/false (also True, TRUE, False, FALSE).
// nullopt when the node is not such a scalar.
std::optional<int64_t> yaml_int(const YAML::Node& node);
std::optional<double> yaml_number(const YAML::Node& node);
std::optional<bool> yaml_bool(const YAML::Node& node);

}  // namespace loom
