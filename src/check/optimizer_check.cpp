#include "check/optimizer_check.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>

#include "core/dtype.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "core/parallel.h"

namespace loom {
namespace {

constexpr int64_t kGrain = 1 << 16;     // elements per thread at least
constexpr int64_t kSumBlock = 1 << 16;  // fixed blocks: sums do not depend on the thread count

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The stream of draws for one tensor at one step (step 0: the initial masters).
uint64_t stream_key(uint64_t seed, size_t tensor, int64_t step) {
  return splitmix64(splitmix64(splitmix64(seed) ^ tensor) ^ static_cast<uint64_t>(step));
}

// ≈ N(0, 1): four 16-bit uniforms summed (Irwin–Hall), centred, scaled to unit variance
// (each has variance ≈ 65536²/12); |z| ≤ 3.46. A few ns per draw where Box–Muller's log and
// cos would dominate the large shape's run time.
double approx_normal(uint64_t h) {
  const double sum =
      static_cast<double>((h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48));
  return (sum - 2.0 * 65535.0) / (65536.0 / std::sqrt(3.0));
}

// N(mean, std²) in fp32, all 32 bits in use (a run under way); every kTieEvery-th element an
// exact tie between two bf16 values with an even high half, where ties-away and nearest-even
// splits differ.
constexpr int64_t kTieEvery = 4096;

void fill_masters(const OptimizerTestTensor& tensor, uint64_t key, std::vector<float>& out) {
  parallel_for(static_cast<int64_t>(out.size()), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const double x =
          tensor.init_mean + tensor.init_std * approx_normal(splitmix64(key + static_cast<uint64_t>(i)));
      out[i] = static_cast<float>(x);
      if (i % kTieEvery == 0) {
        const uint32_t high = (std::bit_cast<uint32_t>(out[i]) >> 16) & ~1u;
        out[i] = std::bit_cast<float>((high << 16) | 0x8000u);
      }
    }
  });
}

void fill_grads(double grad_std, uint64_t key, std::vector<float>& out) {
  parallel_for(static_cast<int64_t>(out.size()), kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      out[i] = static_cast<float>(grad_std * approx_normal(splitmix64(key + static_cast<uint64_t>(i))));
  });
}

template <typename Term>
double blocked_sum(int64_t n, const Term& term) {
  const int64_t blocks = (n + kSumBlock - 1) / kSumBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double s = 0;
      for (int64_t i = b * kSumBlock; i < std::min(n, (b + 1) * kSumBlock); ++i) s += term(i);
      partial[b] = s;
    }
  });
  double total = 0;
  for (double s : partial) total += s;
  return total;
}

// AdamW in fp64, the formula of optim/adamw.h with double hyperparameters.
struct Fp64AdamW {
  std::vector<double> p, m, v;

  explicit Fp64AdamW(const std::vector<float>& master)
      : p(master.begin(), master.end()), m(master.size(), 0.0), v(master.size(), 0.0) {}

  void step(const OptimizerCheckOptions& o, double lr, int64_t t, bool decay,
            const std::vector<float>& grad) {
    const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    const double wd = decay ? o.weight_decay : 0.0;
    parallel_for(static_cast<int64_t>(p.size()), kGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const double g = grad[i];
        m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g;
        v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g * g;
        p[i] -= lr * ((m[i] / bc1) / (std::sqrt(v[i] / bc2) + o.eps) + wd * p[i]);
      }
    });
  }
};

// One run of one tensor: `steps` steps at `lr` from m0, the grads of step t the same in every
// run and arm.
struct TensorRun {
  const OptimizerCheckOptions& options;
  const OptimizerTestTensor& tensor;
  size_t index;
  AdamWConfig cfg;
  const std::vector<float>& m0;
  double lr;
  int steps;
  std::vector<double> reference;  // the fp64 masters after the last step

  int64_t n() const { return static_cast<int64_t>(m0.size()); }

