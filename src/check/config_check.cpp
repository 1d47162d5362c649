#include "check/config_check.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string text_of(double value) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.10g", value);
  return text;
}
std::string text_of(int64_t value) {
  return std::to_string(value);
}
std::string text_of(bool value) {
  return value ? "true" : "false";
}
std::string text_of(const std::string& value) {
  return value.empty() ? "(none)" : value;
}

// Collects "field: candidate vs reference" for each field that differs.
class Differences {
 public:
  template <typename T>
  void compare(const std::string& field, const T& candidate, const T& reference) {
    if (!(candidate == reference))
      list.push_back(field + ": " + text_of(candidate) + " vs " + text_of(reference));
  }
  std::vector<std::string> list;
};

// A scalar of the document as written, if present (a const walk: it adds no nodes).
std::optional<std::string> scalar_at(const YAML::Node& document, const std::vector<std::string>& keys) {
  YAML::Node node = document;
  for (const std::string& key : keys) {
    if (!node.IsMap()) return std::nullopt;
    const YAML::Node& map = node;
    YAML::Node next = map[key];
    if (!next.IsDefined()) return std::nullopt;
    node.reset(next);
  }
  if (!node.IsScalar()) return std::nullopt;
  return node.Scalar();
}

bool has_train(const Recipe& r) {
  const YAML::Node& document = r.document;
  if (!document.IsMap()) return false;
  const YAML::Node train = document["train"];
  return train.IsDefined() && train.IsMap();
}

std::string model_name(const std::string& name) {
  const size_t slash = name.rfind('/');
  return slash == std::string::npos ? name : name.substr(slash + 1);
}

