#include "recipe/recipe.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "recipe/rules.h"
#include "recipe/schema.h"

namespace loom {
namespace {

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '.')) parts.push_back(part);
  if (!path.empty() && path.back() == '.') parts.emplace_back();
  return parts;
}

std::vector<std::string> split_fields(const std::string& fields) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= fields.size()) {
    size_t comma = fields.find(", ", start);
    out.push_back(fields.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 2;
  }
  return out;
}

bool is_under(const std::string& path, const std::string& ancestor) {
  return path == ancestor ||
         (path.size() > ancestor.size() && path.compare(0, ancestor.size(), ancestor) == 0 &&
          (path[ancestor.size()] == '.' || path[ancestor.size()] == '['));
}

// "a.b[2].c" as keys and list indices.
struct PathStep {
  std::string key;
  int64_t index = -1;  // >= 0: a list index
};

std::vector<PathStep> parse_steps(const std::string& path) {
  std::vector<PathStep> steps;
  for (const std::string& part : split_path(path)) {
    size_t bracket = part.find('[');
    steps.push_back(PathStep{part.substr(0, bracket)});
    while (bracket != std::string::npos) {
      size_t close = part.find(']', bracket);
      steps.push_back(PathStep{"", std::stoll(part.substr(bracket + 1, close - bracket - 1))});
      bracket = part.find('[', close);
    }
  }
  return steps;
}

// The 1-based line of the deepest part of `path` present in the document (a key's line,
// or a list item's), 0 when nothing of it is.
int document_line(const YAML::Node& document, const std::string& path) {
  YAML::Node node = document;
  int line = 0;
  for (const PathStep& step : parse_steps(path)) {
    YAML::Node next;
    bool found = false;
    if (step.index >= 0 && node.IsSequence() && step.index < static_cast<int64_t>(node.size())) {
      const YAML::Node& list = node;
      next.reset(list[static_cast<size_t>(step.index)]);
      if (!next.Mark().is_null()) line = next.Mark().line + 1;
      found = true;
    } else if (step.index < 0 && node.IsMap()) {
      for (const auto& item : node) {
        if (item.first.IsScalar() && item.first.Scalar() == step.key) {
          next.reset(item.second);
          if (!item.first.Mark().is_null()) line = item.first.Mark().line + 1;
          found = true;
          break;
        }
      }
    }
    if (!found) break;
    node.reset(next);
  }
  return line;
}

// Reads the document's typed values, falling back on the schema's defaults. A field with a
// schema violation (or under one) reads as absent.
class Reader {
 public:
  Reader(const YAML::Node& document, const SchemaField& schema, const std::vector<std::string>& bad)
      : document_(document), schema_(schema), bad_(bad) {}

  bool bad(const std::string& path) const {
    return std::any_of(bad_.begin(), bad_.end(), [&](const std::string& b) { return is_under(path, b); });
  }

  // The document's node at `path`, nullopt when absent (or bad).
  std::optional<YAML::Node> present(const std::string& path) const {
    if (bad(path)) return std::nullopt;
    YAML::Node node = document_;
    for (const std::string& key : split_path(path)) {
      if (!node.IsMap()) return std::nullopt;
      const YAML::Node& map = node;
      YAML::Node child = map[key];
      if (!child.IsDefined()) return std::nullopt;
      node.reset(child);
    }
    return node;
  }

  // The document's node, or the schema's default; nullopt when neither.
  std::optional<YAML::Node> value(const std::string& path) const {
    if (bad(path)) return std::nullopt;
    if (std::optional<YAML::Node> node = present(path)) return node;
    const SchemaField* field = schema_find(schema_, split_path(path));
    if (field && field->default_value.IsDefined()) return field->default_value;
    return std::nullopt;
  }

  bool is_map(const std::string& path) const {
    std::optional<YAML::Node> node = present(path);
    return node && node->IsMap();
  }