  void grads(int64_t t, std::vector<float>& out) const {
    fill_grads(options.grad_std, stream_key(options.seed, index, t), out);
  }

  void run_reference() {
    Fp64AdamW adam(m0);
    std::vector<float> grad(m0.size());
    for (int t = 1; t <= steps; ++t) {
      grads(t, grad);
      adam.step(options, lr, t, tensor.decay, grad);
    }
    reference = std::move(adam.p);
  }

  // e = ‖a − r‖ / ‖r − m0‖: (a − m0) − (r − m0) in one rounding.
  double error(const std::vector<float>& a) const {
    const double diff = blocked_sum(n(), [&](int64_t i) {
      const double d = static_cast<double>(a[i]) - reference[i];
      return d * d;
    });
    const double update = blocked_sum(n(), [&](int64_t i) {
      const double d = reference[i] - static_cast<double>(m0[i]);
      return d * d;
    });
    return std::sqrt(diff) / std::sqrt(update);
  }
};

using Snapshots = std::vector<std::vector<float>>;  // masters after each step of a run

struct ArmRun {
  double error = 0;  // after the last step
  int64_t mismatches = 0;
};

// Runs one arm; compares its masters bitwise with `compare` when given and keeps them in
// `record` when given.
ArmRun run_arm(const OptimizerArmFactory& make, const TensorRun& run, const Snapshots* compare,
               Snapshots* record) {
  std::unique_ptr<OptimizerArm> arm = make();
  arm->init(run.m0.data(), run.n());
  std::vector<float> grad(run.m0.size()), master(run.m0.size());
  if (record) record->assign(static_cast<size_t>(run.steps), {});
  ArmRun out;
  for (int t = 1; t <= run.steps; ++t) {
    run.grads(t, grad);
    arm->step(run.cfg, static_cast<float>(run.lr), t, run.tensor.decay, grad.data());
    arm->read_master(master.data());
    if (compare) {
      const std::vector<float>& expected = (*compare)[static_cast<size_t>(t - 1)];
      out.mismatches += static_cast<int64_t>(blocked_sum(run.n(), [&](int64_t i) {
        return std::bit_cast<uint32_t>(master[i]) != std::bit_cast<uint32_t>(expected[i]) ? 1.0 : 0.0;
      }));
    }
    if (record) (*record)[static_cast<size_t>(t - 1)] = master;
  }
  out.error = run.error(master);
  return out;
}

// worse(a, b): a is the worse figure; NaN is the worst, so that it cannot hide.
bool worse(double a, double b) {
  return std::isnan(a) || (!std::isnan(b) && a > b);
}

// The figures of an arm over its tensors. bounds: the step-3 bound of each tensor (empty for
// the baseline, which is its own).
void judge(ArmOutcome& o, double step1_bound, const std::vector<double>& bounds) {
  o.step1_ok = true;
  o.step3_ok = true;
  double worst_ratio = 0;
  for (size_t k = 0; k < o.errors.size(); ++k) {
    const TensorErrors& e = o.errors[k];
    if (k == 0 || worse(e.step1, o.step1)) {
      o.step1 = e.step1;
      o.step1_tensor = e.tensor;
    }
    o.step1_ok = o.step1_ok && e.step1 <= step1_bound;
    const double bound = bounds.empty() ? 2.0 * e.step3 + 1e-3 : bounds[k];
    const double ratio = e.step3 / bound;
    if (k == 0 || worse(ratio, worst_ratio)) {
      worst_ratio = ratio;
      o.step3 = e.step3;
      o.step3_bound = bound;
      o.step3_tensor = e.tensor;
    }
    o.step3_ok = o.step3_ok && e.step3 <= bound;
  }
  o.bitwise_ok = o.master_mismatches == 0;
}

bool criterion_holds(const ArmOutcome& outcome, OptimizerCriterion criterion) {
  switch (criterion) {
    case OptimizerCriterion::step1_bound: return outcome.step1_ok;
    case OptimizerCriterion::step3_bound: return outcome.step3_ok;
    case OptimizerCriterion::bitwise_masters: return outcome.bitwise_ok;
  }
  return false;
}