ConfigClassResult model_class(const Recipe& c, const Recipe& r) {
  ConfigClassResult out{"model", false, {}, {}};
  Differences d;
  d.compare("model", model_name(c.model), model_name(r.model));
  const Qwen3Config &a = c.model_config, &b = r.model_config;
  d.compare("architecture.vocab_size", a.vocab_size, b.vocab_size);
  d.compare("architecture.hidden_size", a.hidden_size, b.hidden_size);
  d.compare("architecture.intermediate_size", a.intermediate_size, b.intermediate_size);
  d.compare("architecture.num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers);
  d.compare("architecture.num_attention_heads", a.num_attention_heads, b.num_attention_heads);
  d.compare("architecture.num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads);
  d.compare("architecture.head_dim", a.head_dim, b.head_dim);
  d.compare("architecture.max_position_embeddings", a.max_position_embeddings, b.max_position_embeddings);
  d.compare("architecture.rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps);
  d.compare("architecture.rope_theta", a.rope_theta, b.rope_theta);
  d.compare("architecture.tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings);
  d.compare("architecture.dtype", a.dtype, b.dtype);
  if (has_train(c) && has_train(r)) {
    auto kind = [](const Recipe& x) {
      return x.train.init_hf_checkpoint.empty() ? "random" : "hf_checkpoint";
    };
    d.compare("train.init", std::string(kind(c)), std::string(kind(r)));
    if (c.train.init_hf_checkpoint.empty() && r.train.init_hf_checkpoint.empty())
      d.compare("train.seed (random init)", static_cast<int64_t>(c.train.seed),
                static_cast<int64_t>(r.train.seed));
    if (!c.train.init_hf_checkpoint.empty() && !r.train.init_hf_checkpoint.empty())
      out.notes.push_back(c.train.init_hf_checkpoint == r.train.init_hf_checkpoint
                              ? "both start from the checkpoint " + c.train.init_hf_checkpoint
                              : "checkpoint weights not compared: " + c.train.init_hf_checkpoint + " vs " +
                                    r.train.init_hf_checkpoint);
  } else {
    out.notes.push_back("init not compared: a recipe without a train block gives none");
  }
  out.differences = d.list;
  out.pass = d.list.empty();
  return out;
}

// Where a recipe's rows come from and their checksum, if it has one.
struct DataIdentity {
  std::string rows_sha256;  // from the recipe or the row store's manifest
  std::string source;       // which of them
  std::string jsonl;        // a .jsonl rows file (no rows_sha256 of its own)
  std::string problem;      // a recipe whose two checksums disagree, or an unreadable manifest
};

DataIdentity data_identity(const Recipe& r) {
  DataIdentity id;
  if (std::optional<std::string> sha = scalar_at(r.document, {"workload", "dataset", "rows_sha256"})) {
    id.rows_sha256 = *sha;
    id.source = "workload.dataset.rows_sha256";
  }
  const std::string& path = r.train.data_path;
  if (path.empty() || !has_train(r)) return id;
  if (fs::is_directory(path)) {
    const std::string manifest_path = (fs::path(path) / "manifest.json").string();
    std::ifstream in(manifest_path);
    const nlohmann::json manifest = nlohmann::json::parse(in, nullptr, false);
    if (!in || manifest.is_discarded() || !manifest.contains("rows_sha256") ||
        !manifest["rows_sha256"].is_string()) {
      id.problem = manifest_path + ": no readable rows_sha256";
      return id;
    }
    const std::string sha = manifest["rows_sha256"].get<std::string>();
    if (!id.rows_sha256.empty() && id.rows_sha256 != sha)
      id.problem =
          "workload.dataset.rows_sha256 " + id.rows_sha256 + " differs from " + manifest_path + "'s " + sha;
    if (id.rows_sha256.empty()) {
      id.rows_sha256 = sha;
      id.source = manifest_path;
    }
  } else if (fs::is_regular_file(path)) {
    id.jsonl = path;
  }
  return id;
}

bool same_bytes(const std::string& a, const std::string& b) {
  std::error_code error;
  if (fs::equivalent(a, b, error)) return true;
  if (fs::file_size(a, error) != fs::file_size(b, error) || error) return false;
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  std::vector<char> ba(1 << 20), bb(1 << 20);
  while (fa && fb) {
    fa.read(ba.data(), static_cast<std::streamsize>(ba.size()));
    fb.read(bb.data(), static_cast<std::streamsize>(bb.size()));
    if (fa.gcount() != fb.gcount() || !std::equal(ba.begin(), ba.begin() + fa.gcount(), bb.begin()))
      return false;
  }
  return fa.eof() && fb.eof();
}

std::string describe(const DataIdentity& id) {
  if (!id.rows_sha256.empty()) return "rows_sha256 from " + id.source;
  if (!id.jsonl.empty()) return "a .jsonl rows file without a rows_sha256";
  return "no rows checksum";
}

ConfigClassResult data_class(const Recipe& c, const Recipe& r) {
  ConfigClassResult out{"data", false, {}, {}};
  Differences d;
  d.compare("workload.row_tokens", c.workload.row_tokens, r.workload.row_tokens);
  const DataIdentity a = data_identity(c), b = data_identity(r);
  if (!a.problem.empty()) d.list.push_back("candidate: " + a.problem);
  if (!b.problem.empty()) d.list.push_back("reference: " + b.problem);
  if (a.problem.empty() && b.problem.empty()) {
    if (!a.rows_sha256.empty() && !b.rows_sha256.empty()) {
      d.compare("rows_sha256", a.rows_sha256, b.rows_sha256);
      out.notes.push_back("rows_sha256 " + a.rows_sha256 + " (candidate: " + a.source +
                          "; reference: " + b.source + ")");
    } else if (!a.jsonl.empty() && !b.jsonl.empty()) {
      if (!same_bytes(a.jsonl, b.jsonl))
        d.list.push_back("train.data.path: " + a.jsonl + " and " + b.jsonl + " differ byte for byte");
      else
        out.notes.push_back("the same rows file, byte for byte: " + a.jsonl + " and " + b.jsonl);
    } else {
      d.list.push_back("no common checksum to compare (candidate: " + describe(a) + "; reference: " +
                       describe(b) + "); expected workload.dataset.rows_sha256 or a row store in both");
    }
  }
  out.differences = d.list;
  out.pass = d.list.empty();
  return out;
}

int64_t run_steps(const Recipe& r) {
  if (has_train(r)) return r.train.steps;
  std::optional<std::string> steps = scalar_at(r.document, {"result", "steps_per_run"});
  return steps ? std::stoll(*steps) : 0;  // the schema checked it is an int
}

ConfigClassResult schedule_class(const Recipe& c, const Recipe& r) {
  ConfigClassResult out{"schedule", false, {}, {}};
  Differences d;
  d.compare("workload.global_batch", c.workload.global_batch, r.workload.global_batch);
  const int64_t cs = run_steps(c), rs = run_steps(r);
  if (cs == 0 || rs == 0)
    d.list.push_back("steps: expected train.steps or result.steps_per_run in both recipes");
  else
    d.compare("steps (train.steps or result.steps_per_run)", cs, rs);
  const OptimizerSpec &a = c.train.optimizer, &b = r.train.optimizer;
  d.compare("train.optimizer.lr", a.lr, b.lr);
  d.compare("train.optimizer.min_lr", a.min_lr, b.min_lr);
  d.compare("train.optimizer.decay", a.decay, b.decay);
  d.compare("train.optimizer.warmup_fraction", a.warmup_fraction, b.warmup_fraction);
  out.differences = d.list;
  out.pass = d.list.empty();
  return out;
}

ConfigClassResult optimizer_class(const Recipe& c, const Recipe& r) {
  ConfigClassResult out{"optimizer", false, {}, {}};
  Differences d;
  const OptimizerSpec &a = c.train.optimizer, &b = r.train.optimizer;
  d.compare("train.optimizer.beta1", a.beta1, b.beta1);
  d.compare("train.optimizer.beta2", a.beta2, b.beta2);
  d.compare("train.optimizer.eps", a.eps, b.eps);
  d.compare("train.optimizer.weight_decay", a.weight_decay, b.weight_decay);
  d.compare("train.optimizer.clip_grad", a.clip_grad, b.clip_grad);
  out.differences = d.list;
  out.pass = d.list.empty();
  return out;
}

ConfigClassResult precision_class(const Recipe& c, const Recipe& r) {
  ConfigClassResult out{"precision", false, {}, {}};
  Differences d;
  d.compare("workload.precision", c.workload.precision, r.workload.precision);
  out.differences = d.list;
  out.pass = d.list.empty();
  return out;
}

ConfigClassResult loss_class(const Recipe& c, const Recipe& r) {
  ConfigClassResult out{"loss", false, {}, {}};
  Differences d;
  const std::vector<std::string> key{"workload", "dataset", "build", "loss_mask"};
  const std::optional<std::string> a = scalar_at(c.document, key), b = scalar_at(r.document, key);
  if (a && b) {
    d.compare("workload.dataset.build.loss_mask", *a, *b);
    if (*a == *b) out.notes.push_back("loss mask rule " + *a + " in both");
  } else {
    out.notes.push_back(
        "loss mask rule not given in both recipes; it is part of the rows, which the data class checks");
  }
  out.notes.push_back("loss: per-token SFT loss (SEMANTICS.md) in both");
  out.differences = d.list;
  out.pass = d.list.empty();
  return out;
}

std::vector<std::string> layout_differences(const Recipe& c, const Recipe& r) {
  Differences d;
  const LayoutSpec &a = c.layout, &b = r.layout;
  d.compare("layout.tp", a.tp, b.tp);
  d.compare("layout.pp", a.pp, b.pp);
  d.compare("layout.cp", a.cp, b.cp);
  d.compare("layout.dp", a.dp, b.dp);
  d.compare("layout.vpp", a.vpp, b.vpp);
  d.compare("layout.ep", a.ep, b.ep);
  d.compare("layout.etp", a.etp, b.etp);
  d.compare("layout.sequence_parallel", a.sequence_parallel, b.sequence_parallel);
  d.compare("layout.max_tokens_per_gpu", a.max_tokens_per_gpu, b.max_tokens_per_gpu);
  auto given = [](int64_t v) { return v > 0 ? std::to_string(v) : std::string("(none)"); };
  d.compare("layout.rows_per_microbatch", given(a.rows_per_microbatch), given(b.rows_per_microbatch));
  auto split = [](const std::vector<int64_t>& s) {
    std::string text;
    for (size_t i = 0; i < s.size(); ++i) text += (i ? "," : "") + std::to_string(s[i]);
    return text.empty() ? std::string("even") : "[" + text + "]";
  };
  d.compare("layout.layer_split", split(a.layer_split), split(b.layer_split));
  d.compare("layout.recompute", a.recompute.enabled, b.recompute.enabled);
  if (a.recompute.enabled && b.recompute.enabled) {
    d.compare("layout.recompute.granularity", a.recompute.granularity, b.recompute.granularity);
    d.compare("layout.recompute.method", a.recompute.method, b.recompute.method);
    d.compare("layout.recompute.num_layers", a.recompute.num_layers, b.recompute.num_layers);
  }
  d.compare("layout.offload", a.offload.enabled, b.offload.enabled);
  if (a.offload.enabled && b.offload.enabled) {
    d.compare("layout.offload.optimizer_fraction", a.offload.optimizer_fraction,
              b.offload.optimizer_fraction);
    d.compare("layout.offload.overlap", a.offload.overlap, b.offload.overlap);
  }
  d.compare("layout.dispatcher", a.dispatcher, b.dispatcher);
  d.compare("gpu.count", c.gpu_count, r.gpu_count);
  if (has_train(c) && has_train(r)) d.compare("train.device", c.train.device, r.train.device);
  return d.list;
}

}  // namespace

const ConfigClassResult& ConfigCheckReport::result_of(const std::string& name) const {
  for (const ConfigClassResult& c : classes)
    if (c.name == name) return c;
  assert_fail("result_of", "no configuration class named " + name, __FILE__, __LINE__);
}

ConfigCheckReport config_check(const Recipe& candidate, const Recipe& reference) {
  ConfigCheckReport report;
  report.candidate = candidate.path;
  report.reference = reference.path;
  report.classes = {model_class(candidate, reference),     data_class(candidate, reference),
                    schedule_class(candidate, reference),  optimizer_class(candidate, reference),
                    precision_class(candidate, reference), loss_class(candidate, reference)};
  report.layout_differences = layout_differences(candidate, reference);
  report.passed = true;
  for (const ConfigClassResult& c : report.classes) report.passed = report.passed && c.pass;
  return report;
}

ConfigCheckReport config_check_files(const std::string& candidate, const std::string& reference) {
  return config_check(recipe_load(candidate, {}, RecipeUse::inspect),
                      recipe_load(reference, {}, RecipeUse::inspect));
}

std::string config_report_text(const ConfigCheckReport& report) {
  std::string out =
      "loom check config\n  candidate  " + report.candidate + "\n  reference  " + report.reference + "\n\n";
  char line[256];
  std::snprintf(line, sizeof(line), "  %-10s %-6s %s\n", "class", "result", "detail");
  out += line;
  std::string failed;
  for (const ConfigClassResult& c : report.classes) {
    std::snprintf(line, sizeof(line), "  %-10s %-6s ", c.name.c_str(), c.pass ? "pass" : "FAIL");
    out += line;
    std::vector<std::string> details = c.differences;
    details.insert(details.end(), c.notes.begin(), c.notes.end());
    if (details.empty()) details.push_back("equal");
    for (size_t i = 0; i < details.size(); ++i) out += (i ? std::string(20, ' ') : "") + details[i] + "\n";
    if (!c.pass) failed += (failed.empty() ? "" : ", ") + c.name;
  }
  out += "\n  layout (may differ): ";
  if (report.layout_differences.empty()) out += "the same\n";
  for (size_t i = 0; i < report.layout_differences.size(); ++i)
    out += (i ? std::string(23, ' ') : "") + report.layout_differences[i] + "\n";
  out += "\nresult: " + std::string(report.passed ? "pass" : "FAIL (" + failed + ")") + "\n";
  return out;
}

nlohmann::ordered_json config_report_json(const ConfigCheckReport& report) {
  nlohmann::ordered_json j;
  j["result"] = report.passed ? "pass" : "fail";
  j["candidate"] = report.candidate;
  j["reference"] = report.reference;
  nlohmann::ordered_json classes = nlohmann::ordered_json::array();
  for (const ConfigClassResult& c : report.classes)
    classes.push_back({{"class", c.name},
                       {"result", c.pass ? "pass" : "fail"},
                       {"differences", c.differences},
                       {"notes", c.notes}});
  j["classes"] = classes;
  j["layout_differences"] = report.layout_differences;
  return j;
}

std::string layout_summary(const LayoutSpec& l) {
  std::string text = "tp " + std::to_string(l.tp) + ", pp " + std::to_string(l.pp) + ", cp " +
                     std::to_string(l.cp) + ", dp " + std::to_string(l.dp);
  if (l.ep > 1) text += ", ep " + std::to_string(l.ep);
  if (l.sequence_parallel) text += ", sequence parallel";
  if (l.max_tokens_per_gpu > 0) text += ", max " + std::to_string(l.max_tokens_per_gpu) + " tokens/GPU";
  text +=
      l.recompute.enabled
          ? ", recompute " + l.recompute.granularity +
                (l.recompute.granularity == "full"
                     ? " (" + l.recompute.method + ", " + std::to_string(l.recompute.num_layers) + " layers)"
                     : "")
          : ", no recompute";
  text += l.offload.enabled ? ", optimizer offload " + text_of(l.offload.optimizer_fraction) +
                                  (l.offload.overlap ? " (overlapped copies)" : "")
                            : ", no offload";
  return text;
}

}  // namespace loom
