// The recipe page (recipe/render.h) against the seed's page (seed/recipe-page.txt).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "recipe/render.h"
#include "recipe_test_util.h"

namespace loom {
namespace {

// The seed page's label/value pairs, as seed/recipe-page.txt shows them.
struct PageLine {
  const char* label;
  const char* value;
};

const PageLine kSeedPage[] = {
    {"GPUs", "8 x H200 141 GB (AWS p5en.48xlarge, 8 per node)"},
    {"Layout",
     "TP 4, PP 2 (32 layers per stage), CP 1, DP 1, sequence parallel; two 8,192-token rows per microbatch "
     "(max 16,384 "
     "tokens per GPU); no recompute; precision-aware distributed optimizer; no offload; dense model, no "
     "experts"},
    {"Tokens/s per GPU", "2,200.16"},
    {"$ / 1M tokens", "$1.00"},
    {"MFU", "42.7% (N = 31,983,534,080 active parameters per token)"},
    {"Step-time CV", "0.45%"},
    {"Convergence check",
     "correlation 0.9999998, final loss difference 0.00012, 0 pointwise failures over 20 steps"},
    {"Component test",
     "precision-aware Adam on the GPU and CPU optimizer offload (fraction 1.0, overlapped copies), each "
     "against an FP64 "
     "reference: H200, 2026-10-11. Shape: one Qwen3.5-397B-A17B MoE layer: hidden 4096, 512 experts, top-10, "
     "expert "
     "FFN 1024, EP 8, ETP 1, 4,096 tokens per rank. worst tensor (update) relative L2 error 5.12e-7 on the "
     "GPU and "
     "7.98e-7 offloaded against a bound of 1.0e-3 after one step, and 4.99e-5 and 7.72e-5 against 1.1e-3 "
     "after three "
     "steps at the recipe's hyperparameters (bound 2 x the default GPU optimizer's error + 1e-3); "
     "reconstructed FP32 "
     "masters bitwise identical to an arm with explicit FP32 masters, the TE remainder self-test passes and "
     "the "
     "negative controls fail run on this recipe's training image (the same image configuration); the "
     "optimizer step is "
     "elementwise, so the result holds for every model on the image"},
    {"Measured", "2026-10-18"},
    {"GPU-hours", "3.02"},
    {"Rows",
     "qwen3-tulu3-fixed8192-v1 (rows_sha256 "
     "8f76b822a284adbe24faaf3cfe725e65cb5e94f98ba54aceade45b275345f983)"},
};

std::string seed_page(RenderFormat format, const RunSeries* run = nullptr) {
  const std::string text = test::read_text(test::seed_path());
  return recipe_render(YAML::Load(text), text, format, run);
}

TEST(RenderMarkdown, SeedPageHasTheSeedsLinesInOrder) {
  const std::string page = seed_page(RenderFormat::markdown);
  EXPECT_EQ(page.rfind("# Training Qwen3-32B on H200\n", 0), 0u) << page.substr(0, 200);
  EXPECT_NE(page.find("| **Author** | ATTUNE ([cite](https://arxiv.org/abs/2610.17528)) |"),
            std::string::npos);
  size_t previous = 0;
  for (const PageLine& line : kSeedPage) {
    const std::string row = std::string("| **") + line.label + "** | " + line.value;
    const size_t at = page.find(row);
    ASSERT_NE(at, std::string::npos) << row;
    EXPECT_GT(at, previous) << line.label << " is out of the seed's order";
    previous = at;
  }
  // The CV says what it is; the command and the recipe file follow.
  EXPECT_NE(page.find("0.45% (population standard deviation / mean, steps 5 to 19)"), std::string::npos);
  EXPECT_NE(page.find("## Command\n\n```sh\nexport CUDA_DEVICE_MAX_CONNECTIONS=1\n"), std::string::npos);
  EXPECT_NE(page.find("## Recipe\n\n```yaml\n# recipes/qwen3-32b/h200/attune-tp4-pp2-mt16k.yaml\n"),
            std::string::npos);
  EXPECT_EQ(page.find("<svg"), std::string::npos) << "no run, no charts";
}

// The page with the headline figures' <span class="figure"> markup taken out.
std::string without_figure_spans(std::string page) {
  for (const std::string tag : {"<span class=\"figure\">", "</span>"})
    for (size_t at = page.find(tag); at != std::string::npos; at = page.find(tag, at))
      page.erase(at, tag.size());
  return page;
}

TEST(RenderHtml, SeedPageHasTheSeedsLinesEscaped) {
  const std::string marked = seed_page(RenderFormat::html);
  EXPECT_NE(marked.find("<dt>MFU</dt><dd><span class=\"figure\">42.7%</span> (N = 31,983,534,080"),
            std::string::npos);
  const std::string page = without_figure_spans(marked);
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(page.find("<h1>Training Qwen3-32B on H200</h1>"), std::string::npos);
  EXPECT_NE(
      page.find("<dt>Author</dt><dd>ATTUNE (<a href=\"https://arxiv.org/abs/2610.17528\">cite</a>)</dd>"),
      std::string::npos);
  for (const PageLine& line : kSeedPage) {
    std::string value = line.value;
    for (size_t at = value.find('\''); at != std::string::npos; at = value.find('\'', at + 5))
      value.replace(at, 1, "&#39;");
    EXPECT_NE(page.find(std::string("<dt>") + line.label + "</dt>"), std::string::npos) << line.label;
    EXPECT_NE(page.find(value), std::string::npos) << line.label;
  }
  // The run script's "$(" and "<slime entry module>" are escaped inside <pre>.
  EXPECT_NE(page.find("python3 -m &lt;slime entry module&gt; --async"), std::string::npos);
  EXPECT_EQ(page.find("<slime entry module>"), std::string::npos);
}

TEST(RenderHtml, TextFromTheRecipeIsEscaped) {
  const std::string text =
      "schema_version: 1\nmodel: Qwen3-0.6B\nstatus: draft\nauthor: {name: '<script>x</script> & co', url: "
      "'https://a.example/?q=\"1\"'}\nworkload: {row_tokens: 8192, global_batch: 8}\nlayout: {tp: 1, pp: 1, "
      "cp: 1, dp: "
      "1, max_tokens_per_gpu: 8192}\n";
  const std::string page = recipe_render(YAML::Load(text), text, RenderFormat::html, nullptr);
  EXPECT_EQ(page.find("<script>"), std::string::npos);
  EXPECT_NE(page.find("&lt;script&gt;x&lt;/script&gt; &amp; co"), std::string::npos);
  EXPECT_NE(page.find("href=\"https://a.example/?q=&quot;1&quot;\""), std::string::npos);
}

TEST(RenderMarkdown, DraftShowsWhatItHas) {
  const std::string path = test::source_path("recipes/tiny/qwen3-tiny-cpu.yaml");
  const std::string text = test::read_text(path);
  const std::string page = recipe_render(YAML::Load(text), text, RenderFormat::markdown, nullptr);
  EXPECT_EQ(page.rfind("# Training qwen3-tiny on the CPU\n", 0), 0u) << page.substr(0, 100);
  EXPECT_NE(page.find("| **GPUs** | 1 CPU rank (tp·pp·cp·dp; the recipe has no gpu block) |"),
            std::string::npos);
  EXPECT_NE(
      page.find("| **Layout** | TP 1, PP 1, CP 1, DP 1; max 512 tokens per GPU; no recompute; no offload |"),
      std::string::npos);
  EXPECT_NE(page.find("| **Tokens/s per GPU** | not measured |"), std::string::npos);
  EXPECT_NE(page.find("| **Convergence check** | not checked |"), std::string::npos);
  EXPECT_NE(page.find("| **Rows** | rows.jsonl |"), std::string::npos);
  EXPECT_EQ(page.find("## Command"), std::string::npos);
}

TEST(RenderMarkdown, TableCellsEscapePipes) {
  const std::string text =
      "schema_version: 1\nmodel: Qwen3-0.6B\nstatus: draft\nworkload: {row_tokens: 8192, global_batch: 8}\n"
      "layout: {tp: 1, pp: 1, cp: 1, dp: 1, max_tokens_per_gpu: 8192, summary: 'a | b'}\n";
  const std::string page = recipe_render(YAML::Load(text), text, RenderFormat::markdown, nullptr);
  EXPECT_NE(page.find("| **Layout** | a \\| b |"), std::string::npos) << page;
}

RunSeries twenty_steps() {
  RunSeries run;
  run.source = "runs/seed";
  for (int64_t step = 1; step <= 20; ++step) {
    run.steps.push_back(step);
    run.loss.push_back(1.2 - 0.02 * static_cast<double>(step));
    run.step_time_s.push_back(step <= 2 ? 90.0 : 59.57 + 0.1 * static_cast<double>(step % 3));
  }
  return run;
}

TEST(RenderCharts, RunAddsLossAndStepTimeCharts) {
  const RunSeries run = twenty_steps();
  for (RenderFormat format : {RenderFormat::markdown, RenderFormat::html}) {
    const std::string page = seed_page(format, &run);
    size_t svgs = 0;
    for (size_t at = page.find("<svg"); at != std::string::npos; at = page.find("<svg", at + 1)) ++svgs;
    EXPECT_EQ(svgs, 2u);
    EXPECT_NE(page.find("aria-label=\"Loss per step\""), std::string::npos);
    EXPECT_NE(page.find("aria-label=\"Step time per step\""), std::string::npos);
    EXPECT_NE(
        page.find("From runs/seed/metrics.jsonl, 20 steps; shaded: the measurement window (steps 5 to 19)."),
        std::string::npos);
  }
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(RenderCharts, LineChartDrawsEachPointAndBreaksAtGaps) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::string svg =
      svg_line_chart({1, 2, 3, 4, 5}, {5.0, 4.0, nan, 3.0, 2.5}, {"Loss", "loss", std::nullopt});
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 720 260\"", 0), 0u) << svg;
  EXPECT_EQ(svg.substr(svg.size() - 6), "</svg>");
  EXPECT_EQ(count(svg, "<circle"), 4u);
  EXPECT_EQ(count(svg, "<path"), 1u);
  // Two pieces: M at step 1 and again at step 4.
  const size_t d = svg.find(" d=\"");
  const std::string path = svg.substr(d, svg.find('"', d + 4) - d);
  EXPECT_EQ(count(path, "M"), 2u) << path;
  EXPECT_EQ(count(path, "L"), 2u) << path;
  EXPECT_NE(svg.find("<title>step 4: 3</title>"), std::string::npos);
  EXPECT_EQ(count(svg, "fill-opacity=\"0.25\""), 0u) << "no band asked for";

