#include "recipe/schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace loom {
namespace {

const std::vector<std::string> kTypes = {"int", "number", "bool", "string", "map", "dict", "list"};
const std::vector<std::string> kFormats = {"date", "sha256", "url", "path"};
const std::vector<std::string> kConditions = {"always", "run", "draft", "measured", "verified"};
const std::vector<std::string> kSchemaKeys = {
    "type",          "format", "required", "nullable", "default", "enum",   "min",    "max",
    "exclusive_min", "length", "one_of",   "unit",     "doc",     "fields", "values", "items"};

bool contains(const std::vector<std::string>& values, const std::string& value) {
  return std::find(values.begin(), values.end(), value) != values.end();
}

std::string join(const std::vector<std::string>& values, const std::string& separator) {
  std::string text;
  for (size_t i = 0; i < values.size(); ++i) text += (i ? separator : "") + values[i];
  return text;
}

void schema_assert(bool condition, const std::string& where, const std::string& what) {
  LOOM_ASSERT(condition, where + ": " + what);
}

std::string scalar_text(const YAML::Node& node, const std::string& where) {
  schema_assert(node.IsScalar(), where, "expected a scalar");
  return node.Scalar();
}

std::optional<double> schema_number(const YAML::Node& entry, const char* key, const std::string& where) {
  const YAML::Node value = entry[key];
  if (!value.IsDefined()) return std::nullopt;
  std::optional<double> number = yaml_number(value);
  schema_assert(number.has_value(), where + "." + key, "expected a number");
  return number;
}

bool schema_bool(const YAML::Node& entry, const char* key, const std::string& where) {
  const YAML::Node value = entry[key];
  if (!value.IsDefined()) return false;
  std::optional<bool> flag = yaml_bool(value);
  schema_assert(flag.has_value(), where + "." + key, "expected true or false");
  return *flag;
}

SchemaField parse_field(const YAML::Node& entry, const std::string& name, const std::string& where) {
  schema_assert(entry.IsMap(), where, "expected a map");
  for (const auto& item : entry)
    schema_assert(contains(kSchemaKeys, item.first.Scalar()), where, "unknown key " + item.first.Scalar());
  SchemaField field;
  field.name = name;
  field.type = scalar_text(entry["type"], where + ".type");
  schema_assert(contains(kTypes, field.type), where, "unknown type " + field.type);
  if (entry["format"]) {
    field.format = scalar_text(entry["format"], where + ".format");
    schema_assert(field.type == "string" && contains(kFormats, field.format), where, "bad format");
  }
  if (const YAML::Node required = entry["required"]) {
    if (required.IsScalar()) {
      field.required.push_back(required.Scalar());
    } else {
      schema_assert(required.IsSequence(), where, "required: expected a list");
      for (const auto& condition : required)
        field.required.push_back(scalar_text(condition, where + ".required"));
    }
    for (const std::string& condition : field.required)
      schema_assert(contains(kConditions, condition), where, "unknown required condition " + condition);
  }
  field.nullable = schema_bool(entry, "nullable", where);
  field.one_of = schema_bool(entry, "one_of", where);
  if (entry["default"]) field.default_value = entry["default"];
  if (const YAML::Node values = entry["enum"]) {
    schema_assert(values.IsSequence(), where, "enum: expected a list");
    for (const auto& value : values) field.enum_values.push_back(scalar_text(value, where + ".enum"));
  }
  field.min = schema_number(entry, "min", where);
  field.max = schema_number(entry, "max", where);
  field.exclusive_min = schema_number(entry, "exclusive_min", where);
  if (entry["length"]) field.length = yaml_int(entry["length"]);
  if (entry["unit"]) field.unit = scalar_text(entry["unit"], where + ".unit");
  if (entry["doc"]) field.doc = scalar_text(entry["doc"], where + ".doc");
  if (field.type == "map") {
    const YAML::Node fields = entry["fields"];
    schema_assert(fields.IsMap(), where, "a map needs fields");
    for (const auto& item : fields)
      field.fields.push_back(
          parse_field(item.second, item.first.Scalar(), where + "." + item.first.Scalar()));
  }
  if (field.type == "list" || field.type == "dict") {
    const char* key = field.type == "list" ? "items" : "values";
    schema_assert(entry[key].IsDefined(), where, std::string("needs ") + key);
    field.element = std::make_shared<const SchemaField>(parse_field(entry[key], "", where + "." + key));
  }
  return field;
}

// A number as the schema writes it: 1, 0.5, 1e-08.
std::string format_number(double value) {
  if (value == std::floor(value) && std::fabs(value) < 1e15)
    return std::to_string(static_cast<int64_t>(value));
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", value);
  return buffer;
}

// What a document node is, for "found X": the scalar as written (quoted ones say so), or
// its kind.
std::string describe_found(const YAML::Node& node) {
  if (!node.IsDefined()) return "nothing";
  if (node.IsNull()) return "null";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list of " + std::to_string(node.size()) + " items";
  std::string text = node.Scalar();
  size_t newline = text.find('\n');
  if (newline != std::string::npos || text.size() > 60)
    text = text.substr(0, std::min<size_t>(newline, 60)) + "...";
  return node.Tag() == "!" ? "the quoted string '" + text + "'" : text;
}

bool is_date(const std::string& text) {
  if (text.size() != 10 || text[4] != '-' || text[7] != '-') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9})
    if (text[i] < '0' || text[i] > '9') return false;
  int year = std::stoi(text.substr(0, 4)), month = std::stoi(text.substr(5, 2)),
      day = std::stoi(text.substr(8, 2));
  if (month < 1 || month > 12 || day < 1) return false;
  const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return day <= days[month - 1] + (month == 2 && leap ? 1 : 0);
}