std::string sci(double value) {
  if (std::isnan(value)) return "nan";
  char text[32];
  std::snprintf(text, sizeof(text), "%.3g", value);
  return text;
}

std::string with_commas(int64_t value) {
  std::string digits = std::to_string(value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string masters_text(const ArmOutcome& outcome) {
  return outcome.bitwise_ok ? "bitwise equal" : "differ at " + with_commas(outcome.master_mismatches);
}

nlohmann::ordered_json outcome_json(const ArmOutcome& o, bool with_masters) {
  auto number = [](double v) {
    return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
  };
  nlohmann::ordered_json j;
  j["name"] = o.name;
  if (!o.fault.empty()) j["fault"] = o.fault;
  j["step1_error"] = number(o.step1);
  j["step1_worst_tensor"] = o.step1_tensor;
  j["step3_error"] = number(o.step3);
  j["step3_bound"] = number(o.step3_bound);
  j["step3_tensor"] = o.step3_tensor;
  if (with_masters) j["master_mismatches"] = o.master_mismatches;
  j["step1_ok"] = o.step1_ok;
  j["step3_ok"] = o.step3_ok;
  if (with_masters) j["bitwise_ok"] = o.bitwise_ok;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const TensorErrors& e : o.errors)
    tensors.push_back(
        {{"tensor", e.tensor}, {"step1_error", number(e.step1)}, {"step3_error", number(e.step3)}});
  j["tensors"] = tensors;
  j["passed"] = o.passed;
  return j;
}

}  // namespace

int64_t OptimizerTestTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t OptimizerTestShape::numel() const {
  int64_t n = 0;
  for (const OptimizerTestTensor& t : tensors) n += t.numel();
  return n;
}

OptimizerTestShape optimizer_test_shape(const std::string& size) {
  // Roles of an MoE layer's optimizer shard: fused expert gate/up and down (decayed), the
  // router (decayed) and a norm (1-D: no decay, weights near 1).
  auto layer = [](int64_t hidden, int64_t experts, int64_t local_experts, int64_t ffn) {
    return std::vector<OptimizerTestTensor>{
        {"experts.gate_up", {local_experts, 2 * ffn, hidden}, true, 0.0f, 0.02f},
        {"experts.down", {local_experts, hidden, ffn}, true, 0.0f, 0.02f},
        {"router", {experts, hidden}, true, 0.0f, 0.02f},
        {"norm", {hidden}, false, 1.0f, 0.02f},
    };
  };
  OptimizerTestShape shape;
  shape.size = size;
  if (size == "large") {
    shape.tensors = layer(4096, 512, 64, 1024);
    shape.description =
        "one rank's optimizer shard of an MoE layer with hidden 4096, 512 experts (64 on the rank at EP 8, "
        "ETP 1) "
        "and expert FFN 1024: experts.gate_up [64, 2048, 4096], experts.down [64, 4096, 1024], router [512, "
        "4096], "
        "norm [4096]";
  } else if (size == "small") {
    shape.tensors = layer(128, 16, 2, 64);
    shape.description =
        "the large shape's four tensors at hidden 128, 16 experts (2 on the rank), expert FFN 64: "
        "experts.gate_up [2, 128, 128], experts.down [2, 128, 64], router [16, 128], norm [128]";
  } else {
    throw_input_error("--size", "found '" + size + "', expected small or large");
  }
  return shape;
}