  const std::string banded =
      svg_line_chart({1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}, {"Step time", "seconds", {{2, 4}}});
  EXPECT_EQ(count(banded, "fill-opacity=\"0.25\""), 1u);
  const std::string empty = svg_line_chart({}, {}, {"Loss", "loss", std::nullopt});
  EXPECT_NE(empty.find(">no data</text>"), std::string::npos);
  EXPECT_EQ(count(empty, "<circle"), 0u);
}

// train.eval's loss on the loss chart: its own dashed line and dots, a legend naming both.
TEST(RenderCharts, LossChartCarriesTheEvalLoss) {
  ChartSpec spec{"Training and eval loss per step", "loss", std::nullopt};
  spec.second_x = {0, 2, 4};
  spec.second_y = {6.0, 4.5, 3.9};
  spec.first_name = "train loss";
  spec.second_name = "eval loss (held-out rows)";
  const std::string svg = svg_line_chart({1, 2, 3, 4}, {5.5, 4.8, 4.1, 3.7}, spec);
  EXPECT_EQ(count(svg, "<circle"), 7u);
  EXPECT_EQ(count(svg, "<path"), 2u);
  EXPECT_NE(svg.find("<title>step 0: 6</title>"), std::string::npos) << svg;
  EXPECT_NE(svg.find(">eval loss (held-out rows)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">train loss</text>"), std::string::npos);
  // The y axis covers both series: 6.0 is above every training loss.
  EXPECT_NE(svg.find(">6.0</text>"), std::string::npos) << svg;
}

TEST(RenderCharts, YTicksAreRoundNumbersCoveringTheData) {
  const std::string svg = svg_line_chart({1, 2, 3}, {0.93, 1.17, 1.41}, {"Loss", "loss", std::nullopt});
  // Ticks of 0.1 from 0.9 to 1.5.
  for (const char* tick : {">0.9</text>", ">1.0</text>", ">1.2</text>", ">1.5</text>"})
    EXPECT_NE(svg.find(tick), std::string::npos) << tick << "\n" << svg;
  EXPECT_EQ(svg.find(">0.8</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">1.6</text>"), std::string::npos);
}

TEST(Format, Thousands) {
  EXPECT_EQ(format_thousands(2200.16, 2), "2,200.16");
  EXPECT_EQ(format_thousands(31983534080.0, 0), "31,983,534,080");
  EXPECT_EQ(format_thousands(999.996, 2), "1,000.00");
  EXPECT_EQ(format_thousands(12.5, 1), "12.5");
  EXPECT_EQ(format_thousands(-1234567, 0), "-1,234,567");
  EXPECT_EQ(format_thousands(0, 2), "0.00");
}

}  // namespace
}  // namespace loom