bool is_sha256(const std::string& text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

bool is_url(const std::string& text) {
  for (const char* scheme : {"http://", "https://"}) {
    size_t n = std::char_traits<char>::length(scheme);
    if (text.size() > n && text.compare(0, n, scheme) == 0) return true;
  }
  return false;
}

class Checker {
 public:
  Checker(const SchemaContext& context, std::vector<Violation>* out) : context_(context), out_(out) {}

  void check(const YAML::Node& node, const SchemaField& field, const std::string& path, int line) {
    // An explicit tag ("!!str 5", "!!int '5'", "!custom x") gives a value another type than
    // the one it reads as; the schema types plain and quoted values alone ("?" and "!").
    const std::string& tag = node.Tag();
    if (!tag.empty() && tag != "?" && tag != "!") {
      add(path, line, "found the explicit YAML tag " + tag + ", expected a value without a tag");
      return;
    }
    if (node.IsNull()) {
      if (!field.nullable) add(path, line, "found null, expected " + schema_describe(field));
      return;
    }
    const std::string& type = field.type;
    if (type == "map") return check_map(node, field, path, line);
    if (type == "dict") return check_dict(node, field, path, line);
    if (type == "list") return check_list(node, field, path, line);
    check_scalar(node, field, path, line);
  }

  int line_of(const YAML::Node& node, const std::string& path) const {
    for (const std::string& set : context_.overridden) {
      if (path == set || (path.size() > set.size() && path.compare(0, set.size(), set) == 0 &&
                          (path[set.size()] == '.' || path[set.size()] == '[')))
        return 0;
    }
    const YAML::Mark mark = node.Mark();
    return mark.is_null() ? 0 : mark.line + 1;
  }

 private:
  void add(const std::string& path, int line, const std::string& what) {
    out_->push_back(Violation{context_.file, line, path, what});
  }

  void check_scalar(const YAML::Node& node, const SchemaField& field, const std::string& path, int line) {
    auto wrong = [&] {
      add(path, line, "found " + describe_found(node) + ", expected " + schema_describe(field));
    };
    if (!node.IsScalar()) return wrong();
    const std::string& text = node.Scalar();
    if (field.type == "string") {
      if (field.format == "date" && !is_date(text)) return wrong();
      if (field.format == "sha256" && !is_sha256(text)) return wrong();
      if (field.format == "url" && !is_url(text)) return wrong();
      if (field.format == "path" && text.empty()) return wrong();
      if (!field.enum_values.empty() && !contains(field.enum_values, text)) return wrong();
      return;
    }
    if (field.type == "bool") {
      if (!yaml_bool(node)) wrong();
      return;
    }
    std::optional<double> value;
    if (field.type == "int") {
      std::optional<int64_t> integer = yaml_int(node);
      if (!integer) return wrong();
      if (!field.enum_values.empty() && !contains(field.enum_values, std::to_string(*integer)))
        return wrong();
      value = static_cast<double>(*integer);
    } else {
      value = yaml_number(node);
      if (!value) return wrong();
    }
    if ((field.min && *value < *field.min) || (field.max && *value > *field.max) ||
        (field.exclusive_min && *value <= *field.exclusive_min))
      wrong();
  }

  // Checks the keys of a map: each a scalar, each once; hands each value to `visit`.
  template <typename Visit>
  std::vector<std::string> check_keys(const YAML::Node& node, const std::string& path, Visit visit) {
    std::vector<std::string> seen;
    std::vector<int> seen_lines;
    for (const auto& item : node) {
      if (!item.first.IsScalar()) {
        add(path, line_of(item.first, path),
            "found a key that is " + describe_found(item.first) + ", expected a name");
        continue;
      }
      const std::string& key = item.first.Scalar();
      std::string child = path.empty() ? key : path + "." + key;
      int key_line = line_of(item.first, child);
      auto previous = std::find(seen.begin(), seen.end(), key);
      if (previous != seen.end()) {
        int first_line = seen_lines[static_cast<size_t>(previous - seen.begin())];
        add(child, key_line,
            "found the key a second time" +
                (first_line ? " (first on line " + std::to_string(first_line) + ")" : "") +
                ", expected each key once");
        continue;
      }
      seen.push_back(key);
      seen_lines.push_back(key_line);
      visit(key, item.second, child, key_line);
    }
    return seen;
  }

  void check_map(const YAML::Node& node, const SchemaField& field, const std::string& path, int line) {
    if (!node.IsMap()) {
      add(path, line, "found " + describe_found(node) + ", expected " + schema_describe(field));
      return;
    }
    std::vector<std::string> names;
    for (const SchemaField& child : field.fields) names.push_back(child.name);
    std::vector<std::string> seen = check_keys(
        node, path,
        [&](const std::string& key, const YAML::Node& value, const std::string& child, int key_line) {
          if (const SchemaField* known = field.field(key)) return check(value, *known, child, key_line);
          std::string suggestion = schema_suggest(key, names);
          std::string where = path.empty() ? "a top-level field" : "a field of " + path;
          add(child, key_line,
              suggestion.empty()
                  ? "found an unknown key, expected one of " + join(names, ", ")
                  : "found an unknown key, expected " + where + "; did you mean '" + suggestion + "'?");
        });
    std::vector<std::string> present;
    for (const SchemaField& child : field.fields) {
      bool here = contains(seen, child.name);
      if (here && !node[child.name].IsNull()) present.push_back(child.name);
      if (here || !schema_required(child, context_)) continue;
      std::string reason;
      if (!contains(child.required, "always"))
        reason = contains(child.required, context_.status)
                     ? " (required when status is " + context_.status + ")"
                     : " (loom train needs it)";
      add(path.empty() ? child.name : path + "." + child.name, line,
          "found nothing, expected " + schema_describe(child) + reason);
    }
    if (field.one_of && present.size() != 1)
      add(path, line,
          "found " + (present.empty() ? std::string("none of them") : join(present, " and ")) +
              ", expected exactly one of " + join(names, ", "));
  }

  void check_dict(const YAML::Node& node, const SchemaField& field, const std::string& path, int line) {
    if (!node.IsMap()) {
      add(path, line, "found " + describe_found(node) + ", expected " + schema_describe(field));
      return;
    }
    check_keys(node, path,
               [&](const std::string&, const YAML::Node& value, const std::string& child, int key_line) {
                 check(value, *field.element, child, key_line);
               });
  }

  void check_list(const YAML::Node& node, const SchemaField& field, const std::string& path, int line) {
    if (!node.IsSequence() || (field.length && static_cast<int64_t>(node.size()) != *field.length)) {
      add(path, line, "found " + describe_found(node) + ", expected " + schema_describe(field));
      return;
    }
    for (size_t i = 0; i < node.size(); ++i) {
      std::string child = path + "[" + std::to_string(i) + "]";
      int item_line = line_of(node[i], child);
      check(node[i], *field.element, child, item_line ? item_line : line);
    }
  }

  const SchemaContext& context_;
  std::vector<Violation>* out_;
};

}  // namespace