void OptimizerCheckOptions::validate() const {
  auto fail = [](const char* option, double value, const char* expected) {
    char what[128];
    std::snprintf(what, sizeof(what), "found %g, expected %s", value, expected);
    throw_input_error(option, what);
  };
  if (!(lr > 0) || !std::isfinite(lr)) fail("lr", lr, "a number > 0 (an update of 0 has no relative error)");
  if (!(one_step_lr > 0) || !std::isfinite(one_step_lr)) fail("one_step_lr", one_step_lr, "a number > 0");
  if (!(beta1 >= 0 && beta1 < 1)) fail("beta1", beta1, "a number in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) fail("beta2", beta2, "a number in [0, 1)");
  if (!(eps > 0) || !std::isfinite(eps)) fail("eps", eps, "a number > 0");
  if (!(weight_decay >= 0) || !std::isfinite(weight_decay))
    fail("weight_decay", weight_decay, "a number >= 0");
  if (!(grad_std > 0) || !std::isfinite(grad_std)) fail("grad_std", grad_std, "a number > 0");
}

std::string optimizer_criterion_name(OptimizerCriterion criterion) {
  switch (criterion) {
    case OptimizerCriterion::step1_bound: return "step-1 bound";
    case OptimizerCriterion::step3_bound: return "step-3 bound";
    case OptimizerCriterion::bitwise_masters: return "bitwise masters";
  }
  return "";
}

OptimizerCheckMemory optimizer_check_memory(const OptimizerTestShape& shape, bool cpu_arms) {
  int64_t largest = 0;
  for (const OptimizerTestTensor& t : shape.tensors) largest = std::max(largest, t.numel());
  constexpr int64_t kHostPerElement = 4 + 8 + 12 + 8 + 16, kCpuBaselinePerElement = 12;
  constexpr int64_t kDevicePerElement = 16;
  OptimizerCheckMemory need;
  need.host_bytes = largest * (kHostPerElement + (cpu_arms ? 0 : kCpuBaselinePerElement));
  need.device_bytes = cpu_arms ? 0 : largest * kDevicePerElement;
  return need;
}

void optimizer_check_require_memory(const OptimizerTestShape& shape, const OptimizerArmSet& arms,
                                    int64_t host_available) {
  const OptimizerCheckMemory need = optimizer_check_memory(shape, arms.is_cpu);
  auto gib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.1f GiB", static_cast<double>(bytes) / (1ll << 30));
    return std::string(text);
  };
  std::string shortfall;
  if (host_available >= 0 && need.host_bytes > host_available)
    shortfall = gib(need.host_bytes) + " of host memory, and MemAvailable is " + gib(host_available);
  else if (!arms.is_cpu && arms.device_free_bytes >= 0 && need.device_bytes > arms.device_free_bytes)
    shortfall = gib(need.device_bytes) + " of GPU memory, and " + arms.device + " has " +
                gib(arms.device_free_bytes) + " free";
  if (shortfall.empty()) return;
  const OptimizerTestShape small = optimizer_test_shape("small");
  throw_input_error("--size " + shape.size,
                    "the check needs " + shortfall + "; run it with --size small (" +
                        with_commas(small.numel()) +
                        " parameters, seconds) or on a machine with more memory (src/check/optimizer_check.h "
                        "counts the need)");
}

