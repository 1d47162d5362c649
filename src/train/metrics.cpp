#include "train/metrics.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

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
  return j.dump();
}

std::vector<StepMetrics> metrics_read_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_input_error(path, "cannot open metrics file");
  std::vector<StepMetrics> out;
  std::string line;
  int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    const std::string where = path + ":" + std::to_string(number);
    if (j.is_discarded() || !j.is_object()) throw_input_error(where, "not a JSON object");
    StepMetrics m;
    auto number_field = [&](const char* key, double* value) {
      if (!j.contains(key)) return;
      if (j.at(key).is_null()) {
        *value = NAN;
        return;
      }
      if (!j.at(key).is_number()) throw_input_error(where, std::string("field '") + key + "' is not a number");
      *value = j.at(key).get<double>();
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
    out.push_back(m);
  }
  return out;
}

namespace {

std::string with_thousands(double value) {
  std::string digits = std::to_string(static_cast<int64_t>(std::llround(value)));
  std::string out;
  int count = 0;
  for (auto it = digits.rbegin(); it != digits.rend(); ++it) {
    if (count && count % 3 == 0 && *it != '-') out.insert(out.begin(), ',');
    out.insert(out.begin(), *it);
    ++count;
  }
  return out;
}

std::string duration(double seconds) {
  int64_t s = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof(text), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  else if (s >= 60)
    std::snprintf(text, sizeof(text), "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  else
    std::snprintf(text, sizeof(text), "%llds", static_cast<long long>(s));
  return text;
}

}  // namespace

std::string progress_line(const StepMetrics& m, int64_t total_steps, double eta_s) {
  char text[256];
  std::snprintf(text, sizeof(text), "step %lld/%lld | loss %.4f | grad norm %.3f | lr %.2e | %s tok/s/GPU | MFU %.1f%% | %.2f GiB | ETA %s",
                static_cast<long long>(m.step), static_cast<long long>(total_steps), m.loss, m.grad_norm, m.lr,
                with_thousands(m.tokens_per_s_per_gpu).c_str(), 100.0 * m.mfu, m.max_mem_gib, duration(eta_s).c_str());
  return text;
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
                                           "] are not all in the run (" + std::to_string(steps.size()) + " steps)");
  double total = 0;
  for (double t : times) total += t;
  w.step_time_mean_s = total / static_cast<double>(times.size());
  double var = 0;
  for (double t : times) var += (t - w.step_time_mean_s) * (t - w.step_time_mean_s);
  var /= static_cast<double>(times.size());
  w.step_time_cv = w.step_time_mean_s > 0 ? std::sqrt(var) / w.step_time_mean_s : 0;
  w.tokens_per_s_per_gpu = total > 0 ? static_cast<double>(w.window_tokens) / total / static_cast<double>(gpus) : 0;
  w.mfu = mfu_from_throughput(matmul_params, w.tokens_per_s_per_gpu);
  return w;
}

}  // namespace loom