std::optional<int64_t> yaml_int(const YAML::Node& node) {
  if (!node.IsDefined() || !node.IsScalar() || node.Tag() == "!") return std::nullopt;
  const std::string& text = node.Scalar();
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (begin != end && *begin == '+') ++begin;
  int64_t value = 0;
  auto [stop, error] = std::from_chars(begin, end, value);
  if (error != std::errc() || stop != end || begin == end) return std::nullopt;
  return value;
}

std::optional<double> yaml_number(const YAML::Node& node) {
  if (!node.IsDefined() || !node.IsScalar() || node.Tag() == "!") return std::nullopt;
  const std::string& text = node.Scalar();
  // Decimal notation only: strtod alone would also take hex, "inf" and "nan".
  if (text.empty() || text.find_first_not_of("0123456789+-.eE") != std::string::npos) return std::nullopt;
  char* stop = nullptr;
  double value = std::strtod(text.c_str(), &stop);
  if (stop != text.c_str() + text.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::optional<bool> yaml_bool(const YAML::Node& node) {
  if (!node.IsDefined() || !node.IsScalar() || node.Tag() == "!") return std::nullopt;
  const std::string& text = node.Scalar();
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  return std::nullopt;
}

const SchemaField* SchemaField::field(const std::string& key) const {
  for (const SchemaField& child : fields)
    if (child.name == key) return &child;
  return nullptr;
}

SchemaField schema_parse(std::string_view text, const std::string& where) {
  YAML::Node document = YAML::Load(std::string(text));
  schema_assert(document.IsMap() && document["fields"].IsMap(), where, "expected a map with fields");
  SchemaField root;
  root.type = "map";
  for (const auto& item : document["fields"])
    root.fields.push_back(parse_field(item.second, item.first.Scalar(), where + ": " + item.first.Scalar()));
  return root;
}

const SchemaField& recipe_schema() {
  // Parsed once: every recipe load and check reads it.
  static const SchemaField schema = schema_parse(recipe_schema_text(), "schema/recipe.schema.yaml");
  return schema;
}

const SchemaField* schema_find(const SchemaField& root, const std::vector<std::string>& path) {
  const SchemaField* field = &root;
  for (const std::string& key : path) {
    if (field->type == "map")
      field = field->field(key);
    else if (field->type == "dict")
      field = field->element.get();
    else
      return nullptr;
    if (!field) return nullptr;
  }
  return field;
}

bool schema_required(const SchemaField& field, const SchemaContext& context) {
  return contains(field.required, "always") || contains(field.required, context.status) ||
         (context.run && contains(field.required, "run"));
}

void schema_check(const YAML::Node& document, const SchemaField& root, const SchemaContext& context,
                  std::vector<Violation>* out) {
  Checker checker(context, out);
  checker.check(document, root, "", 0);
}

std::string schema_suggest(const std::string& name, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, name.size() / 3) + 1;
  for (const std::string& candidate : candidates) {
    // Levenshtein distance, one row at a time.
    std::vector<size_t> row(candidate.size() + 1);
    for (size_t j = 0; j <= candidate.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= name.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= candidate.size(); ++j) {
        size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (name[i - 1] == candidate[j - 1] ? 0 : 1)});
        diagonal = above;
      }
    }
    if (row[candidate.size()] < best_distance) {
      best_distance = row[candidate.size()];
      best = candidate;
    }
  }
  return best;
}