OptimizerCheckReport optimizer_check_run(const OptimizerCheckOptions& options, const OptimizerArmSet& arms) {
  options.validate();
  const auto start = std::chrono::steady_clock::now();
  OptimizerCheckReport report;
  report.options = options;
  report.shape = optimizer_test_shape(options.size);
  optimizer_check_require_memory(report.shape, arms, host_memory_available_bytes());
  report.device = arms.device;
  report.baseline.name = arms.fp32_master_name;
  report.under_test.name = arms.precision_aware_name;
  const std::vector<NegativeControl> controls = optimizer_negative_controls();
  const OptimizerArmFactory cpu_fp32 = optimizer_arms_cpu().fp32_master;
  for (const NegativeControl& c : controls) {
    ArmOutcome outcome;
    outcome.name = c.name;
    outcome.fault = c.fault;
    report.controls.push_back(outcome);
    report.control_criteria.push_back(c.must_fail);
  }
  std::vector<ArmOutcome*> all{&report.baseline, &report.under_test};
  for (ArmOutcome& c : report.controls) all.push_back(&c);

  const AdamWConfig cfg{static_cast<float>(options.beta1), static_cast<float>(options.beta2),
                        static_cast<float>(options.eps), static_cast<float>(options.weight_decay)};
  for (size_t k = 0; k < report.shape.tensors.size(); ++k) {
    const OptimizerTestTensor& tensor = report.shape.tensors[k];
    std::vector<float> m0(static_cast<size_t>(tensor.numel()));
    fill_masters(tensor, stream_key(options.seed, k, 0), m0);
    for (ArmOutcome* o : all) o->errors.push_back({tensor.name, 0, 0});
    for (const int steps : {1, 3}) {
      TensorRun run{options, tensor, k, cfg, m0, steps == 1 ? options.one_step_lr : options.lr, steps, {}};
      run.run_reference();
      auto keep = [steps](ArmOutcome& o, const ArmRun& r) {
        (steps == 1 ? o.errors.back().step1 : o.errors.back().step3) = r.error;
        o.master_mismatches += r.mismatches;
      };
      Snapshots baseline;
      keep(report.baseline, run_arm(arms.fp32_master, run, nullptr, &baseline));
      keep(report.under_test, run_arm(arms.precision_aware, run, &baseline, nullptr));
      // The controls are CPU arms: their bitwise reference is the CPU's fp32-master arm.
      Snapshots cpu_baseline;
      if (!arms.is_cpu) run_arm(cpu_fp32, run, nullptr, &cpu_baseline);
      for (size_t c = 0; c < controls.size(); ++c)
        keep(report.controls[c],
             run_arm(controls[c].make, run, arms.is_cpu ? &baseline : &cpu_baseline, nullptr));
    }
  }

  std::vector<double> bounds;
  for (const TensorErrors& e : report.baseline.errors) bounds.push_back(2.0 * e.step3 + 1e-3);
  judge(report.baseline, report.step1_bound, {});
  report.baseline.bitwise_ok = true;  // it is what the others are compared with
  report.baseline.passed = report.baseline.step1_ok;
  judge(report.under_test, report.step1_bound, bounds);
  report.under_test.passed =
      report.under_test.step1_ok && report.under_test.step3_ok && report.under_test.bitwise_ok;
  report.passed = report.baseline.passed && report.under_test.passed;
  for (size_t c = 0; c < report.controls.size(); ++c) {
    ArmOutcome& control = report.controls[c];
    judge(control, report.step1_bound, bounds);
    control.passed = !criterion_holds(control, report.control_criteria[c]);
    report.passed = report.passed && control.passed;
  }
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

std::string optimizer_report_text(const OptimizerCheckReport& r) {
  const OptimizerCheckOptions& o = r.options;
  std::string out;
  char line[768];
  out += "loom check optimizer: precision-aware AdamW against an fp64 reference\n";
  out += "  device   " + r.device + "\n";
  out += "  size     " + r.shape.size + ": " + r.shape.description + " (" + with_commas(r.shape.numel()) +
         " parameters)\n";
  std::snprintf(
      line, sizeof(line),
      "  AdamW    beta1 %g, beta2 %g, eps %g, weight decay %g (none on 1-D tensors); grads N(0, %g^2); "
      "seed %llu\n  runs     1 step at lr %g; 3 steps at lr %g\n",
      o.beta1, o.beta2, o.eps, o.weight_decay, o.grad_std, static_cast<unsigned long long>(o.seed),
      o.one_step_lr, o.lr);
  out += line;
  std::snprintf(
      line, sizeof(line),
      "  bounds   relative L2 error of the update: worst tensor after 1 step <= %s; after 3 steps, each "
      "tensor <= 2 x the baseline's on it + 1e-3; masters bitwise equal to the baseline's after every "
      "step\n\n",
      sci(r.step1_bound).c_str());
  out += line;
  const char* row = "  %-34s %-26s %-38s %-20s %s\n";
  std::snprintf(line, sizeof(line), row, "arm", "1 step (worst tensor)", "3 steps (nearest its bound)",
                "masters vs baseline", "result");
  out += line;
  auto step1_cell = [](const ArmOutcome& a) { return sci(a.step1) + " " + a.step1_tensor; };
  auto step3_cell = [](const ArmOutcome& a) {
    return sci(a.step3) + " (bound " + sci(a.step3_bound) + ") " + a.step3_tensor;
  };
  std::snprintf(line, sizeof(line), row, "baseline", step1_cell(r.baseline).c_str(),
                (sci(r.baseline.step3) + " " + r.baseline.step3_tensor).c_str(), "-",
                r.baseline.passed ? "pass" : "FAIL (step-1 bound)");
  out += line;
  std::string verdict = "pass";
  if (!r.under_test.passed) {
    verdict = "FAIL (";
    if (!r.under_test.step1_ok) verdict += "step-1 bound, ";
    if (!r.under_test.step3_ok) verdict += "step-3 bound, ";
    if (!r.under_test.bitwise_ok) verdict += "bitwise masters, ";
    verdict.resize(verdict.size() - 2);
    verdict += ")";
  }
  std::snprintf(line, sizeof(line), row, "under test", step1_cell(r.under_test).c_str(),
                step3_cell(r.under_test).c_str(), masters_text(r.under_test).c_str(), verdict.c_str());
  out += line;
  out += "    baseline:   " + r.baseline.name + "\n    under test: " + r.under_test.name + "\n";
  out += "\n  negative controls (CPU arms with a fault; each must fail its criterion)\n";
  for (size_t c = 0; c < r.controls.size(); ++c) {
    const ArmOutcome& control = r.controls[c];
    const std::string criterion = optimizer_criterion_name(r.control_criteria[c]);
    const std::string outcome =
        control.passed ? "control failed as expected (" + criterion + ")"
                       : "FAIL: control passed its " + criterion + "; the check cannot see this fault";
    std::snprintf(line, sizeof(line), row, control.name.c_str(), step1_cell(control).c_str(),
                  step3_cell(control).c_str(), masters_text(control).c_str(), outcome.c_str());
    out += line;
  }
  for (const ArmOutcome& control : r.controls) out += "    " + control.name + ": " + control.fault + "\n";
  std::snprintf(line, sizeof(line), "\nresult: %s (%.1f s)\n", r.passed ? "pass" : "FAIL", r.seconds);
  out += line;
  return out;
}

nlohmann::ordered_json optimizer_report_json(const OptimizerCheckReport& r) {
  const OptimizerCheckOptions& o = r.options;
  nlohmann::ordered_json j;
  j["result"] = r.passed ? "pass" : "fail";
  j["device"] = r.device;
  j["size"] = r.shape.size;
  j["shape"] = r.shape.description;
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const OptimizerTestTensor& t : r.shape.tensors)
    tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"decay", t.decay}});
  j["tensors"] = tensors;
  j["parameters"] = r.shape.numel();
  j["hyperparameters"] = {
      {"lr", o.lr},   {"one_step_lr", o.one_step_lr},   {"beta1", o.beta1},       {"beta2", o.beta2},
      {"eps", o.eps}, {"weight_decay", o.weight_decay}, {"grad_std", o.grad_std}, {"seed", o.seed}};
  j["step1_bound"] = r.step1_bound;
  j["baseline"] = outcome_json(r.baseline, false);
  j["under_test"] = outcome_json(r.under_test, true);
  nlohmann::ordered_json controls = nlohmann::ordered_json::array();
  for (size_t c = 0; c < r.controls.size(); ++c) {
    nlohmann::ordered_json control = outcome_json(r.controls[c], true);
    control["must_fail"] = optimizer_criterion_name(r.control_criteria[c]);
    controls.push_back(control);
  }
  j["controls"] = controls;
  j["seconds"] = r.seconds;
  return j;
}

}  // namespace loom
