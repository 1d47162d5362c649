#include "check/config_check.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.h"
#include "core/json_strict.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// The shortest text that reads back as the same double: a resume checkpoint compares these
// texts, so 1e-5 and 1.0000000001e-5 must not print alike.
std::string text_of(double value) {
  char text[64];
  const std::to_chars_result end = std::to_chars(text, text + sizeof(text), value);
  return std::string(text, end.ptr);
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
  // Fields of the same name in both lists; a field only one recipe has is not compared
  // (train.seed of a random init against an HF init: train.init already differs).
  void compare(const std::vector<ConfigField>& candidate, const std::vector<ConfigField>& reference) {
    for (const ConfigField& c : candidate)
      for (const ConfigField& r : reference)
        if (c.name == r.name && c.value != r.value)
          list.push_back(c.name + ": " + c.value + " vs " + r.value);
  }
  std::vector<std::string> list;
};

// Appends "name: text" fields of one class.
class FieldList {
 public:
  explicit FieldList(std::vector<ConfigField>& out, std::string cls) : out_(out), cls_(std::move(cls)) {}
  template <typename T>
  void add(const std::string& name, const T& value) {
    out_.push_back({cls_, name, text_of(value)});
  }

 private:
  std::vector<ConfigField>& out_;
  std::string cls_;
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

void model_fields(const Recipe& x, std::vector<ConfigField>& out) {
  FieldList f(out, "model");
  f.add("model", model_name(x.model));
  const ModelConfig& a = x.model_config;
  f.add("architecture.vocab_size", a.vocab_size);
  f.add("architecture.hidden_size", a.hidden_size);
  f.add("architecture.intermediate_size", a.intermediate_size);
  f.add("architecture.num_hidden_layers", a.num_hidden_layers);
  f.add("architecture.num_attention_heads", a.num_attention_heads);
  f.add("architecture.num_key_value_heads", a.num_key_value_heads);
  f.add("architecture.head_dim", a.head_dim);
  f.add("architecture.max_position_embeddings", a.max_position_embeddings);
  f.add("architecture.rms_norm_eps", a.rms_norm_eps);
  f.add("architecture.rope_theta", a.rope_theta);
  f.add("architecture.tie_word_embeddings", a.tie_word_embeddings);
  f.add("architecture.dtype", a.dtype);
  if (!has_train(x)) return;
  f.add("train.init", std::string(x.train.init_hf_checkpoint.empty() ? "random" : "hf_checkpoint"));
  if (x.train.init_hf_checkpoint.empty())
    f.add("train.seed (random init)", static_cast<int64_t>(x.train.seed));
}

ConfigClassResult model_class(const Recipe& c, const Recipe& r) {
  ConfigClassResult out{"model", false, {}, {}};
  Differences d;
  std::vector<ConfigField> a, b;
  model_fields(c, a);
  model_fields(r, b);
  d.compare(a, b);
  if (has_train(c) && has_train(r)) {
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
    nlohmann::json manifest;
    try {
      manifest = json_read_file_strict(manifest_path);
    } catch (const InputError& e) {  // cannot open, not JSON, a key twice: reported as a problem
      id.problem = e.what();
      return id;
    }
    if (!manifest.is_object() || !manifest.contains("rows_sha256") || !manifest["rows_sha256"].is_string()) {
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

void schedule_fields(const Recipe& x, std::vector<ConfigField>& out) {
  FieldList f(out, "schedule");
  f.add("workload.global_batch", x.workload.global_batch);
  f.add("steps (train.steps or result.steps_per_run)", run_steps(x));
  const OptimizerSpec& o = x.train.optimizer;
  f.add("train.optimizer.lr", o.lr);
  f.add("train.optimizer.min_lr", o.min_lr);
  f.add("train.optimizer.decay", o.decay);
  f.add("train.optimizer.warmup_fraction", o.warmup_fraction);
}

ConfigClassResult schedule_class(const Recipe& c, const Recipe& r) {
  ConfigClassResult out{"schedule", false, {}, {}};
  Differences d;
  if (run_steps(c) == 0 || run_steps(r) == 0)
    d.list.push_back("steps: expected train.steps or result.steps_per_run in both recipes");
  std::vector<ConfigField> a, b;
  schedule_fields(c, a);
  schedule_fields(r, b);
  if (!d.list.empty()) {  // the steps are reported above, not as "0 vs N"
    std::erase_if(a, [](const ConfigField& f) { return f.name.starts_with("steps "); });
  }
  d.compare(a, b);
  out.differences = d.list;
  out.pass = d.list.empty();
  return out;
}

void optimizer_fields(const Recipe& x, std::vector<ConfigField>& out) {
  FieldList f(out, "optimizer");
  const OptimizerSpec& o = x.train.optimizer;
  f.add("train.optimizer.beta1", o.beta1);
  f.add("train.optimizer.beta2", o.beta2);
  f.add("train.optimizer.eps", o.eps);
  f.add("train.optimizer.weight_decay", o.weight_decay);
  f.add("train.optimizer.clip_grad", o.clip_grad);
  // What the optimizer trains: every weight, or LoRA's adapters over a frozen base.
  const LoraSpec& lora = x.train.lora;
  if (!lora.enabled()) {
    f.add("train.lora", std::string("none (full fine-tuning)"));
    return;
  }
  std::string targets;
  for (const std::string& t : lora.targets) targets += (targets.empty() ? "" : " ") + t;
  f.add("train.lora.rank", lora.rank);
  f.add("train.lora.alpha", lora.alpha);
  f.add("train.lora.targets", targets);
  f.add("train.lora.dropout", lora.dropout);
  f.add("train.lora.rslora", lora.rslora);
  f.add("train.lora.init", lora.init_adapter.empty()
                               ? "PEFT's default (train.seed " + std::to_string(x.train.seed) + ")"
                               : lora.init_adapter);
}

void precision_fields(const Recipe& x, std::vector<ConfigField>& out) {
  FieldList f(out, "precision");
  f.add("workload.precision", x.workload.precision);
  if (x.workload.precision != "fp8") return;  // the FP8 settings matter to FP8 runs alone
  const Fp8Spec& fp8 = x.workload.fp8;
  f.add("workload.fp8.scaling", fp8.scaling);
  f.add("workload.fp8.gradients", fp8.gradients);
  f.add("workload.fp8.bf16_first_layers", fp8.bf16_first_layers);
  f.add("workload.fp8.bf16_last_layers", fp8.bf16_last_layers);
}

// A class whose verdict is its fields' comparison alone.
ConfigClassResult fields_class(const std::string& name,
                               void (*fields)(const Recipe&, std::vector<ConfigField>&), const Recipe& c,
                               const Recipe& r) {
  ConfigClassResult out{name, false, {}, {}};
  Differences d;
  std::vector<ConfigField> a, b;
  fields(c, a);
  fields(r, b);
  d.compare(a, b);
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
  out.notes.push_back("loss: per-token SFT loss (docs/numerics.md) in both");
  out.differences = d.list;
  out.pass = d.list.empty();
  return out;
}

void layout_fields(const Recipe& x, std::vector<ConfigField>& out) {
  FieldList f(out, "layout");
  const LayoutSpec& a = x.layout;
  f.add("layout.tp", a.tp);
  f.add("layout.pp", a.pp);
  f.add("layout.cp", a.cp);
  f.add("layout.dp", a.dp);
  f.add("layout.vpp", a.vpp);
  f.add("layout.ep", a.ep);
  f.add("layout.etp", a.etp);
  f.add("layout.sequence_parallel", a.sequence_parallel);
  f.add("layout.max_tokens_per_gpu", a.max_tokens_per_gpu);
  f.add("layout.rows_per_microbatch",
        a.rows_per_microbatch > 0 ? std::to_string(a.rows_per_microbatch) : std::string("(none)"));
  std::string split;
  for (size_t i = 0; i < a.layer_split.size(); ++i)
    split += (i ? "," : "") + std::to_string(a.layer_split[i]);
  f.add("layout.layer_split", split.empty() ? std::string("even") : "[" + split + "]");
  f.add("layout.recompute", a.recompute.enabled);
  if (a.recompute.enabled) {
    f.add("layout.recompute.granularity", a.recompute.granularity);
    f.add("layout.recompute.method", a.recompute.method);
    f.add("layout.recompute.num_layers", a.recompute.num_layers);
  }
  f.add("layout.offload", a.offload.enabled);
  if (a.offload.enabled) {
    f.add("layout.offload.optimizer_fraction", a.offload.optimizer_fraction);
    f.add("layout.offload.overlap", a.offload.overlap);
  }
  f.add("layout.dispatcher", a.dispatcher);
  f.add("gpu.count", x.gpu_count);
  if (has_train(x)) f.add("train.device", x.train.device);
}

std::vector<std::string> layout_differences(const Recipe& c, const Recipe& r) {
  Differences d;
  std::vector<ConfigField> a, b;
  layout_fields(c, a);
  layout_fields(r, b);
  d.compare(a, b);
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
  report.classes = {model_class(candidate, reference),
                    data_class(candidate, reference),
                    schedule_class(candidate, reference),
                    fields_class("optimizer", optimizer_fields, candidate, reference),
                    fields_class("precision", precision_fields, candidate, reference),
                    loss_class(candidate, reference)};
  report.layout_differences = layout_differences(candidate, reference);
  report.passed = true;
  for (const ConfigClassResult& c : report.classes) report.passed = report.passed && c.pass;
  return report;
}

std::vector<ConfigField> config_numerics_fields(const Recipe& recipe) {
  std::vector<ConfigField> fields;
  model_fields(recipe, fields);
  FieldList(fields, "data").add("workload.row_tokens", recipe.workload.row_tokens);
  schedule_fields(recipe, fields);
  optimizer_fields(recipe, fields);
  precision_fields(recipe, fields);
  if (std::optional<std::string> rule =
          scalar_at(recipe.document, {"workload", "dataset", "build", "loss_mask"}))
    FieldList(fields, "loss").add("workload.dataset.build.loss_mask", *rule);
  return fields;
}

std::vector<ConfigField> config_layout_fields(const Recipe& recipe) {
  std::vector<ConfigField> fields;
  layout_fields(recipe, fields);
  return fields;
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