std::string schema_describe(const SchemaField& field) {
  std::string text;
  if (!field.enum_values.empty()) {
    text = "one of " + join(field.enum_values, ", ");
  } else if (field.type == "int" || field.type == "number") {
    text = field.type == "int" ? "an integer" : "a number";
    if (field.min && field.max)
      text += " in [" + format_number(*field.min) + ", " + format_number(*field.max) + "]";
    else if (field.exclusive_min && field.max)
      text += " in (" + format_number(*field.exclusive_min) + ", " + format_number(*field.max) + "]";
    else if (field.min)
      text += " >= " + format_number(*field.min);
    else if (field.max)
      text += " <= " + format_number(*field.max);
    if (field.exclusive_min && !field.max) text += " > " + format_number(*field.exclusive_min);
  } else if (field.type == "bool") {
    text = "true or false";
  } else if (field.type == "string") {
    if (field.format == "date")
      text = "a date (YYYY-MM-DD)";
    else if (field.format == "sha256")
      text = "a sha256 (64 lowercase hex digits)";
    else if (field.format == "url")
      text = "an http(s) URL";
    else if (field.format == "path")
      text = "a path";
    else
      text = "a string";
  } else if (field.type == "map") {
    std::vector<std::string> names;
    for (const SchemaField& child : field.fields) names.push_back(child.name);
    text = "a map with fields " + join(names, ", ");
  } else if (field.type == "dict") {
    text = "a map of names to " + schema_describe(*field.element);
  } else {
    text = "a list of " + (field.length ? std::to_string(*field.length) + " x " : std::string()) +
           schema_describe(*field.element);
  }
  if (field.nullable) text += " or null";
  return text;
}

}  // namespace loom