  std::optional<int64_t> integer(const std::string& path) const {
    std::optional<YAML::Node> node = value(path);
    return node ? yaml_int(*node) : std::nullopt;
  }
  std::optional<double> number(const std::string& path) const {
    std::optional<YAML::Node> node = value(path);
    return node ? yaml_number(*node) : std::nullopt;
  }
  std::optional<bool> flag(const std::string& path) const {
    std::optional<YAML::Node> node = value(path);
    return node ? yaml_bool(*node) : std::nullopt;
  }
  std::optional<std::string> text(const std::string& path) const {
    std::optional<YAML::Node> node = value(path);
    if (!node || !node->IsScalar()) return std::nullopt;
    return node->Scalar();
  }
  std::vector<std::string> texts(const std::string& path) const {
    std::vector<std::string> out;
    std::optional<YAML::Node> node = value(path);
    if (!node || !node->IsSequence()) return out;
    for (const auto& item : *node)
      if (item.IsScalar()) out.push_back(item.Scalar());
    return out;
  }
  std::vector<int64_t> integers(const std::string& path) const {
    std::vector<int64_t> out;
    std::optional<YAML::Node> node = value(path);
    if (!node || !node->IsSequence()) return out;
    for (const auto& item : *node) out.push_back(yaml_int(item).value_or(0));
    return out;
  }

 private:
  const YAML::Node& document_;
  const SchemaField& schema_;
  const std::vector<std::string>& bad_;
};

std::string resolve_path(const std::string& recipe_path, const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(recipe_path).parent_path() / path).lexically_normal().string();
}

std::string format_value(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

// One --set: checks the path against the schema and writes the value into the document.
void apply_override(YAML::Node& document, const SchemaField& schema, const std::string& text,
                    const std::string& file, std::vector<std::string>* overridden,
                    std::vector<Violation>* out) {
  auto fail = [&](const std::string& what) { out->push_back(Violation{file, 0, "--set " + text, what}); };
  size_t equals = text.find('=');
  if (equals == std::string::npos || equals == 0)
    return fail("found no field path, expected FIELD.PATH=VALUE");
  const std::string path = text.substr(0, equals);
  const std::vector<std::string> keys = split_path(path);
  const SchemaField* field = &schema;
  std::string walked;
  for (const std::string& key : keys) {
    const SchemaField* parent = field;
    if (parent->type == "map") {
      field = parent->field(key);
    } else if (parent->type == "dict" && !key.empty()) {
      field = parent->element.get();
    } else {
      return fail("found " + path + ", expected a path ending at " + (walked.empty() ? "a field" : walked) +
                  " (" + walked + " is " + schema_describe(*parent) + ")");
    }
    if (!field) {
      std::vector<std::string> names;
      for (const SchemaField& child : parent->fields) names.push_back(child.name);
      std::string suggestion = schema_suggest(key, names);
      return fail("found the unknown field " + path + ", expected " +
                  (walked.empty() ? "a top-level field" : "a field of " + walked) +
                  (suggestion.empty()
                       ? " (" + names.front() + ", ...)"
                       : "; did you mean '" + (walked.empty() ? "" : walked + ".") + suggestion + "'?"));
    }
    walked += (walked.empty() ? "" : ".") + key;
  }
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(equals + 1));
  } catch (const YAML::Exception& e) {
    return fail("found a value that is not valid YAML (" + e.msg + "), expected a YAML scalar or flow list");
  }
  if (!document.IsMap()) return;  // the schema check reports the document itself
  YAML::Node node = document;
  std::string prefix;
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    prefix += (i ? "." : "") + keys[i];
    YAML::Node child = node[keys[i]];
    if (!child.IsMap()) {
      node[keys[i]] = YAML::Node(YAML::NodeType::Map);
      child.reset(node[keys[i]]);
      overridden->push_back(prefix);
    }
    node.reset(child);
  }
  if (value.IsNull() && !field->nullable)
    node.remove(keys.back());
  else
    node[keys.back()] = value;
  overridden->push_back(path);
}

struct Loaded {
  Recipe recipe;
  std::vector<Violation> violations;
};

