#include "recipe/render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "recipe/schema.h"

namespace loom {
namespace {

// The document's node at a dotted path; undefined when any part is missing.
YAML::Node at(const YAML::Node& document, const std::string& path) {
  // reset(), not assignment: assigning to a Node that refers into `document` would write.
  YAML::Node node;
  node.reset(document);
  std::istringstream parts(path);
  std::string key;
  while (std::getline(parts, key, '.')) {
    if (!node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node& map = node;
    YAML::Node child = map[key];
    if (!child.IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    node.reset(child);
  }
  return node;
}

// A scalar as written; nullopt when absent, null or not a scalar.
std::optional<std::string> text_at(const YAML::Node& document, const std::string& path) {
  YAML::Node node = at(document, path);
  if (!node.IsDefined() || !node.IsScalar()) return std::nullopt;
  return node.Scalar();
}

std::optional<double> number_at(const YAML::Node& document, const std::string& path) {
  YAML::Node node = at(document, path);
  return node.IsDefined() ? yaml_number(node) : std::nullopt;
}

std::optional<int64_t> int_at(const YAML::Node& document, const std::string& path) {
  YAML::Node node = at(document, path);
  return node.IsDefined() ? yaml_int(node) : std::nullopt;
}

std::string fixed(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// A Markdown table cell: one line, pipes escaped.
std::string md_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}

// A fenced code block that no line of `text` can close: one backtick more than its longest run.
std::string md_fence(const std::string& text, const std::string& info) {
  size_t longest = 0, run = 0;
  for (char c : text) {
    run = c == '`' ? run + 1 : 0;
    longest = std::max(longest, run);
  }
  const std::string fence(std::max<size_t>(3, longest + 1), '`');
  std::string body = text;
  if (!body.empty() && body.back() != '\n') body += '\n';
  return fence + info + "\n" + body + fence + "\n";
}

// One piece of a value: text, or a link.
struct Span {
  std::string text;
  std::string href;     // "" for plain text
  bool figure = false;  // a headline figure: large on the HTML page
};

struct Row {
  std::string label;
  std::vector<Span> value;
};

std::vector<Span> plain(const std::string& text) {
  return {Span{text, ""}};
}

// A measured figure and what qualifies it ("42.7%", " (N = ...)").
std::vector<Span> figure(const std::string& value, const std::string& rest) {
  std::vector<Span> spans = {Span{value, "", true}};
  if (!rest.empty()) spans.push_back(Span{rest, ""});
  return spans;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

std::string title_of(const YAML::Node& doc) {
  std::string title = "Training " + text_at(doc, "model").value_or("a model");
  if (std::optional<std::string> gpu = text_at(doc, "gpu.type"))
    title += " on " + *gpu;
  else if (text_at(doc, "train.device") == "cpu")
    title += " on the CPU";
  return title;
}

std::string gpus_of(const YAML::Node& doc) {
  std::optional<int64_t> count = int_at(doc, "gpu.count");
  std::optional<std::string> type = text_at(doc, "gpu.type");
  if (count && type) {
    std::string text = std::to_string(*count) + " x " + *type;
    if (std::optional<std::string> memory = text_at(doc, "gpu.memory_gb")) text += " " + *memory + " GB";
    std::vector<std::string> details;
    if (std::optional<std::string> instance = text_at(doc, "gpu.instance")) details.push_back(*instance);
    if (std::optional<std::string> per_node = text_at(doc, "gpu.per_node"))
      details.push_back(*per_node + " per node");
    if (!details.empty()) text += " (" + join(details, ", ") + ")";
    return text;
  }
  const int64_t ranks = int_at(doc, "layout.tp").value_or(1) * int_at(doc, "layout.pp").value_or(1) *
                        int_at(doc, "layout.cp").value_or(1) * int_at(doc, "layout.dp").value_or(1);
  const bool cpu = text_at(doc, "train.device") == "cpu";
  return std::to_string(ranks) +
         (cpu ? (ranks == 1 ? " CPU rank" : " CPU ranks") : (ranks == 1 ? " GPU" : " GPUs")) +
         " (tp·pp·cp·dp; the recipe has no gpu block)";
}

// layout.summary, or one made from the layout's fields in the seed's words.
std::string layout_of(const YAML::Node& doc) {
  if (std::optional<std::string> summary = text_at(doc, "layout.summary")) return *summary;
  std::string text =
      "TP " + text_at(doc, "layout.tp").value_or("1") + ", PP " + text_at(doc, "layout.pp").value_or("1") +
      ", CP " + text_at(doc, "layout.cp").value_or("1") + ", DP " + text_at(doc, "layout.dp").value_or("1");
  if (text_at(doc, "layout.sequence_parallel") == "true") text += ", sequence parallel";
  if (std::optional<int64_t> max_tokens = int_at(doc, "layout.max_tokens_per_gpu"))
    text += "; max " + format_thousands(static_cast<double>(*max_tokens), 0) + " tokens per GPU";
  YAML::Node recompute = at(doc, "layout.recompute");
  if (recompute.IsMap())
    text += "; " + text_at(doc, "layout.recompute.granularity").value_or("full") + " recompute";
  else
    text += "; no recompute";
  YAML::Node offload = at(doc, "layout.offload");
  if (offload.IsMap())
    text += "; optimizer offload (fraction " +
            text_at(doc, "layout.offload.optimizer_fraction").value_or("1.0") + ")";
  else
    text += "; no offload";
  return text;
}

const char* kNotMeasured = "not measured";
const char* kNotChecked = "not checked";

std::string window_words(const YAML::Node& doc) {
  YAML::Node window = at(doc, "result.window");
  if (window.IsSequence() && window.size() == 2 && window[0].IsScalar() && window[1].IsScalar())
    return "steps " + window[0].Scalar() + " to " + window[1].Scalar();
  return "steps 5 to 19";
}

std::vector<Row> rows_of(const YAML::Node& doc) {
  std::vector<Row> rows;
  if (std::optional<std::string> name = text_at(doc, "author.name")) {
    std::vector<Span> author = plain(*name);
    if (std::optional<std::string> url = text_at(doc, "author.url")) {
      author.push_back({" (", ""});
      author.push_back({"cite", *url});
      author.push_back({")", ""});
    }
    rows.push_back({"Author", author});
  } else {
    rows.push_back({"Author", plain("not given")});
  }
  rows.push_back({"GPUs", plain(gpus_of(doc))});
  rows.push_back({"Layout", plain(layout_of(doc))});
  // bf16, the default (and the seed's), goes without a row: the page names any other.
  if (std::optional<std::string> precision = text_at(doc, "workload.precision");
      precision && *precision != "bf16") {
    std::string words = *precision;
    if (*precision == "fp8")
      words += " (the decoder blocks' linear layers in FP8, " +
               text_at(doc, "workload.fp8.scaling").value_or("tensor") + " scaling, " +
               text_at(doc, "workload.fp8.gradients").value_or("e5m2") + " gradients)";
    rows.push_back({"Precision", plain(words)});
  }

  std::optional<double> tps = number_at(doc, "result.tokens_per_s_per_gpu");
  rows.push_back({"Tokens/s per GPU", tps ? figure(format_thousands(*tps, 2), "") : plain(kNotMeasured)});
  std::optional<double> usd = number_at(doc, "result.usd_per_million_tokens");
  rows.push_back({"$ / 1M tokens", usd ? figure("$" + fixed(*usd, 2), "") : plain(kNotMeasured)});
  std::optional<double> mfu = number_at(doc, "result.mfu");
  if (mfu) {
    std::string rest;
    if (std::optional<int64_t> n = int_at(doc, "result.active_params.count"))
      rest += " (N = " + format_thousands(static_cast<double>(*n), 0) + " active parameters per token)";
    if (std::optional<std::string> note = text_at(doc, "result.mfu_note")) rest += "; " + *note;
    rows.push_back({"MFU", figure(fixed(100.0 * *mfu, 1) + "%", rest)});
  } else {
    rows.push_back({"MFU", plain(kNotMeasured)});
  }
  std::optional<double> cv = number_at(doc, "result.step_time_cv_percent");
  rows.push_back(
      {"Step-time CV",
       cv ? figure(fixed(*cv, 2) + "%", " (population standard deviation / mean, " + window_words(doc) + ")")
          : plain(kNotMeasured)});

  YAML::Node convergence = at(doc, "correctness.convergence");
  if (convergence.IsMap()) {
    rows.push_back({"Convergence check",
                    plain("correlation " + text_at(doc, "correctness.convergence.correlation").value_or("?") +
                          ", final loss difference " +
                          text_at(doc, "correctness.convergence.final_loss_difference").value_or("?") + ", " +
                          text_at(doc, "correctness.convergence.pointwise_failures").value_or("?") +
                          " pointwise failures over " +
                          text_at(doc, "correctness.convergence.steps").value_or("?") + " steps")});
  } else {
    rows.push_back({"Convergence check", plain(kNotChecked)});
  }
  YAML::Node tests = at(doc, "correctness.component_tests");
  if (tests.IsSequence() && tests.size() > 0) {
    for (const auto& test : tests) {
      auto field = [&](const char* key) {
        const YAML::Node value = test[key];
        return value.IsDefined() && value.IsScalar() ? value.Scalar() : std::string();
      };
      // The seed's page joins detail and note with a space.
      std::string text = field("test") + ": " + field("gpu") + ", " + field("date") +
                         ". Shape: " + field("shape") + ". " + field("detail");
      if (!field("note").empty()) text += " " + field("note");
      rows.push_back({"Component test", plain(text)});
    }
  } else {
    rows.push_back({"Component test", plain(kNotChecked)});
  }
  rows.push_back({"Measured", plain(text_at(doc, "result.measured").value_or(kNotMeasured))});
  rows.push_back({"GPU-hours", plain(text_at(doc, "result.gpu_hours").value_or(kNotMeasured))});
  if (std::optional<std::string> build = text_at(doc, "workload.dataset.build.name")) {
    std::string text = *build;
    if (std::optional<std::string> sha = text_at(doc, "workload.dataset.rows_sha256"))
      text += " (rows_sha256 " + *sha + ")";
    rows.push_back({"Rows", plain(text)});
  } else if (std::optional<std::string> path = text_at(doc, "train.data.path")) {
    rows.push_back({"Rows", plain(*path)});
  } else {
    rows.push_back({"Rows", plain("not given")});
  }
  return rows;
}

std::optional<std::pair<int64_t, int64_t>> window_band(const YAML::Node& doc) {
  YAML::Node window = at(doc, "result.window");
  if (window.IsSequence() && window.size() == 2) {
    std::optional<int64_t> first = yaml_int(window[0]), last = yaml_int(window[1]);
    if (first && last) return std::make_pair(*first, *last);
  }
  return std::make_pair(int64_t{5}, int64_t{19});
}

std::vector<std::string> charts_of(const YAML::Node& doc, const RunSeries& run) {
  ChartSpec loss{"Loss per step", "loss", std::nullopt};
  if (!run.eval_steps.empty()) {
    loss.title = "Training and eval loss per step";
    loss.second_x = run.eval_steps;
    loss.second_y = run.eval_loss;
    loss.first_name = "train loss";
    loss.second_name = "eval loss (held-out rows)";
  }
  return {svg_line_chart(run.steps, run.loss, loss),
          svg_line_chart(run.steps, run.step_time_s, {"Step time per step", "seconds", window_band(doc)})};
}

std::string chart_caption(const YAML::Node& doc, const RunSeries& run) {
  return "From " + run.source + "/metrics.jsonl, " + std::to_string(run.steps.size()) +
         " steps; shaded: the measurement window (" + window_words(doc) + ").";
}

std::string render_markdown(const YAML::Node& doc, const std::string& source_text, const RunSeries* run) {
  std::string out = "# " + title_of(doc) + "\n\n| | |\n|---|---|\n";
  for (const Row& row : rows_of(doc)) {
    std::string value;
    for (const Span& span : row.value)
      value += span.href.empty() ? span.text : "[" + span.text + "](" + span.href + ")";
    out += "| **" + row.label + "** | " + md_cell(value) + " |\n";
  }
  if (run) {
    // Raw HTML blocks: CommonMark renderers show inline SVG (GitHub's sanitizer drops it;
    // the HTML page is the one to share there).
    out += "\n## Run\n\n";
    for (const std::string& chart : charts_of(doc, *run)) out += chart + "\n\n";
    out += chart_caption(doc, *run) + "\n";
  }
  if (std::optional<std::string> command = text_at(doc, "run"))
    out += "\n## Command\n\n" + md_fence(*command, "sh");
  out += "\n## Recipe\n\n" + md_fence(source_text, "yaml");
  return out;
}

const char* kStyle = R"css(
  :root { color-scheme: light; }
  body { margin: 0; background: #f6f8fa; color: #1f2328;
         font: 15px/1.5 -apple-system, "Segoe UI", "Liberation Sans", Helvetica, Arial, sans-serif; }
  main { max-width: 960px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
  h1 { font-size: 28px; margin: 8px 0 20px; }
  h2 { font-size: 19px; margin: 32px 0 12px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
  dl.facts { display: grid; grid-template-columns: 180px 1fr; margin: 0; border-top: 1px solid #d0d7de; }
  dl.facts dt, dl.facts dd { margin: 0; padding: 8px 10px; border-bottom: 1px solid #d0d7de; }
  dl.facts dt { font-weight: 600; color: #57606a; }
  dl.facts .figure { font-size: 20px; font-weight: 600; font-variant-numeric: tabular-nums; }
  pre { background: #f6f8fa; border: 1px solid #d0d7de; border-radius: 6px; padding: 12px;
        overflow-x: auto; font: 12px/1.45 "Liberation Mono", Menlo, Consolas, monospace; }
  figure { margin: 16px 0; }
  figure svg { width: 100%; height: auto; }
  figcaption { color: #57606a; font-size: 13px; }
  a { color: #0969da; }
)css";

std::string render_html(const YAML::Node& doc, const std::string& source_text, const RunSeries* run) {
  const std::string title = html_escape(title_of(doc));
  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" "
      "content=\"width=device-width, initial-scale=1\">\n<title>" +
      title + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n<main>\n<h1>" + title +
      "</h1>\n<dl class=\"facts\">\n";
  for (const Row& row : rows_of(doc)) {
    out += "<dt>" + html_escape(row.label) + "</dt><dd>";
    for (const Span& span : row.value) {
      if (!span.href.empty())
        out += "<a href=\"" + html_escape(span.href) + "\">" + html_escape(span.text) + "</a>";
      else if (span.figure)
        out += "<span class=\"figure\">" + html_escape(span.text) + "</span>";
      else
        out += html_escape(span.text);
    }
    out += "</dd>\n";
  }
  out += "</dl>\n";
  if (run) {
    out += "<h2>Run</h2>\n";
    for (const std::string& chart : charts_of(doc, *run)) out += "<figure>\n" + chart + "\n</figure>\n";
    out += "<p><small>" + html_escape(chart_caption(doc, *run)) + "</small></p>\n";
  }
  if (std::optional<std::string> command = text_at(doc, "run"))
    out += "<h2>Command</h2>\n<pre><code>" + html_escape(*command) + "</code></pre>\n";
  out += "<h2>Recipe</h2>\n<pre><code>" + html_escape(source_text) +
         "</code></pre>\n</main>\n</body>\n</html>\n";
  return out;
}

// Tick spacing of 1, 2 or 5 · 10^k giving about `count` ticks over span.
double nice_step(double span, int count) {
  const double raw = span / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * magnitude) return m * magnitude;
  return 10.0 * magnitude;
}

std::string tick_label(double value, double step) {
  // Enough decimals to tell neighbouring ticks apart.
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  return fixed(std::fabs(value) < step * 1e-6 ? 0.0 : value, decimals);
}

}  // namespace

std::string format_thousands(double value, int decimals) {
  std::string text = fixed(std::fabs(value), decimals);
  const size_t point = text.find('.');
  std::string whole = text.substr(0, point);
  const std::string fraction = point == std::string::npos ? "" : text.substr(point);
  for (int i = static_cast<int>(whole.size()) - 3; i > 0; i -= 3) whole.insert(static_cast<size_t>(i), ",");
  return (value < 0 && std::stod(text) != 0 ? "-" : "") + whole + fraction;
}

std::string svg_line_chart(const std::vector<int64_t>& x, const std::vector<double>& y,
                           const ChartSpec& spec) {
  LOOM_ASSERT(x.size() == y.size(), "svg_line_chart: x and y differ in length");
  LOOM_ASSERT(spec.second_x.size() == spec.second_y.size(),
              "svg_line_chart: second x and y differ in length");
  constexpr double width = 720, height = 260, left = 64, right = 20, top = 34, bottom = 42;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  std::vector<size_t> points, second_points;
  for (size_t i = 0; i < x.size(); ++i)
    if (std::isfinite(y[i])) points.push_back(i);
  for (size_t i = 0; i < spec.second_x.size(); ++i)
    if (std::isfinite(spec.second_y[i])) second_points.push_back(i);

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 " << width << " " << height << "\" width=\""
      << width << "\" height=\"" << height << "\" role=\"img\" aria-label=\"" << html_escape(spec.title)
      << "\" font-family=\"Liberation Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"" << width << "\" height=\"" << height << "\" fill=\"#ffffff\"/>\n";
  svg << "<text x=\"" << left << "\" y=\"20\" font-size=\"14\" font-weight=\"600\" fill=\"#1f2328\">"
      << html_escape(spec.title) << "</text>\n";

  double x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  if (!points.empty()) {
    x_min = static_cast<double>(x[points.front()]);
    x_max = x_min;
    y_min = y[points.front()];
    y_max = y_min;
    for (size_t i : points) {
      x_min = std::min(x_min, static_cast<double>(x[i]));
      x_max = std::max(x_max, static_cast<double>(x[i]));
      y_min = std::min(y_min, y[i]);
      y_max = std::max(y_max, y[i]);
    }
    for (size_t i : second_points) {
      x_min = std::min(x_min, static_cast<double>(spec.second_x[i]));
      x_max = std::max(x_max, static_cast<double>(spec.second_x[i]));
      y_min = std::min(y_min, spec.second_y[i]);
      y_max = std::max(y_max, spec.second_y[i]);
    }
  }
  if (x_max == x_min) {
    x_min -= 1;
    x_max += 1;
  }
  if (y_max == y_min) {
    const double pad = y_min == 0 ? 1 : std::fabs(y_min) * 0.1;
    y_min -= pad;
    y_max += pad;
  }
  const double y_step = nice_step(y_max - y_min, 5);
  y_min = std::floor(y_min / y_step) * y_step;
  y_max = std::ceil(y_max / y_step) * y_step;
  const double x_step = std::max(1.0, nice_step(x_max - x_min, 8));
  auto px = [&](double v) { return left + (v - x_min) / (x_max - x_min) * plot_w; };
  auto py = [&](double v) { return top + (y_max - v) / (y_max - y_min) * plot_h; };

  if (spec.band && !points.empty()) {
    const double b0 = std::max(x_min, static_cast<double>(spec.band->first) - 0.5);
    const double b1 = std::min(x_max, static_cast<double>(spec.band->second) + 0.5);
    if (b1 > b0)
      svg << "<rect x=\"" << px(b0) << "\" y=\"" << top << "\" width=\"" << px(b1) - px(b0) << "\" height=\""
          << plot_h << "\" fill=\"#f2cc60\" fill-opacity=\"0.25\"/>\n";
  }
  for (double v = y_min; v <= y_max + y_step * 1e-6; v += y_step) {
    svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << py(v) << "\" y2=\"" << py(v)
        << "\" stroke=\"#d8dee4\" stroke-width=\"1\"/>\n";
    svg << "<text x=\"" << left - 8 << "\" y=\"" << py(v) + 4 << "\" text-anchor=\"end\" fill=\"#57606a\">"
        << tick_label(v, y_step) << "</text>\n";
  }
  for (double v = std::ceil(x_min / x_step) * x_step; v <= x_max + 1e-9; v += x_step) {
    svg << "<line x1=\"" << px(v) << "\" x2=\"" << px(v) << "\" y1=\"" << top + plot_h << "\" y2=\""
        << top + plot_h + 5 << "\" stroke=\"#57606a\"/>\n";
    svg << "<text x=\"" << px(v) << "\" y=\"" << top + plot_h + 18
        << "\" text-anchor=\"middle\" fill=\"#57606a\">" << tick_label(v, x_step) << "</text>\n";
  }
  svg << "<line x1=\"" << left << "\" x2=\"" << left + plot_w << "\" y1=\"" << top + plot_h << "\" y2=\""
      << top + plot_h << "\" stroke=\"#57606a\"/>\n";
  svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << height - 6
      << "\" text-anchor=\"middle\" fill=\"#1f2328\">step</text>\n";
  svg << "<text transform=\"translate(16 " << top + plot_h / 2 << ") rotate(-90)\" text-anchor=\"middle\" "
      << "fill=\"#1f2328\">" << html_escape(spec.y_label) << "</text>\n";

  if (points.empty()) {
    svg << "<text x=\"" << left + plot_w / 2 << "\" y=\"" << top + plot_h / 2
        << "\" text-anchor=\"middle\" fill=\"#57606a\">no data</text>\n";
  } else {
    // A gap (NaN) breaks the line into pieces.
    svg << "<path fill=\"none\" stroke=\"#0969da\" stroke-width=\"2\" stroke-linejoin=\"round\" d=\"";
    for (size_t k = 0; k < points.size(); ++k) {
      const size_t i = points[k];
      const bool joined = k > 0 && points[k - 1] + 1 == i;
      svg << (joined ? " L" : (k ? " M" : "M")) << px(static_cast<double>(x[i])) << " " << py(y[i]);
    }
    svg << "\"/>\n";
    if (points.size() <= 200) {
      for (size_t i : points)
        svg << "<circle cx=\"" << px(static_cast<double>(x[i])) << "\" cy=\"" << py(y[i])
            << "\" r=\"2.5\" fill=\"#0969da\"><title>step " << x[i] << ": " << y[i] << "</title></circle>\n";
    }
  }
  if (!second_points.empty()) {
    // The second series: its points joined in order (evaluations are sparse, no gaps).
    svg << "<path fill=\"none\" stroke=\"#bc4c00\" stroke-width=\"2\" stroke-dasharray=\"6 3\" d=\"";
    for (size_t k = 0; k < second_points.size(); ++k) {
      const size_t i = second_points[k];
      svg << (k ? " L" : "M") << px(static_cast<double>(spec.second_x[i])) << " " << py(spec.second_y[i]);
    }
    svg << "\"/>\n";
    for (size_t i : second_points)
      svg << "<circle cx=\"" << px(static_cast<double>(spec.second_x[i])) << "\" cy=\""
          << py(spec.second_y[i]) << "\" r=\"3\" fill=\"#bc4c00\"><title>step " << spec.second_x[i] << ": "
          << spec.second_y[i] << "</title></circle>\n";
  }
  if (!spec.second_x.empty()) {
    const double lx = left + plot_w - 210;
    svg << "<line x1=\"" << lx << "\" x2=\"" << lx + 18 << "\" y1=\"16\" y2=\"16\" stroke=\"#0969da\" "
        << "stroke-width=\"2\"/>\n<text x=\"" << lx + 22 << "\" y=\"20\" fill=\"#1f2328\">"
        << html_escape(spec.first_name) << "</text>\n";
    svg << "<line x1=\"" << lx << "\" x2=\"" << lx + 18 << "\" y1=\"30\" y2=\"30\" stroke=\"#bc4c00\" "
        << "stroke-width=\"2\" stroke-dasharray=\"6 3\"/>\n<text x=\"" << lx + 22 << "\" y=\"34\" "
        << "fill=\"#1f2328\">" << html_escape(spec.second_name) << "</text>\n";
  }
  svg << "</svg>";
  return svg.str();
}

std::string recipe_render(const YAML::Node& document, const std::string& source_text, RenderFormat format,
                          const RunSeries* run) {
  LOOM_ASSERT(document.IsMap(), "recipe_render needs a recipe document (a map)");
  return format == RenderFormat::html ? render_html(document, source_text, run)
                                      : render_markdown(document, source_text, run);
}

}  // namespace loom
