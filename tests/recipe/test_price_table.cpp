// The instance price table (data/instance_prices.yaml) and the cost of a million tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "recipe/price_table.h"

namespace loom {
namespace {

TEST(PriceTable, EveryEntryHasADateAndASource) {
  const std::vector<InstancePrice>& table = price_table();
  ASSERT_FALSE(table.empty());
  for (const InstancePrice& price : table) {
    EXPECT_EQ(price.date.size(), 10u) << price.instance;
    EXPECT_EQ(price.source.rfind("https://", 0), 0u) << price.instance;
    EXPECT_GT(price.usd_per_hour, 0) << price.instance;
    EXPECT_GE(price.gpus, 1) << price.instance;
  }
}

// The seed: 2,200.16 tokens/s/GPU on p5en.48xlarge gives $1.00 per 1M tokens.
TEST(PriceTable, SeedsInstanceGivesOneDollarPerMillionTokens) {
  std::optional<InstancePrice> price = price_table_find(price_table(), "AWS p5en.48xlarge");
  ASSERT_TRUE(price.has_value());
  EXPECT_EQ(price->gpus, 8);
  EXPECT_EQ(price->gpu, "H200");
  const double usd = usd_per_million_tokens(price->usd_per_gpu_hour(), 2200.16);
  EXPECT_EQ(std::round(usd * 100) / 100, 1.00) << usd;
  // docs/numerics.md's form: instance $/h / (GPUs · tokens/s/GPU · 3600) · 1e6.
  EXPECT_DOUBLE_EQ(usd, price->usd_per_hour / (8 * 2200.16 * 3600) * 1e6);
}

TEST(PriceTable, FindsByNameWithOrWithoutTheProvider) {
  const std::vector<InstancePrice>& table = price_table();
  EXPECT_TRUE(price_table_find(table, "p5en.48xlarge").has_value());
  EXPECT_TRUE(price_table_find(table, "aws P5EN.48xlarge").has_value());
  EXPECT_FALSE(price_table_find(table, "p5en").has_value());
  EXPECT_FALSE(price_table_find(table, "my cluster").has_value());
}

TEST(PriceTable, RecipeOverrideWinsOverTheTable) {
  std::optional<GpuPrice> table = gpu_price("AWS p5en.48xlarge", 0);
  ASSERT_TRUE(table.has_value());
  EXPECT_NE(table->source.find("data/instance_prices.yaml: AWS p5en.48xlarge"), std::string::npos)
      << table->source;
  std::optional<GpuPrice> own = gpu_price("AWS p5en.48xlarge", 2.5);
  ASSERT_TRUE(own.has_value());
  EXPECT_DOUBLE_EQ(own->usd_per_gpu_hour, 2.5);
  EXPECT_EQ(own->source, "gpu.usd_per_gpu_hour");
  EXPECT_TRUE(gpu_price("my cluster", 2.5).has_value());
  EXPECT_FALSE(gpu_price("my cluster", 0).has_value());
  EXPECT_FALSE(gpu_price("", 0).has_value());
}

TEST(PriceTable, MalformedEntriesNameTheirField) {
  auto error = [](const std::string& text) {
    try {
      price_table_parse(text, "prices.yaml");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string entry =
      "instances:\n  - {instance: X, gpus: 8, gpu: H200, usd_per_hour: 10, pricing: on-demand, date: "
      "2026-01-02, "
      "source: https://example.com";
  EXPECT_EQ(error(entry + "}\n"), "");
  EXPECT_EQ(
      error("instances:\n  - {instance: X, gpus: 8, gpu: H200, usd_per_hour: 10, pricing: p, source: s}\n"),
      "prices.yaml: instances[0].date: expected a non-empty string");
  EXPECT_EQ(
      error(
          "instances:\n  - {instance: X, gpus: 0, gpu: H200, usd_per_hour: 10, pricing: p, date: 2026-01-02, "
          "source: s}\n"),
      "prices.yaml: instances[0].gpus: expected an integer >= 1");
  EXPECT_EQ(error("instances:\n  - {instance: X, gpus: 8, gpu: H200, usd_per_hour: free, pricing: p, date: "
                  "2026-01-02, "
                  "source: s}\n"),
            "prices.yaml: instances[0].usd_per_hour: expected a number > 0");
  EXPECT_EQ(
      error(
          "instances:\n  - {instance: X, gpus: 8, gpu: H200, usd_per_hour: 1, pricing: p, date: 2026/01/02, "
          "source: s}\n"),
      "prices.yaml: instances[0].date: found 2026/01/02, expected YYYY-MM-DD");
  EXPECT_EQ(error("prices: []\n"), "prices.yaml: instances: expected a list of entries");
}

}  // namespace
}  // namespace loom