// The architecture fields that must agree between a built-in size and a config.json.
std::vector<std::string> config_differences(const ModelConfig& a, const ModelConfig& b) {
  std::vector<std::string> out;
  auto compare = [&](const char* name, auto x, auto y) {
    if (x != y) {
      std::ostringstream text;
      text << name << " " << x << " vs " << y;
      out.push_back(text.str());
    }
  };
  compare("model_type", a.model_type, b.model_type);
  compare("vocab_size", a.vocab_size, b.vocab_size);
  compare("hidden_size", a.hidden_size, b.hidden_size);
  compare("intermediate_size", a.intermediate_size, b.intermediate_size);
  compare("num_hidden_layers", a.num_hidden_layers, b.num_hidden_layers);
  compare("num_attention_heads", a.num_attention_heads, b.num_attention_heads);
  compare("num_key_value_heads", a.num_key_value_heads, b.num_key_value_heads);
  compare("head_dim", a.head_dim, b.head_dim);
  compare("tie_word_embeddings", a.tie_word_embeddings, b.tie_word_embeddings);
  compare("rope_theta", a.rope_theta, b.rope_theta);
  compare("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps);
  return out;
}

// Where each YAML document of a stream starts (its root node's mark), read up to a given
// count. yaml-cpp 0.7 (Debian 12's) reads a token that cannot start a node (a stray ',') as
// an empty document without consuming it, so YAML::LoadAll loops for ever on "," while its
// memory grows (yaml-cpp issue #1040; upstream's 0.8.0 stops at an empty root). Counting the
// documents with a bound ends, and a document that starts where the one before it started is
// that token.
class DocumentStarts : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override {
    marks.push_back(mark);
    awaiting_root_ = true;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { root(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { root(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    root(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    root(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    root(mark);
  }
  void OnMapEnd() override {}

 private:
  void root(const YAML::Mark& mark) {
    if (awaiting_root_ && !mark.is_null()) marks.back() = mark;
    awaiting_root_ = false;
  }
  bool awaiting_root_ = false;
};

// The recipe file's YAML, nullopt (with a violation) when it cannot be read or parsed.
std::optional<YAML::Node> recipe_read_document(const std::string& path, std::vector<Violation>* out) {
  std::ifstream in(path);
  if (!in) {
    out->push_back(Violation{path, 0, "", "cannot open the recipe file"});
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  try {
    // A second document would be read by nothing: refused, not ignored.
    std::stringstream stream(text.str());
    YAML::Parser parser(stream);
    DocumentStarts starts;
    while (starts.marks.size() < 2 && parser.HandleNextDocument(starts)) {
    }
    if (starts.marks.size() == 2) {
      const YAML::Mark& mark = starts.marks[1];
      const bool stuck = mark.pos == starts.marks[0].pos;
      out->push_back(
          Violation{path, mark.line + 1, "",
                    stuck ? "not valid YAML: column " + std::to_string(mark.column + 1) +
                                " holds a character that cannot start a value"
                          : "found a second YAML document, expected one (a recipe is one document)"});
      return std::nullopt;
    }
    return YAML::Load(text.str());
  } catch (const YAML::ParserException& e) {
    out->push_back(Violation{path, e.mark.is_null() ? 0 : e.mark.line + 1, "", "not valid YAML: " + e.msg});
    return std::nullopt;
  }
}

// The document's status when it is one the schema allows, else "draft" (the schema check
// reports a bad one).
std::string document_status(const YAML::Node& document, const SchemaField& schema) {
  if (!document.IsMap()) return "draft";
  const YAML::Node& map = document;
  const YAML::Node status = map["status"];
  const SchemaField* status_field = schema.field("status");
  if (status.IsDefined() && status.IsScalar() &&
      std::find(status_field->enum_values.begin(), status_field->enum_values.end(), status.Scalar()) !=
          status_field->enum_values.end())
    return status.Scalar();
  return "draft";
}

// Where the checks after the schema's report: each names its fields, the line is the first
// field's (none for a field a --set wrote).
class LaterViolations {
 public:
  LaterViolations(const std::string& path, const YAML::Node& document,
                  const std::vector<std::string>& overridden, std::vector<Violation>* out)
      : path_(path), document_(document), overridden_(overridden), out_(out) {}

  void add(const std::string& fields, const std::string& what) const {
    bool from_set = false;
    for (const std::string& set : overridden_)
      from_set = from_set || is_under(split_fields(fields).front(), set);
    out_->push_back(Violation{path_, from_set ? 0 : document_line(document_, split_fields(fields).front()),
                              fields, what});
  }

 private:
  const std::string& path_;
  const YAML::Node& document_;
  const std::vector<std::string>& overridden_;
  std::vector<Violation>* out_;
};

void read_workload_and_layout(const Reader& read, Recipe* recipe) {
  WorkloadSpec& workload = recipe->workload;
  workload.row_tokens = read.integer("workload.row_tokens").value_or(0);
  workload.global_batch = read.integer("workload.global_batch").value_or(0);
  workload.precision = read.text("workload.precision").value_or(workload.precision);
  if (read.is_map("workload.fp8")) {
    Fp8Spec& fp8 = workload.fp8;
    fp8.set = true;
    fp8.scaling = read.text("workload.fp8.scaling").value_or(fp8.scaling);
    fp8.gradients = read.text("workload.fp8.gradients").value_or(fp8.gradients);
    fp8.bf16_first_layers = read.integer("workload.fp8.bf16_first_layers").value_or(0);
    fp8.bf16_last_layers = read.integer("workload.fp8.bf16_last_layers").value_or(0);
  }
  workload.moe_set = read.is_map("workload.moe");
  if (read.is_map("workload.moe.aux_loss")) {
    workload.moe_aux_loss.kind = read.text("workload.moe.aux_loss.kind").value_or("");
    workload.moe_aux_loss.coef = read.number("workload.moe.aux_loss.coef").value_or(0.0);
  }

  LayoutSpec& layout = recipe->layout;
  layout.tp = read.integer("layout.tp").value_or(1);
  layout.pp = read.integer("layout.pp").value_or(1);
  layout.cp = read.integer("layout.cp").value_or(1);
  layout.dp = read.integer("layout.dp").value_or(1);
  layout.vpp = read.integer("layout.vpp").value_or(1);
  layout.ep = read.integer("layout.ep").value_or(1);
  layout.etp = read.integer("layout.etp").value_or(1);
  layout.sequence_parallel = read.flag("layout.sequence_parallel").value_or(false);
  layout.activation_offload = read.flag("layout.activation_offload").value_or(false);
  layout.max_tokens_per_gpu = read.integer("layout.max_tokens_per_gpu").value_or(0);
  layout.rows_per_microbatch = read.integer("layout.rows_per_microbatch").value_or(0);
  layout.layer_split = read.integers("layout.layer_split");
  layout.dispatcher = read.text("layout.dispatcher").value_or("");
  layout.cp_comm = read.text("layout.cp_comm").value_or(layout.cp_comm);
  if (read.is_map("layout.recompute")) {
    layout.recompute.enabled = true;
    layout.recompute.granularity =
        read.text("layout.recompute.granularity").value_or(layout.recompute.granularity);
    layout.recompute.method = read.text("layout.recompute.method").value_or(layout.recompute.method);
    layout.recompute.num_layers =
        read.integer("layout.recompute.num_layers").value_or(layout.recompute.num_layers);
  }
  if (read.is_map("layout.offload")) {
    layout.offload.enabled = true;
    layout.offload.optimizer_fraction =
        read.number("layout.offload.optimizer_fraction").value_or(layout.offload.optimizer_fraction);
    layout.offload.overlap = read.flag("layout.offload.overlap").value_or(layout.offload.overlap);
  }
}

void read_gpu_and_result(const Reader& read, Recipe* recipe) {
  recipe->gpu_count = read.integer("gpu.count").value_or(0);
  recipe->gpu_instance = read.text("gpu.instance").value_or("");
  recipe->usd_per_gpu_hour = read.number("gpu.usd_per_gpu_hour").value_or(0);
  std::vector<int64_t> window = read.integers("result.window");
  if (window.size() == 2) {
    recipe->window_first = window[0];
    recipe->window_last = window[1];
  }
}

// The train block; its paths are resolved against the recipe file's folder.
void read_train(const Reader& read, const std::string& path, TrainSpec* train) {
  train->device = read.text("train.device").value_or(train->device);
  train->seed = static_cast<uint64_t>(read.integer("train.seed").value_or(static_cast<int64_t>(train->seed)));
  train->init_hf_checkpoint = resolve_path(path, read.text("train.init.hf_checkpoint").value_or(""));
  train->init_random_config = resolve_path(path, read.text("train.init.random.config").value_or(""));
  train->data_path = resolve_path(path, read.text("train.data.path").value_or(""));
  train->steps = read.integer("train.steps").value_or(0);
  OptimizerSpec& opt = train->optimizer;
  opt.lr = read.number("train.optimizer.lr").value_or(opt.lr);
  opt.min_lr = read.number("train.optimizer.min_lr").value_or(opt.min_lr);
  opt.decay = read.text("train.optimizer.decay").value_or(opt.decay);
  opt.warmup_fraction = read.number("train.optimizer.warmup_fraction").value_or(opt.warmup_fraction);
  opt.weight_decay = read.number("train.optimizer.weight_decay").value_or(opt.weight_decay);
  opt.beta1 = read.number("train.optimizer.beta1").value_or(opt.beta1);
  opt.beta2 = read.number("train.optimizer.beta2").value_or(opt.beta2);
  opt.eps = read.number("train.optimizer.eps").value_or(opt.eps);
  opt.clip_grad = read.number("train.optimizer.clip_grad").value_or(opt.clip_grad);
  if (read.is_map("train.lora")) {
    LoraSpec& lora = train->lora;
    lora.rank = read.integer("train.lora.rank").value_or(0);
    lora.alpha = read.number("train.lora.alpha").value_or(0);
    lora.targets = read.texts("train.lora.targets");
    lora.dropout = read.number("train.lora.dropout").value_or(0);
    lora.rslora = read.flag("train.lora.rslora").value_or(false);
    lora.merge = read.flag("train.lora.merge").value_or(false);
    lora.init_adapter = resolve_path(path, read.text("train.lora.init.adapter").value_or(""));
  }
  train->output_dir = resolve_path(path, read.text("train.output_dir").value_or(""));
  if (read.is_map("train.checkpoint")) {
    train->checkpoint_every = read.integer("train.checkpoint.every").value_or(0);
    train->checkpoint_keep = read.integer("train.checkpoint.keep").value_or(train->checkpoint_keep);
    train->checkpoint_keep_best = read.flag("train.checkpoint.keep_best").value_or(false);
  }
  if (read.is_map("train.eval")) {
    train->eval_path = resolve_path(path, read.text("train.eval.data.path").value_or(""));
    train->eval_every = read.integer("train.eval.every").value_or(0);
    train->eval_max_rows = read.integer("train.eval.max_rows").value_or(0);
  }
  train->on_nonfinite = read.text("train.on_nonfinite").value_or(train->on_nonfinite);
  train->max_consecutive_skips =
      read.integer("train.max_consecutive_skips").value_or(train->max_consecutive_skips);
  train->comm_timeout_s = read.number("train.comm_timeout_s").value_or(train->comm_timeout_s);
  train->fp8_stats_every = read.integer("train.fp8_stats_every").value_or(train->fp8_stats_every);
  if (read.is_map("train.reference")) {
    train->reference_recipe = resolve_path(path, read.text("train.reference.recipe").value_or(""));
    train->reference_metrics = resolve_path(path, read.text("train.reference.metrics").value_or(""));
  }
}

// The architecture: the init's config.json rules; a built-in size must agree with it. Sets
// recipe->model_config and returns true when either gives one.
bool resolve_model_config(const Reader& read, RecipeUse use, const LaterViolations& report, Recipe* recipe) {
  const TrainSpec& train = recipe->train;
  ModelConfig builtin;
  const bool has_builtin = !recipe->model.empty() && qwen3_config_builtin(recipe->model, &builtin);
  std::optional<ModelConfig> from_init;
  std::string init_field;
  std::string init_config;
  bool init_failed = false;
  if (!train.init_hf_checkpoint.empty()) {
    init_field = "train.init.hf_checkpoint";
    init_config = (std::filesystem::path(train.init_hf_checkpoint) / "config.json").string();
  } else if (!train.init_random_config.empty()) {
    init_field = "train.init.random.config";
    init_config = train.init_random_config;
  }
  if (!init_config.empty()) {
    try {
      from_init = model_config_load(init_config);
    } catch (const InputError& e) {
      // Planning a built-in model needs no checkpoint on this machine.
      init_failed = use == RecipeUse::train || !has_builtin;
      if (init_failed)
        report.add(init_field, "found '" + read.text(init_field).value_or("") +
                                   "', expected a readable config.json of a supported model " +
                                   "(model_type qwen3, qwen2, llama or mistral): " + e.what());
    }
  }
  if (from_init && has_builtin) {
    std::vector<std::string> differences = config_differences(builtin, *from_init);
    if (!differences.empty()) {
      std::string list;
      for (size_t i = 0; i < differences.size(); ++i) list += (i ? ", " : "") + differences[i];
      report.add("model, " + init_field, "found the built-in " + recipe->model + " and " + init_config +
                                             " differing (" + list + "), expected the same architecture");
    }
  }
  const bool has_model = from_init || has_builtin;
  if (!has_model && !init_failed && !read.bad("model")) {
    std::string names;
    for (const std::string& name : qwen3_builtin_names()) names += (names.empty() ? "" : ", ") + name;
    report.add("model", "found " + recipe->model + ", expected a built-in size (" + names +
                            ") or a train.init whose config.json gives the architecture");
  }
  if (has_model) recipe->model_config = from_init ? *from_init : builtin;
  return has_model;
}

// Whether every field the layout rules read is well-typed. (A misspelt key beside them does
// not stop the rules: every field they read is fine.)
bool layout_fields_readable(const Reader& read, const std::vector<std::string>& bad) {
  bool readable = !read.bad("layout") && !read.bad("workload.row_tokens") &&
                  !read.bad("workload.global_batch") && !read.bad("gpu.count");
  for (const char* field :
       {"tp", "pp", "cp", "dp", "vpp", "ep", "etp", "sequence_parallel", "max_tokens_per_gpu",
        "rows_per_microbatch", "layer_split", "dispatcher", "cp_comm"}) {
    const std::string field_path = std::string("layout.") + field;
    readable =
        readable && !read.bad(field_path) &&
        std::none_of(bad.begin(), bad.end(), [&](const std::string& b) { return is_under(b, field_path); });
  }
  return readable;
}

// Whether a rule's fields are all well-typed: the rules name every field they read beyond the
// layout's, and one that read a refused field (as its default) is not reported.
bool fields_readable(const Reader& read, const std::vector<std::string>& bad, const std::string& fields) {
  for (const std::string& field : split_fields(fields))
    if (read.bad(field) ||
        std::any_of(bad.begin(), bad.end(), [&](const std::string& b) { return is_under(b, field); }))
      return false;
  return true;
}

// Rules across blocks: the learning rates, the result window against the steps and the
// workload, the dataset's row length against the workload's.
// How two paths lie: the same, one inside the other, or apart. Compared as absolute paths with
// the symbolic links of their existing parts resolved, so "runs/../rows" is "rows".
enum class PathOverlap { apart, same, first_inside, second_inside };

PathOverlap path_overlap(const std::string& first, const std::string& second) {
  std::error_code ignored;
  const std::filesystem::path a =
      std::filesystem::weakly_canonical(std::filesystem::absolute(first), ignored);
  const std::filesystem::path b =
      std::filesystem::weakly_canonical(std::filesystem::absolute(second), ignored);
  auto ai = a.begin(), bi = b.begin();
  for (; ai != a.end() && bi != b.end() && !ai->empty() && !bi->empty(); ++ai, ++bi)
    if (*ai != *bi) return PathOverlap::apart;
  const bool a_done = ai == a.end() || ai->empty(), b_done = bi == b.end() || bi->empty();
  if (a_done && b_done) return PathOverlap::same;
  return a_done ? PathOverlap::second_inside : PathOverlap::first_inside;
}

// A run writes into train.output_dir (checkpoints, final/, metrics.jsonl, result.yaml): a
// folder it reads from must not be it, hold it, or lie inside it, or a run could replace its
// own data or initial weights. Refused before anything is written.
void check_output_dir_apart(const Reader& read, const TrainSpec& train, const LaterViolations& report) {
  const std::pair<const char*, const std::string*> inputs[] = {
      {"train.data.path", &train.data_path},
      {"train.eval.data.path", &train.eval_path},
      {"train.init.hf_checkpoint", &train.init_hf_checkpoint},
      {"train.lora.init.adapter", &train.lora.init_adapter}};
  for (const auto& [field, path] : inputs) {
    if (path->empty() || train.output_dir.empty() || read.bad(field) || read.bad("train.output_dir"))
      continue;
    const PathOverlap overlap = path_overlap(train.output_dir, *path);
    if (overlap == PathOverlap::apart) continue;
    const std::string how = overlap == PathOverlap::same           ? "is"
                            : overlap == PathOverlap::first_inside ? "lies inside"
                                                                   : "holds";
    report.add(
        std::string("train.output_dir, ") + field,
        "found output_dir " + train.output_dir + " that " + how + " " + field + " " + *path +
            ", expected folders apart (a run writes its checkpoints, final/ and logs into output_dir)");
  }
}

void check_across_blocks(const Reader& read, const Recipe& recipe, bool has_train,
                         const LaterViolations& report) {
  const TrainSpec& train = recipe.train;
  const WorkloadSpec& workload = recipe.workload;
  if (has_train && !read.bad("train.optimizer") && train.optimizer.min_lr > train.optimizer.lr)
    report.add("train.optimizer.min_lr, train.optimizer.lr",
               "found min_lr " + format_value(train.optimizer.min_lr) +
                   ", expected at most lr = " + format_value(train.optimizer.lr));
  if (!read.bad("result.window")) {
    if (recipe.window_first > recipe.window_last)
      report.add("result.window", "found [" + std::to_string(recipe.window_first) + ", " +
                                      std::to_string(recipe.window_last) + "], expected first <= last");
    if (has_train && !read.bad("train.steps") && recipe.window_last > train.steps &&
        read.present("result.window"))
      report.add("result.window, train.steps",
                 "found last step " + std::to_string(recipe.window_last) +
                     ", expected at most train.steps = " + std::to_string(train.steps));
    std::optional<int64_t> steps_per_run = read.integer("result.steps_per_run");
    if (steps_per_run && recipe.window_last > *steps_per_run)
      report.add("result.window, result.steps_per_run",
                 "found last step " + std::to_string(recipe.window_last) +
                     ", expected at most steps_per_run = " + std::to_string(*steps_per_run));
    std::optional<int64_t> window_tokens = read.integer("result.window_tokens");
    const int64_t expected_tokens =
        (recipe.window_last - recipe.window_first + 1) * workload.global_batch * workload.row_tokens;
    if (window_tokens && recipe.window_first <= recipe.window_last && *window_tokens != expected_tokens)
      report.add("result.window_tokens, result.window, workload.global_batch, workload.row_tokens",
                 "found " + std::to_string(*window_tokens) +
                     ", expected (last - first + 1) · global_batch · row_tokens = " +
                     std::to_string(expected_tokens));
  }
  if (has_train) check_output_dir_apart(read, train, report);
  std::optional<int64_t> build_row_tokens = read.integer("workload.dataset.build.row_tokens");
  if (build_row_tokens && !read.bad("workload.row_tokens") && *build_row_tokens != workload.row_tokens)
    report.add("workload.dataset.build.row_tokens, workload.row_tokens",
               "found " + std::to_string(*build_row_tokens) +
                   ", expected workload.row_tokens = " + std::to_string(workload.row_tokens));
}

// Reads, overrides and checks the recipe: the schema first, then the typed values (a field
// the schema refused reads as absent), the architecture, the recipe's rules and the rules
// across blocks.
Loaded recipe_parse(const std::string& path, const std::vector<std::string>& overrides, RecipeUse use) {
  Loaded loaded;
  std::vector<Violation>& out = loaded.violations;
  Recipe& recipe = loaded.recipe;
  recipe.path = path;
  std::optional<YAML::Node> read_document = recipe_read_document(path, &out);
  if (!read_document) return loaded;
  YAML::Node document = *read_document;

  const SchemaField& schema = recipe_schema();
  std::vector<std::string> overridden;
  for (const std::string& set : overrides) apply_override(document, schema, set, path, &overridden, &out);

  SchemaContext context;
  context.file = path;
  context.run = use == RecipeUse::train;
  context.overridden = overridden;
  context.status = document_status(document, schema);
  const size_t schema_begin = out.size();
  schema_check(document, schema, context, &out);
  std::vector<std::string> bad;
  for (size_t i = schema_begin; i < out.size(); ++i)
    for (const std::string& field : split_fields(out[i].field)) bad.push_back(field);
  recipe.document = document;
  recipe.overridden = overridden;
  if (!document.IsMap()) return loaded;

  const Reader read(document, schema, bad);
  const LaterViolations report(path, document, overridden, &out);
  recipe.schema_version = static_cast<int>(read.integer("schema_version").value_or(1));
  recipe.model = read.text("model").value_or("");
  recipe.status = context.status;
  read_workload_and_layout(read, &recipe);
  read_gpu_and_result(read, &recipe);
  const bool has_train = read.is_map("train");
  if (has_train) read_train(read, path, &recipe.train);

  const bool has_model = resolve_model_config(read, use, report, &recipe);
  // The recipe's rules once the layout's fields are well-typed, each reported where its own
  // fields are; without a model, those that need none. The machine's capabilities are not
  // known here: train_check_supported adds them.
  if (layout_fields_readable(read, bad))
    for (const Violation& v : recipe_rules(recipe, has_model ? &recipe.model_config : nullptr, {}))
      if (fields_readable(read, bad, v.field)) report.add(v.field, v.what);
  check_across_blocks(read, recipe, has_train, report);
  return loaded;
}

}  // namespace

std::string Violation::to_string() const {
  std::string text = file;
  if (line > 0) text += ":" + std::to_string(line);
  if (!field.empty()) text += ": " + field;
  return text + ": " + what;
}

std::string violations_to_string(const std::vector<Violation>& violations) {
  std::string text;
  for (size_t i = 0; i < violations.size(); ++i) text += (i ? "\n" : "") + violations[i].to_string();
  return text;
}

Recipe recipe_load(const std::string& path, const std::vector<std::string>& overrides, RecipeUse use) {
  Loaded loaded = recipe_parse(path, overrides, use);
  if (!loaded.violations.empty()) throw InputError(violations_to_string(loaded.violations));
  return loaded.recipe;
}

void recipe_refuse(const Recipe& recipe, const std::vector<Violation>& violations) {
  if (violations.empty()) return;
  std::vector<Violation> located;
  const LaterViolations report(recipe.path, recipe.document, recipe.overridden, &located);
  for (const Violation& v : violations) report.add(v.field, v.what);
  throw InputError(violations_to_string(located));
}

std::vector<Violation> recipe_validate(const std::string& path) {
  return recipe_parse(path, {}, RecipeUse::inspect).violations;
}

namespace {

void emit_node(YAML::Emitter& out, const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) {
    out << YAML::Null;
  } else if (node.IsScalar()) {
    const std::string& text = node.Scalar();
    if (text.find('\n') != std::string::npos)
      out << YAML::Literal << text;
    else if (node.Tag() == "!")
      out << YAML::SingleQuoted << text;
    else
      out << text;
  } else if (node.IsSequence()) {
    const bool flat = std::all_of(node.begin(), node.end(), [](const YAML::Node& item) {
      return item.IsScalar() && item.Scalar().find('\n') == std::string::npos;
    });
    out << (flat ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
    for (const auto& item : node) emit_node(out, item);
    out << YAML::EndSeq;
  } else {
    out << YAML::BeginMap;
    for (const auto& item : node) {
      out << YAML::Key;
      emit_node(out, item.first);
      out << YAML::Value;
      emit_node(out, item.second);
    }
    out << YAML::EndMap;
  }
}

}  // namespace

namespace {

void move_paths(YAML::Node node, const SchemaField& field, const std::filesystem::path& from,
                const std::filesystem::path& to) {
  namespace fs = std::filesystem;
  if (node.IsMap() && field.type == "map") {
    for (auto item : node)
      if (const SchemaField* child = field.field(item.first.Scalar()))
        move_paths(item.second, *child, from, to);
  } else if (node.IsScalar() && field.format == "path" && !node.Scalar().empty() &&
             fs::path(node.Scalar()).is_relative()) {
    const fs::path target = (from / node.Scalar()).lexically_normal();
    const fs::path moved = target.lexically_relative(to);
    // Absolute where the two folders share nothing but the root: "../../../work/x" says less.
    const auto up =
        std::count_if(moved.begin(), moved.end(), [](const fs::path& part) { return part == ".."; });
    const fs::path to_parts = to.relative_path();
    const auto depth = std::distance(to_parts.begin(), to_parts.end());
    node = (moved.empty() || up >= depth ? target : moved).string();
  }
}

}  // namespace

YAML::Node recipe_document_moved(const YAML::Node& document, const std::string& from_dir,
                                 const std::string& to_dir) {
  namespace fs = std::filesystem;
  YAML::Node moved = YAML::Clone(document);
  const SchemaField& schema = recipe_schema();
  move_paths(moved, schema, fs::absolute(from_dir.empty() ? "." : from_dir).lexically_normal(),
             fs::absolute(to_dir).lexically_normal());
  return moved;
}

std::string recipe_document_to_yaml(const YAML::Node& document) {
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  emit_node(out, document);
  return std::string(out.c_str()) + "\n";
}

LoraConfig lora_config_of(const LoraSpec& spec) {
  LoraConfig lora;
  if (!spec.enabled()) return lora;
  lora.rank = spec.rank;
  lora.alpha = spec.alpha;
  lora.rslora = spec.rslora;
  lora.dropout = spec.dropout;
  for (const std::string& module : spec.targets) {
    LoraTarget target{};
    const bool known = lora_target_parse(module, &target);
    LOOM_ASSERT(known, "the schema's LoRA targets");
    lora.targets[static_cast<size_t>(target)] = true;
  }
  return lora;
}

}  // namespace loom
