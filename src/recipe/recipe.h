// Recipe: the typed recipe the trainer reads (docs/interface.md, schema/recipe.schema.yaml).
//
// recipe_load reads a recipe file, applies `--set a.b=value` overrides, checks it against
// the schema (every field's type, enum and bounds; required fields for its status; unknown
// keys, with a "did you mean"), resolves the model's architecture (built-in Qwen3 size or
// the init's config.json) and checks the recipe's rules (rules.h). It reports
// every violation at once, one per line: "FILE:LINE: field.path: found X, expected Y".
//
// Defaults of optional fields are the schema's `default:` entries; the member initializers
// below are the same values. The train.optimizer defaults are the seed recipe's run block:
// lr 1e-5, min_lr 1e-6, cosine decay, warmup 0.1, weight decay 0.1, betas 0.9 / 0.98,
// plus Megatron's eps 1e-8 and clip 1.0.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/lora.h"
#include "recipe/violation.h"

namespace loom {

struct OptimizerSpec {
  double lr = 1e-5, min_lr = 1e-6, warmup_fraction = 0.1, weight_decay = 0.1, beta1 = 0.9, beta2 = 0.98,
         eps = 1e-8, clip_grad = 1.0;  // clip_grad 0: no clipping
  std::string decay = "cosine";        // cosine | linear | constant
};

// train.lora: LoRA over a frozen base (model/lora.h); rank 0 when the recipe has none (full
// fine-tuning).
struct LoraSpec {
  int64_t rank = 0;
  double alpha = 0, dropout = 0;
  std::vector<std::string> targets;  // HF module names, the recipe's order
  bool rslora = false, merge = false;
  std::string init_adapter;  // a PEFT adapter folder (resolved); empty: PEFT's default init
  bool enabled() const { return rank > 0; }
};

// train.lora as the model's LoraConfig (disabled when the recipe has none).
LoraConfig lora_config_of(const LoraSpec& spec);

struct TrainSpec {
  std::string device = "cuda";  // cuda | cpu
  uint64_t seed = 1234;
  // Exactly one is set, resolved against the recipe's folder: an HF checkpoint folder, or
  // the config.json of a random init.
  std::string init_hf_checkpoint;
  std::string init_random_config;
  std::string data_path;  // a row store folder or a .jsonl of rows (resolved)
  int64_t steps = 0;
  OptimizerSpec optimizer;
  LoraSpec lora;
  std::string output_dir;                             // resolved
  int64_t checkpoint_every = 0, checkpoint_keep = 1;  // every 0: no periodic checkpoints
  bool checkpoint_keep_best = false;                  // also keep the lowest eval loss's
  // train.eval: held-out rows (resolved; empty: no evaluation), evaluated every eval_every
  // steps on the first eval_max_rows rows (0: all).
  std::string eval_path;
  int64_t eval_every = 0, eval_max_rows = 0;
  // train.reference: the run this one is checked against (resolved; empty: none).
  std::string reference_recipe, reference_metrics;
  std::string on_nonfinite = "stop";  // stop | skip_step (train/nonfinite.h)
  int64_t max_consecutive_skips = 3;
  // How long a rank waits for the others: the rendezvous, every collective (parallel/comm.h).
  double comm_timeout_s = 300;
  // With FP8 linear layers: the steps whose casts are counted (step 1 and every this many;
  // 0: none), model/linear.h Fp8Stats.
  int64_t fp8_stats_every = 100;
};

// workload.fp8: the FP8 linear layers' settings (model/linear.h).
struct Fp8Spec {
  bool set = false;                // workload.fp8 is not null
  std::string scaling = "tensor";  // tensor | block
  std::string gradients = "e5m2";  // e5m2 | e4m3
  int64_t bf16_first_layers = 0, bf16_last_layers = 0;
};

// The load-balancing loss of a mixture of experts (docs/numerics.md, "Mixture of experts").
struct MoeAuxLossSpec {
  std::string kind;  // "" (workload.moe.aux_loss null: none) | hf | megatron
  double coef = 0.0;
};

struct WorkloadSpec {
  int64_t row_tokens = 0, global_batch = 0;  // tokens per row; rows per optimizer step
  std::string precision = "bf16";            // bf16 | fp32 | fp8
  Fp8Spec fp8;
  bool moe_set = false;  // workload.moe is not null
  MoeAuxLossSpec moe_aux_loss;
};

// Activation recompute, Megatron's --recompute-granularity/-method/-num-layers.
struct RecomputeSpec {
  bool enabled = false;              // layout.recompute is not null
  std::string granularity = "full";  // full | selective
  std::string method = "uniform";    // uniform | block (full only)
  int64_t num_layers = 1;
};

// Optimizer offload to the CPU, Megatron's --optimizer-cpu-offload.
struct OffloadSpec {
  bool enabled = false;  // layout.offload is not null
  double optimizer_fraction = 1.0;
  bool overlap = true;
};

struct LayoutSpec {
  int64_t tp = 1, pp = 1, cp = 1, dp = 1;
  bool sequence_parallel = false;
  int64_t max_tokens_per_gpu = 0;
  std::vector<int64_t> layer_split;  // layers per PP stage; empty: even split
  RecomputeSpec recompute;
  OffloadSpec offload;
  // layout.activation_offload: full recompute's chunk inputs in host memory (ops/activation_offload.h).
  bool activation_offload = false;
  int64_t vpp = 1, ep = 1, etp = 1;
  int64_t rows_per_microbatch = 0;     // 0: not given
  std::string dispatcher;              // "" for null (dense)
  std::string cp_comm = "all_gather";  // context parallelism's form: all_gather | ring

