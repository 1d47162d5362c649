// JSON parsed with its duplicate keys found. nlohmann::json keeps the last of a key written
// twice in one object, so a config.json or a row with "hidden_size" twice would be read as
// whichever came last; loom's inputs refuse them instead.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

namespace loom {

struct StrictJson {
  nlohmann::json value;                  // discarded (is_discarded()) when not valid JSON
  std::optional<std::string> duplicate;  // the first key found twice in one object
};

inline StrictJson json_parse_strict(const std::string& text) {
  StrictJson out;
  std::vector<std::unordered_set<std::string>> objects;  // the keys of each open object
  const nlohmann::json::parser_callback_t watch = [&](int, nlohmann::json::parse_event_t event,
                                                      nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) objects.emplace_back();
    if (event == Event::object_end && !objects.empty()) objects.pop_back();
    if (event == Event::key && !objects.empty() && !objects.back().insert(parsed.get<std::string>()).second &&
        !out.duplicate)
      out.duplicate = parsed.get<std::string>();
    return true;
  };
  out.value = nlohmann::json::parse(text, watch, false);
  return out;
}

}  // namespace loom
