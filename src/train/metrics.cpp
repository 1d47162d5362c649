#include "train/metrics.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/json_strict.h"
#include "core/version.h"
#include "recipe/render.h"

namespace loom {

double mfu_from_throughput(int64_t matmul_params, double tokens_per_s_per_gpu) {
  return 6.0 * static_cast<double>(matmul_params) * tokens_per_s_per_gpu / kPeakFlopsPerGpu;
}

std::string metrics_to_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"grad_norm", m.grad_norm},
                      {"lr", m.lr},
                      {"tokens", m.tokens},
                      {"step_time_s", m.step_time_s},
                      {"tokens_per_s_per_gpu", m.tokens_per_s_per_gpu},
                      {"mfu", m.mfu},
                      {"max_mem_gib", m.max_mem_gib}};
  if (m.skipped) j["skipped"] = true;
  if (m.no_targets) j["no_targets"] = true;
  if (m.aux_loss) j["aux_loss"] = *m.aux_loss;
  if (!m.experts.empty()) {
    nlohmann::json layers = nlohmann::json::array();
    for (const StepMetrics::LayerLoad& e : m.experts)
      layers.push_back({{"layer", e.layer}, {"min", e.load.min}, {"max", e.load.max}, {"cv", e.load.cv}});
    j["experts"] = layers;
  }
  return j.dump();
}

namespace {

// Calls record(j, where) with the JSON object of each non-empty line of a metrics.jsonl,
// `where` its "path:line" for errors: the step and eval readers share the file.
template <typename Record>
void for_each_metrics_line(const std::string& path, Record record) {
  std::ifstream in(path);
  if (!in) throw_input_error(path, "cannot open metrics file");
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    const std::string where = path + ":" + std::to_string(number);
    record(json_object_line(line, where), where);
  }
}

}  // namespace

std::vector<StepMetrics> metrics_read_jsonl(const std::string& path) {
  std::vector<StepMetrics> out;
  for_each_metrics_line(path, [&](const nlohmann::json& j, const std::string& where) {
    if (j.contains("eval_loss")) return;
    StepMetrics m;
    auto number_field = [&](const char* key, double* value) {
      if (!j.contains(key)) return;
      if (j.at(key).is_null()) {
        *value = NAN;
        return;
      }
      if (!j.at(key).is_number())
        throw_input_error(where, std::string("field '") + key + "' is not a number");
      *value = j.at(key).get<double>();
    };
    auto flag_field = [&](const char* key, bool* value) {
      if (!j.contains(key)) return;
      if (!j.at(key).is_boolean())
        throw_input_error(where, std::string("field '") + key + "' is not true or false");
      *value = j.at(key).get<bool>();
    };
    if (!j.contains("step") || !j.at("step").is_number_integer())
      throw_input_error(where, "field 'step' missing or not an integer");
    m.step = j.at("step").get<int64_t>();
    number_field("loss", &m.loss);
    number_field("grad_norm", &m.grad_norm);
    number_field("lr", &m.lr);
    double tokens = 0;
    number_field("tokens", &tokens);
    m.tokens = static_cast<int64_t>(tokens);
    number_field("step_time_s", &m.step_time_s);
    number_field("tokens_per_s_per_gpu", &m.tokens_per_s_per_gpu);
    number_field("mfu", &m.mfu);
    number_field("max_mem_gib", &m.max_mem_gib);
    if (j.contains("aux_loss")) {
      double aux = 0;
      number_field("aux_loss", &aux);
      m.aux_loss = aux;
    }
    flag_field("skipped", &m.skipped);
    flag_field("no_targets", &m.no_targets);
    out.push_back(m);
  });
  return out;
}

std::string eval_metrics_to_json(const EvalMetrics& m) {
  const nlohmann::json j = {{"step", m.step}, {"eval_loss", m.eval_loss}, {"eval_tokens", m.eval_tokens}};
  return j.dump();
}