  int64_t world_size() const { return tp * pp * cp * dp; }
};

struct Recipe {
  std::string path;  // the recipe file as given
  int schema_version = 1;
  std::string model;   // as written (its HF name)
  std::string status;  // draft | measured | verified
  WorkloadSpec workload;
  LayoutSpec layout;
  int64_t gpu_count = 0;        // gpu.count; 0 when the recipe has no gpu block
  std::string gpu_instance;     // gpu.instance; "" when not given
  double usd_per_gpu_hour = 0;  // gpu.usd_per_gpu_hour, the price table's override; 0 when not given
  int64_t window_first = 5, window_last = 19;  // result.window, 1-based, inclusive
  TrainSpec train;
  // The architecture: the init's config.json when there is one, else the built-in size.
  ModelConfig model_config;
  // The whole recipe after --set overrides, as written (relative paths unresolved, defaults
  // not filled in), for result.yaml.
  YAML::Node document;
  // The field paths --set wrote (their violations have no line in the file).
  std::vector<std::string> overridden;
};

// What the recipe is loaded for. train: the train block is required and the init's
// config.json must be readable. inspect (plan, render): neither; a built-in model name is
// enough to check the layout.
enum class RecipeUse { train, inspect };

// Loads, overrides, validates. `overrides` are "a.b=value": the value is parsed as YAML
// (`layout.tp=8` an integer, `train.device=cpu` a string, `layout.layer_split=[30,34]` a
// list, `null` null; null on a field that cannot be null removes it). A path that names no
// field of the schema is an error naming it. Throws one InputError listing every violation.
Recipe recipe_load(const std::string& path, const std::vector<std::string>& overrides,
                   RecipeUse use = RecipeUse::train);

// Throws one InputError listing `violations` (recipe_rules', naming fields alone) as
// recipe_load reports its own: each with the recipe's file and its first field's line.
// Returns when there are none.
void recipe_refuse(const Recipe& recipe, const std::vector<Violation>& violations);

// Every violation of the recipe file as written, for `loom recipe validate`: the schema for
// its status and the recipe's rules (rules.h); the train block is checked when present but not
// required. Empty when it is valid. Never throws InputError: an unreadable file or bad
// YAML is itself a violation.
std::vector<Violation> recipe_validate(const std::string& path);

// The document to write into `to_dir` (result.yaml into output_dir): its relative path
// fields (the schema's format: path), which resolve against `from_dir`, rewritten relative
// to `to_dir`, so the copy reads the same files. Absolute paths are kept.
YAML::Node recipe_document_moved(const YAML::Node& document, const std::string& from_dir,
                                 const std::string& to_dir);

// A recipe document as YAML text that reads back the same: scalars quoted in the source
// stay quoted (cuda: '12.9' remains a string), multi-line strings become literal blocks,
// null is written `null`, lists of scalars are written in flow style ([5, 19]). Comments
// and the source's line breaks inside long scalars are not kept.
std::string recipe_document_to_yaml(const YAML::Node& document);

}  // namespace loom
