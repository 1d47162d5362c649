// The recipe page (`loom recipe render`): a recipe as the seed's page shows it, in Markdown
// or as one self-contained HTML file, with SVG charts of a run's loss and step time.
//
// The page, in the seed's order (seed/recipe-page.txt): the title "Training MODEL on GPU",
// then Author, GPUs, Layout, Tokens/s per GPU, $ / 1M tokens, MFU, Step-time CV,
// Convergence check, Component test, Measured, GPU-hours and Rows; then the charts (with a
// run), the run command (`run:`) and the recipe file itself. A draft shows what it has:
// "not measured" for an absent result field, "not checked" for absent correctness.
//
// Figures are formatted as the seed's page does: tokens/s with thousands separators and two
// decimals (2,200.16), $ with two decimals ($1.00), MFU in percent with one decimal (42.7%),
// the step-time CV in percent with two (0.45%); other values are printed as written.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

enum class RenderFormat { markdown, html };

// A run's per-step series for the charts (from its metrics.jsonl); NaN values are gaps.
struct RunSeries {
  std::string source;  // the run folder, named in the charts' caption
  std::vector<int64_t> steps;
  std::vector<double> loss;
  std::vector<double> step_time_s;
  // train.eval's records (step 0 included); empty without one.
  std::vector<int64_t> eval_steps;
  std::vector<double> eval_loss;
};

struct ChartSpec {
  std::string title;    // drawn at the top left
  std::string y_label;  // the y axis (the x axis is "step")
  // Steps [first, last] shaded as the measurement window; nullopt: none.
  std::optional<std::pair<int64_t, int64_t>> band;
  // A second series on the same axes (the eval loss beside the training loss), drawn in
  // another colour, with a legend naming both; empty second_x: none.
  std::vector<int64_t> second_x = {};
  std::vector<double> second_y = {};
  std::string first_name = {}, second_name = {};
};

// An inline SVG (width 720, height 260, viewBox set so it scales) of y over the steps x:
// a line with a dot per point, axes with rounded ticks, gridlines and the optional band.
// x and y have the same length; an empty series draws the axes and "no data".
std::string svg_line_chart(const std::vector<int64_t>& x, const std::vector<double>& y,
                           const ChartSpec& spec);

// The page of a recipe document that validates (recipe_validate). `source_text` is the
// recipe file as written, shown at the end (comments kept); `run` adds the charts.
std::string recipe_render(const YAML::Node& document, const std::string& source_text, RenderFormat format,
                          const RunSeries* run);

// 2200.16 → "2,200.16" (decimals 2); 31983534080 → "31,983,534,080" (decimals 0).
std::string format_thousands(double value, int decimals);

}  // namespace loom
