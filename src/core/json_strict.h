// JSON parsed with its duplicate keys found. nlohmann::json keeps the last of a key written
// twice in one object, so a config.json or a row with "hidden_size" twice would be read as
// whichever came last; loom's inputs refuse them instead.
#pragma once

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/error.h"

namespace loom {

template <typename Json>
struct StrictParsed {
  Json value;                            // discarded (is_discarded()) when not valid JSON
  std::optional<std::string> duplicate;  // the first key found twice in one object
};
using StrictJson = StrictParsed<nlohmann::json>;

// `Json`: nlohmann::json, or nlohmann::ordered_json where the order of keys is kept. A number
// too large for a double (1e999) is invalid JSON too. With `throw_invalid`, invalid JSON
// throws the parser's Json::exception (its message says where and what) instead.
template <typename Json = nlohmann::json>
StrictParsed<Json> json_parse_strict(std::string_view text, bool throw_invalid = false) {
  StrictParsed<Json> out;
  std::vector<std::unordered_set<std::string>> objects;  // the keys of each open object
  const typename Json::parser_callback_t watch = [&](int, typename Json::parse_event_t event, Json& parsed) {
    using Event = typename Json::parse_event_t;
    if (event == Event::object_start) objects.emplace_back();
    if (event == Event::object_end && !objects.empty()) objects.pop_back();
    if (event == Event::key && !objects.empty() &&
        !objects.back().insert(parsed.template get<std::string>()).second && !out.duplicate)
      out.duplicate = parsed.template get<std::string>();
    return true;
  };
  out.value = Json::parse(text, watch, throw_invalid);
  return out;
}

// A JSON file read whole, each key once: InputError naming `path` otherwise (it cannot be
// opened, is not JSON, or writes a key twice in one object).
inline nlohmann::json json_read_file_strict(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_input_error(path, "cannot open");
  std::stringstream text;
  text << in.rdbuf();
  StrictJson parsed = json_parse_strict(text.str());
  if (parsed.value.is_discarded()) throw_input_error(path, "not valid JSON");
  if (parsed.duplicate)
    throw_input_error(path,
                      "found the key '" + *parsed.duplicate + "' a second time, expected each key once");
  return std::move(parsed.value);
}

// A JSONL line read as one object, each key once: InputError naming `where` (FILE:LINE)
// otherwise. For the JSONL files loom reads back (metrics.jsonl: resume, the convergence check).
inline nlohmann::json json_object_line(std::string_view line, const std::string& where) {
  StrictJson parsed = json_parse_strict(line);
  if (parsed.value.is_discarded() || !parsed.value.is_object()) throw_input_error(where, "not a JSON object");
  if (parsed.duplicate)
    throw_input_error(where,
                      "found the key '" + *parsed.duplicate + "' a second time, expected each key once");
  return std::move(parsed.value);
}

}  // namespace loom