std::vector<EvalMetrics> eval_metrics_read_jsonl(const std::string& path) {
  std::vector<EvalMetrics> out;
  for_each_metrics_line(path, [&](const nlohmann::json& j, const std::string& where) {
    if (!j.contains("eval_loss")) return;
    if (!j.contains("step") || !j.at("step").is_number_integer() || !j.contains("eval_tokens") ||
        !j.at("eval_tokens").is_number_integer() ||
        !(j.at("eval_loss").is_number() || j.at("eval_loss").is_null()))
      throw_input_error(where,
                        "an eval record needs integer 'step' and 'eval_tokens' and a number 'eval_loss'");
    EvalMetrics m;
    m.step = j.at("step").get<int64_t>();
    m.eval_loss = j.at("eval_loss").is_null() ? NAN : j.at("eval_loss").get<double>();
    m.eval_tokens = j.at("eval_tokens").get<int64_t>();
    out.push_back(m);
  });
  return out;
}

std::string eval_progress_line(const EvalMetrics& m) {
  char loss[64] = "none (no targets in the eval rows)";
  if (m.eval_tokens > 0) std::snprintf(loss, sizeof(loss), "%.4f", m.eval_loss);
  char text[200];
  std::snprintf(text, sizeof(text), "eval at step %lld | eval loss %s | %s tokens | %.1f s",
                static_cast<long long>(m.step), loss,
                format_thousands(static_cast<double>(m.eval_tokens), 0).c_str(), m.eval_time_s);
  return text;
}

void eval_metrics_to_tensorboard(const EvalMetrics& m, TensorBoardWriter& writer) {
  if (m.eval_tokens == 0) return;  // no loss to plot
  writer.add_scalar("eval loss", m.step, m.eval_loss);
  writer.flush();
}

std::string fp8_stats_to_json(int64_t step, const Fp8Stats& stats) {
  nlohmann::ordered_json j = {{"step", step}};
  for (int k = 0; k < Fp8Stats::kKinds; ++k) {
    const Fp8TensorStats& t = stats.kinds[static_cast<size_t>(k)];
    if (t.values == 0) continue;  // no FP8 cast of this kind on any rank (bf16 layers)
    j[Fp8Stats::kind_name(k)] = {
        {"amax", t.amax}, {"values", t.values}, {"flushed", t.flushed}, {"clamped", t.clamped}};
  }
  return j.dump();
}

namespace {

double flushed_percent(const Fp8TensorStats& t) {
  return t.values > 0 ? 100.0 * static_cast<double>(t.flushed) / static_cast<double>(t.values) : 0.0;
}

}  // namespace

std::string fp8_stats_progress_line(int64_t step, const Fp8Stats& stats) {
  int most_flushed = 0, largest = 0;
  int64_t clamped = 0;
  for (int k = 0; k < Fp8Stats::kKinds; ++k) {
    const Fp8TensorStats& t = stats.kinds[static_cast<size_t>(k)];
    clamped += t.clamped;
    if (flushed_percent(t) > flushed_percent(stats.kinds[static_cast<size_t>(most_flushed)]))
      most_flushed = k;
    if (t.amax > stats.kinds[static_cast<size_t>(largest)].amax) largest = k;
  }
  char text[240];
  std::snprintf(text, sizeof(text),
                "fp8 at step %lld | most flushed: %s %.3g%% | clamped: %s | largest amax: %s %.3g",
                static_cast<long long>(step), Fp8Stats::kind_name(most_flushed).c_str(),
                flushed_percent(stats.kinds[static_cast<size_t>(most_flushed)]),
                clamped == 0 ? "none" : format_thousands(static_cast<double>(clamped), 0).c_str(),
                Fp8Stats::kind_name(largest).c_str(),
                static_cast<double>(stats.kinds[static_cast<size_t>(largest)].amax));
  return text;
}

