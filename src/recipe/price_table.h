// The instance price table (data/instance_prices.yaml, embedded at build time) and the
// price of a recipe's GPUs: what `$ / 1M tokens` is computed from.
//
//   usd_per_gpu_hour = usd_per_hour / gpus            (of the instance's entry)
//   $ / 1M tokens    = usd_per_gpu_hour / 3600 / (tokens/s/GPU) · 10^6
// which for one 8-GPU instance is docs/numerics.md's instance $/h / (8 · tokens/s/GPU · 3600) · 10^6.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

struct InstancePrice {
  std::string instance;     // as a recipe's gpu.instance writes it ("AWS p5en.48xlarge")
  int64_t gpus = 0;         // GPUs per instance
  std::string gpu;          // their model (H200)
  double usd_per_hour = 0;  // one instance for one hour
  std::string pricing;      // which price: on-demand, region, OS
  std::string date;         // YYYY-MM-DD the price is as of
  std::string source;       // where it is published (a URL)
  std::string note;

  double usd_per_gpu_hour() const { return usd_per_hour / static_cast<double>(gpus); }
};

// The text of data/instance_prices.yaml as it was when loom was built.
std::string_view instance_prices_text();

// Parses a price table; `where` names it in errors. Every entry needs instance, gpus >= 1,
// gpu, usd_per_hour > 0, pricing, date (YYYY-MM-DD) and source: InputError naming the
// entry and field otherwise.
std::vector<InstancePrice> price_table_parse(std::string_view text, const std::string& where);
// The embedded table, parsed.
const std::vector<InstancePrice>& price_table();

// The entry for a recipe's gpu.instance: equal names (case-insensitive), or the entry's
// name without its first word, the provider ("p5en.48xlarge" finds "AWS p5en.48xlarge").
std::optional<InstancePrice> price_table_find(const std::vector<InstancePrice>& table,
                                              const std::string& instance);

// The price a measurement uses, and where it comes from.
struct GpuPrice {
  double usd_per_gpu_hour = 0;
  std::string source;  // "gpu.usd_per_gpu_hour" or "data/instance_prices.yaml: <instance>, <pricing>, <date>"
};

// The recipe's override when given (> 0), else the table's entry for gpu.instance; nullopt
// when neither (an instance not in the table, or no gpu block).
std::optional<GpuPrice> gpu_price(const std::string& instance, double usd_per_gpu_hour_override);

// usd_per_gpu_hour / 3600 / tokens_per_s_per_gpu · 1e6: the cost of one million tokens.
double usd_per_million_tokens(double usd_per_gpu_hour, double tokens_per_s_per_gpu);

}  // namespace loom
