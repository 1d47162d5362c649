#include "recipe/price_table.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "recipe/schema.h"

namespace loom {
namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

bool is_date(const std::string& text) {
  if (text.size() != 10 || text[4] != '-' || text[7] != '-') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9})
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  return true;
}

}  // namespace

std::vector<InstancePrice> price_table_parse(std::string_view text, const std::string& where) {
  YAML::Node document;
  try {
    document = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw_input_error(where, "not valid YAML: " + e.msg);
  }
  const YAML::Node instances = document["instances"];
  if (!instances.IsSequence()) throw_input_error(where, "instances: expected a list of entries");
  std::vector<InstancePrice> table;
  for (size_t i = 0; i < instances.size(); ++i) {
    const YAML::Node entry = instances[i];
    const std::string at = where + ": instances[" + std::to_string(i) + "]";
    if (!entry.IsMap()) throw_input_error(at, "expected a map");
    auto text_field = [&](const char* key, bool required) {
      const YAML::Node value = entry[key];
      if (!value.IsDefined() && !required) return std::string();
      if (!value.IsDefined() || !value.IsScalar() || value.Scalar().empty())
        throw_input_error(at + "." + key, "expected a non-empty string");
      return value.Scalar();
    };
    InstancePrice price;
    price.instance = text_field("instance", true);
    price.gpu = text_field("gpu", true);
    price.pricing = text_field("pricing", true);
    price.date = text_field("date", true);
    price.source = text_field("source", true);
    price.note = text_field("note", false);
    if (!is_date(price.date))
      throw_input_error(at + ".date", "found " + price.date + ", expected YYYY-MM-DD");
    std::optional<int64_t> gpus = yaml_int(entry["gpus"]);
    if (!gpus || *gpus < 1) throw_input_error(at + ".gpus", "expected an integer >= 1");
    price.gpus = *gpus;
    std::optional<double> usd = yaml_number(entry["usd_per_hour"]);
    if (!usd || *usd <= 0) throw_input_error(at + ".usd_per_hour", "expected a number > 0");
    price.usd_per_hour = *usd;
    table.push_back(price);
  }
  return table;
}

const std::vector<InstancePrice>& price_table() {
  static const std::vector<InstancePrice> table =
      price_table_parse(instance_prices_text(), "data/instance_prices.yaml");
  return table;
}

std::optional<InstancePrice> price_table_find(const std::vector<InstancePrice>& table,
                                              const std::string& instance) {
  const std::string wanted = lower(instance);
  for (const InstancePrice& price : table) {
    const std::string name = lower(price.instance);
    const size_t space = name.find(' ');
    if (wanted == name || (space != std::string::npos && wanted == name.substr(space + 1))) return price;
  }
  return std::nullopt;
}

std::optional<GpuPrice> gpu_price(const std::string& instance, double usd_per_gpu_hour_override) {
  if (usd_per_gpu_hour_override > 0) return GpuPrice{usd_per_gpu_hour_override, "gpu.usd_per_gpu_hour"};
  if (instance.empty()) return std::nullopt;
  std::optional<InstancePrice> price = price_table_find(price_table(), instance);
  if (!price) return std::nullopt;
  return GpuPrice{price->usd_per_gpu_hour(), "data/instance_prices.yaml: " + price->instance + ", " +
                                                 price->pricing + ", " + price->date};
}

double usd_per_million_tokens(double usd_per_gpu_hour, double tokens_per_s_per_gpu) {
  return usd_per_gpu_hour / 3600.0 / tokens_per_s_per_gpu * 1e6;
}

}  // namespace loom