void fp8_stats_to_tensorboard(int64_t step, const Fp8Stats& stats, TensorBoardWriter& writer) {
  for (int k = 0; k < Fp8Stats::kKinds; ++k) {
    const Fp8TensorStats& t = stats.kinds[static_cast<size_t>(k)];
    if (t.values == 0) continue;
    writer.add_scalar("fp8 amax/" + Fp8Stats::kind_name(k), step, t.amax);
    writer.add_scalar("fp8 flushed %/" + Fp8Stats::kind_name(k), step, flushed_percent(t));
  }
  writer.flush();
}

namespace {

std::string duration(double seconds) {
  int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  else if (s >= 60)
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  return text;
}

}  // namespace

std::string progress_line(const StepMetrics& m, int64_t total_steps, double eta_s) {
  char text[256], loss[32];
  if (m.no_targets)
    std::snprintf(loss, sizeof(loss), "none (no targets)");
  else
    std::snprintf(loss, sizeof(loss), "%.4f", m.loss);
  std::snprintf(
      text, sizeof(text),
      "step %lld/%lld | loss %s | grad norm %.3f | lr %.2e | %s tok/s/GPU | MFU %.1f%% | %.2f GiB | ",
      static_cast<long long>(m.step), static_cast<long long>(total_steps), loss, m.grad_norm, m.lr,
      format_thousands(m.tokens_per_s_per_gpu, 0).c_str(), 100.0 * m.mfu, m.max_mem_gib);
  std::string line = text;
  if (m.aux_loss) {
    std::snprintf(text, sizeof(text), "aux %.4f | ", *m.aux_loss);
    line += text;
  }
  if (!m.experts.empty()) {
    const auto worst = std::max_element(m.experts.begin(), m.experts.end(),
                                        [](const auto& a, const auto& b) { return a.load.cv < b.load.cv; });
    std::snprintf(text, sizeof(text), "experts cv %.2f (layer %lld) | ", worst->load.cv,
                  static_cast<long long>(worst->layer));
    line += text;
  }
  return line + "ETA " + duration(eta_s);
}

namespace {

int terminal_columns(std::FILE* out) {
  winsize size{};
  if (ioctl(fileno(out), TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

}  // namespace

ProgressPrinter::ProgressPrinter(std::FILE* out, int64_t total_steps)
    : ProgressPrinter(out, total_steps, isatty(fileno(out)) != 0, 0) {
  if (tty_) columns_ = terminal_columns(out);
}

ProgressPrinter::ProgressPrinter(std::FILE* out, int64_t total_steps, bool tty, int columns)
    : out_(out), total_steps_(total_steps), tty_(tty), columns_(columns) {}

void ProgressPrinter::step(const StepMetrics& m, double eta_s) {
  std::string line = progress_line(m, total_steps_, eta_s);
  if (!tty_) {
    std::fprintf(out_, "%s\n", line.c_str());
  } else {
    // One column short of the width: a line that fills it exactly wraps on some terminals,
    // and "\r" then returns to the wrapped part only.
    if (columns_ > 1 && line.size() >= static_cast<size_t>(columns_))
      line.resize(static_cast<size_t>(columns_ - 1));
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());
    pending_ = true;
  }
  std::fflush(out_);
}

void ProgressPrinter::line(const std::string& text) {
  finish();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (!pending_) return;
  std::fprintf(out_, "\n");
  std::fflush(out_);
  pending_ = false;
}

void metrics_to_tensorboard(const StepMetrics& m, TensorBoardWriter& writer) {
  writer.add_scalar("lm loss", m.step, m.loss);
  writer.add_scalar("lr", m.step, m.lr);
  writer.add_scalar("grad norm", m.step, m.grad_norm);
  writer.add_scalar("throughput", m.step, m.tokens_per_s_per_gpu);
  writer.add_scalar("mfu", m.step, m.mfu);
  writer.add_scalar("step time", m.step, m.step_time_s);
  writer.add_scalar("memory", m.step, m.max_mem_gib);
  if (m.aux_loss) writer.add_scalar("aux loss", m.step, *m.aux_loss);
  for (const StepMetrics::LayerLoad& e : m.experts) {
    writer.add_scalar("experts cv/layer " + std::to_string(e.layer), m.step, e.load.cv);
    writer.add_scalar("experts max/layer " + std::to_string(e.layer), m.step, e.load.max);
  }
  writer.flush();
}

WindowResult window_measure(const std::vector<StepMetrics>& steps, int64_t first, int64_t last, int64_t gpus,
                            int64_t matmul_params) {
  if (first < 1 || last < first)
    throw_input_error("result.window", "[" + std::to_string(first) + ", " + std::to_string(last) +
                                           "] is not a range of steps from 1");
  WindowResult w;
  w.first = first;
  w.last = last;
  std::vector<double> times;
  for (const StepMetrics& m : steps) {
    if (m.step < first || m.step > last) continue;
    times.push_back(m.step_time_s);
    w.window_tokens += m.tokens;
  }
  if (static_cast<int64_t>(times.size()) != last - first + 1)
    throw_input_error("result.window", "steps [" + std::to_string(first) + ", " + std::to_string(last) +
                                           "] are not all in the run (" + std::to_string(steps.size()) +
                                           " steps)");
  double total = 0;
  for (double t : times) total += t;
  w.step_time_mean_s = total / static_cast<double>(times.size());
  double var = 0;
  for (double t : times) var += (t - w.step_time_mean_s) * (t - w.step_time_mean_s);
  var /= static_cast<double>(times.size());
  w.step_time_cv = w.step_time_mean_s > 0 ? std::sqrt(var) / w.step_time_mean_s : 0;
  w.tokens_per_s_per_gpu =
      total > 0 ? static_cast<double>(w.window_tokens) / total / static_cast<double>(gpus) : 0;
  w.mfu = mfu_from_throughput(matmul_params, w.tokens_per_s_per_gpu);
  return w;
}

double process_elapsed_s() {
  static const auto first_call = std::chrono::steady_clock::now();
  auto fallback = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - first_call).count();
  };
  std::ifstream stat_in("/proc/self/stat"), uptime_in("/proc/uptime");
  std::string stat;
  double uptime = 0;
  if (!std::getline(stat_in, stat) || !(uptime_in >> uptime)) return fallback();
  // Field 22 is the start time in clock ticks after boot; the command name (field 2) is in
  // parentheses and may hold spaces, so count fields from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return fallback();
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(fields >> field)) return fallback();
  const long ticks = sysconf(_SC_CLK_TCK);
  if (ticks <= 0) return fallback();
  return std::max(0.0, uptime - std::stod(field) / static_cast<double>(ticks));
}

double gpu_hours_from(int64_t gpus, double seconds) {
  return static_cast<double>(gpus) * seconds / 3600.0;
}

namespace {

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[16];
  std::strftime(text, sizeof(text), "%Y-%m-%d", &utc);
  return text;
}

// A number rounded to `decimals` places as a plain YAML scalar, shortest form with a
// decimal point kept (1.0, 0.45, 2200.16), so result.yaml reads as written.
YAML::Node rounded(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  char text[64];
  std::snprintf(text, sizeof(text), "%.15g", std::round(value * scale) / scale);
  std::string out = text;
  if (out.find_first_of(".e") == std::string::npos) out += ".0";
  return YAML::Node(out);
}

// GPU-hours: two decimals, or three significant digits below 0.01 (a short test run).
YAML::Node gpu_hours_node(double hours) {
  if (hours >= 0.01 || hours <= 0) return rounded(hours, 2);
  const int decimals = 2 - static_cast<int>(std::floor(std::log10(hours)));
  return rounded(hours, decimals);
}

}  // namespace

YAML::Node result_document(const YAML::Node& recipe_document, const RunResult& run) {
  LOOM_ASSERT(recipe_document.IsMap(), "result_document needs a recipe document (a map)");
  YAML::Node doc = YAML::Clone(recipe_document);
  const YAML::Node old = doc["result"].IsMap() ? YAML::Node(doc["result"]) : YAML::Node(YAML::NodeType::Map);
  const WindowResult& w = run.window;

  // Rebuilt in the seed's order; fields of the old block that a run does not measure follow.
  YAML::Node result(YAML::NodeType::Map);
  result["tokens_per_s_per_gpu"] = rounded(w.tokens_per_s_per_gpu, 2);
  if (run.price)
    result["usd_per_million_tokens"] =
        rounded(usd_per_million_tokens(run.price->usd_per_gpu_hour, w.tokens_per_s_per_gpu), 2);
  result["step_time_cv_percent"] = rounded(100.0 * w.step_time_cv, 2);
  result["mfu"] = rounded(w.mfu, 4);
  result["mfu_note"] = run.mfu_note.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Node(run.mfu_note);
  YAML::Node params(YAML::NodeType::Map);
  params["count"] = run.active_params;
  const YAML::Node old_params = old["active_params"];
  // A key missing from a const node gives an invalid node: IsDefined() is the only safe query.
  const bool same_count = old_params.IsDefined() && old_params.IsMap() && old_params["count"].IsDefined() &&
                          old_params["count"].IsScalar() &&
                          old_params["count"].Scalar() == std::to_string(run.active_params);
  if (same_count && old_params["source"].IsDefined()) {
    params["source"] = YAML::Clone(old_params["source"]);
    if (old_params["revision"].IsDefined()) params["revision"] = YAML::Clone(old_params["revision"]);
  } else {
    params["source"] = run.active_params_source;
  }
  result["active_params"] = params;
  result["measured"] = run.measured.empty() ? today_utc() : run.measured;
  result["steps_per_run"] = run.steps_run;
  YAML::Node window(YAML::NodeType::Sequence);
  window.push_back(w.first);
  window.push_back(w.last);
  result["window"] = window;
  result["window_tokens"] = w.window_tokens;
  result["runs"] = 1;
  result["profiler"] = run.profiler;
  result["gpu_hours"] = gpu_hours_node(run.gpu_hours);
  result["gpu_hours_note"] = "GPUs x (process launch to finish), including start-up and the final checkpoint";
  if (run.eval) {
    YAML::Node eval;
    eval["step"] = run.eval->step;
    if (run.eval->eval_tokens > 0)
      eval["eval_loss"] = run.eval->eval_loss;
    else
      eval["eval_loss"] = YAML::Null;  // no targets, no loss
    eval["eval_tokens"] = run.eval->eval_tokens;
    eval["eval_time_s"] = rounded(run.eval_time_s, 2);
    result["eval"] = eval;
  }
  result["loom"] = loom_version();
  if (!run.precision.empty()) result["precision"] = run.precision;
  // A cost left from the recipe without a price for this run would not be this run's.
  for (const auto& item : old) {
    const std::string key = item.first.Scalar();
    if (!result[key].IsDefined() && key != "usd_per_million_tokens") result[key] = YAML::Clone(item.second);
  }
  doc["result"] = result;
  return doc;
}

std::string result_summary_line(const RunResult& run) {
  const WindowResult& w = run.window;
  char text[512];
  std::snprintf(
      text, sizeof(text),
      "result over steps %lld-%lld: %s tokens/s/GPU, MFU %.1f%%, step-time CV %.2f%% (population std / "
      "mean)",
      static_cast<long long>(w.first), static_cast<long long>(w.last),
      format_thousands(w.tokens_per_s_per_gpu, 2).c_str(), 100.0 * w.mfu, 100.0 * w.step_time_cv);
  std::string line = text;
  if (run.price) {
    std::snprintf(text, sizeof(text), ", $%.2f / 1M tokens (%s)",
                  usd_per_million_tokens(run.price->usd_per_gpu_hour, w.tokens_per_s_per_gpu),
                  run.price->source.c_str());
    line += text;
  } else {
    line += ", $ / 1M tokens unknown (gpu.instance not in the price table; set gpu.usd_per_gpu_hour)";
  }
  std::snprintf(text, sizeof(text), ", %.3g GPU-hours", run.gpu_hours);
  return line + text;
}

}  // namespace loom
