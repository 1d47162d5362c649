#include "recipe/rules.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/fp8.h"
#include "model/lora.h"
#include "model/shard_spec.h"

namespace loom {
namespace {

std::string str(int64_t value) {
  return std::to_string(value);
}

class Rules {
 public:
  void add(const std::string& field, const std::string& what) {
    out_.push_back(Violation{"", 0, field, what});
  }
  std::vector<Violation> take() { return std::move(out_); }

 private:
  std::vector<Violation> out_;
};

void layout_rules(const Recipe& recipe, const ModelConfig* config, Rules& rules) {
  const WorkloadSpec& workload = recipe.workload;
  const LayoutSpec& layout = recipe.layout;
  const int64_t tp = layout.tp, pp = layout.pp, cp = layout.cp, dp = layout.dp;
  const int64_t row_tokens = workload.row_tokens;
  if (recipe.gpu_count > 0 && layout.world_size() != recipe.gpu_count)
    rules.add("layout.tp, layout.pp, layout.cp, layout.dp, gpu.count",
              "found tp·pp·cp·dp = " + str(tp) + "·" + str(pp) + "·" + str(cp) + "·" + str(dp) + " = " +
                  str(layout.world_size()) + ", expected gpu.count = " + str(recipe.gpu_count));

  // The rules of the model's split over TP and PP: the sharding spec's, the engine's own.
  if (config)
    for (const ShardViolation& v : shard_layout_check(
             *config,
             ShardLayout{tp, pp, layout.sequence_parallel, layout.layer_split, layout.vpp, layout.ep}))
      rules.add(v.field, v.what);

  if (layout.max_tokens_per_gpu * cp < row_tokens)
    rules.add("layout.max_tokens_per_gpu, workload.row_tokens",
              "found max_tokens_per_gpu " + str(layout.max_tokens_per_gpu) +
                  (cp > 1 ? " · cp " + str(cp) + " = " + str(layout.max_tokens_per_gpu * cp) : "") +
                  ", expected at least row_tokens = " + str(row_tokens) +
                  " (a micro-batch holds whole rows)");
  if (layout.rows_per_microbatch > 0 &&
      layout.rows_per_microbatch * row_tokens > layout.max_tokens_per_gpu * cp)
    rules.add("layout.rows_per_microbatch, layout.max_tokens_per_gpu",
              "found " + str(layout.rows_per_microbatch) + " rows of " + str(row_tokens) +
                  " tokens = " + str(layout.rows_per_microbatch * row_tokens) +
                  " tokens, expected at most max_tokens_per_gpu" + (cp > 1 ? " · cp" : "") + " = " +
                  str(layout.max_tokens_per_gpu * cp));

  if (layout.sequence_parallel && tp == 1)
    rules.add("layout.sequence_parallel, layout.tp",
              "found sequence_parallel true with tp = 1, expected tp > 1");
  if (layout.sequence_parallel && tp > 1 && row_tokens % tp != 0)
    rules.add("workload.row_tokens, layout.sequence_parallel, layout.tp",
              "found " + str(row_tokens) + ", expected a multiple of tp = " + str(tp) +
                  " (sequence parallelism splits each row over the TP ranks)");
  if (cp > 1 && row_tokens % (2 * cp) != 0)
    rules.add("workload.row_tokens, layout.cp", "found " + str(row_tokens) +
                                                    ", expected a multiple of 2·cp = " + str(2 * cp) +
                                                    " (each CP rank takes two of 2·cp chunks of a row)");
  if (layout.activation_offload && (!layout.recompute.enabled || layout.recompute.granularity != "full"))
    rules.add(
        "layout.activation_offload, layout.recompute.granularity",
        "found activation_offload true with " +
            (layout.recompute.enabled ? "granularity " + layout.recompute.granularity : "recompute null") +
            ", expected granularity full (what it offloads are the inputs full recompute keeps)");
  if (layout.activation_offload && pp > 1)
    rules.add("layout.activation_offload, layout.pp",
              "found activation_offload true with pp = " + str(pp) +
                  ", expected pp = 1 (its device slots serve one micro-batch at a time; a pipeline keeps "
                  "several in flight)");
  if (cp > 1 && layout.ep > 1)
    rules.add("layout.cp, layout.ep",
              "found cp = " + str(cp) + " with ep = " + str(layout.ep) +
                  ", expected ep = 1 (context parallel beside expert parallel is not implemented yet)");

  if (workload.global_batch % dp != 0)
    rules.add("workload.global_batch, layout.dp", "found " + str(workload.global_batch) +
                                                      " rows, expected a multiple of dp = " + str(dp) +
                                                      " (each DP rank takes an equal share)");

  const bool experts = config && config->num_experts > 0;
  // ep's rules against the model (a divisor of the experts, a dense model none) are the
  // sharding spec's, above; against the layout: EP ranks are carved out of the DP ranks.
  if (experts && layout.ep > 1 && dp % layout.ep != 0)
    rules.add("layout.ep, layout.dp", "found ep = " + str(layout.ep) + ", expected a divisor of dp = " +
                                          str(dp) + " (EP ranks are carved out of the DP ranks)");
  const std::string no_etp =
      experts ? " (experts split over TP ranks are not implemented yet)" : " (a dense model has no experts)";
  if (layout.etp != 1) rules.add("layout.etp", "found " + str(layout.etp) + ", expected 1" + no_etp);
  if (!layout.dispatcher.empty())
    rules.add("layout.dispatcher",
              "found " + layout.dispatcher + ", expected null" +
                  (experts ? " (loom's dispatch is its own all-to-all, docs/parallel.md)" : no_etp));

  if (config && !experts && workload.moe_set)
    rules.add("workload.moe",
              "found a workload.moe block for a dense model (its config has no experts), "
              "expected null");
  if (workload.moe_aux_loss.kind == "hf" && pp > 1)
    rules.add("workload.moe.aux_loss.kind, layout.pp",
              "found hf with pp = " + str(pp) +
                  ", expected pp = 1 or kind megatron (transformers' loss multiplies every sparse layer's "
                  "routed tokens by every layer's router probabilities, which a pipeline stage does not see; "
                  "megatron's is per layer)");
}

void device_rules(const Recipe& recipe, const RuleCapabilities& capabilities, Rules& rules) {
  const std::string& precision = recipe.workload.precision;
  if (recipe.train.device == "cpu" && precision != "fp32" && precision != "fp8")
    rules.add(
        "workload.precision, train.device",
        "found " + precision +
            " on train.device cpu, expected fp32 (the CPU reference computes in fp32) or fp8 (fp32 with FP8 "
            "linear layers)");
  if (recipe.train.device == "cuda") {
    // Judged where the recipe runs (`loom train` knows the machine): `loom plan` prices the
    // ring on GPUs, as a layout to build toward.
    if (capabilities.cuda_engine.has_value() && recipe.layout.cp > 1 && recipe.layout.cp_comm == "ring")
      rules.add(
          "layout.cp_comm, train.device",
          "found ring on train.device cuda, expected all_gather (the ring form's block attention has no "
          "CUDA kernel yet)");
    if (capabilities.cuda_engine == false)
      rules.add("train.device",
                "cuda, but " + capabilities.cuda_engine_why + " (expected train.device: cpu here)");
    if (precision != "bf16" && precision != "fp8")
      rules.add(
          "workload.precision, train.device",
          "found " + precision +
              " on train.device cuda, expected bf16 (the GPU trains in bf16) or fp8 (bf16 with FP8 linear "
              "layers)");
  }
  if (recipe.workload.fp8.set && precision != "fp8")
    rules.add("workload.fp8, workload.precision",
              "found a workload.fp8 block with workload.precision \"" + precision +
                  "\", expected workload.precision: fp8 (or workload.fp8: null)");
}

// "a TP rank's hidden_size = 100 and intermediate_size = 200".
std::string widths_text(const std::vector<GemmWidth>& widths) {
  std::string text = "a TP rank's ";
  for (size_t i = 0; i < widths.size(); ++i)
    text += (i == 0                   ? ""
             : i + 1 == widths.size() ? " and "
                                      : ", ") +
            widths[i].what + " = " + str(widths[i].width);
  return text;
}

// The GEMMs' n and k that are not multiples of `multiple`, each named once, leaving out
// those named in `skip`.
std::vector<GemmWidth> off_widths(const std::vector<RankGemm>& gemms, int64_t multiple,
                                  const std::vector<GemmWidth>& skip) {
  std::vector<GemmWidth> out;
  const auto named = [](const std::vector<GemmWidth>& list, const std::string& what) {
    return std::any_of(list.begin(), list.end(), [&](const GemmWidth& w) { return w.what == what; });
  };
  for (const RankGemm& gemm : gemms)
    for (const GemmWidth& w : {gemm.n, gemm.k})
      if (w.width % multiple != 0 && !named(out, w.what) && !named(skip, w.what)) out.push_back(w);
  return out;
}

void fp8_rules(const Recipe& recipe, const ModelConfig& config, Rules& rules) {
  const WorkloadSpec& workload = recipe.workload;
  if (workload.precision != "fp8") return;
  const int64_t layers_kept = workload.fp8.bf16_first_layers + workload.fp8.bf16_last_layers;
  if (layers_kept >= config.num_hidden_layers) {
    rules.add("workload.fp8.bf16_first_layers, workload.fp8.bf16_last_layers",
              "found bf16_first_layers + bf16_last_layers = " + str(layers_kept) +
                  ", keeping every decoder layer in bf16; expected fewer than the model's " +
                  str(config.num_hidden_layers) + " layers");
    return;  // no layer has FP8 GEMMs
  }
  const int64_t tp = recipe.layout.tp;
  const int64_t kv = config.num_key_value_heads;
  // A TP rank's widths exist only where tp splits the model (shard_layout_check says so).
  if (config.num_attention_heads % tp != 0 || (kv % tp != 0 && tp % kv != 0) ||
      config.intermediate_size % tp != 0)
    return;
  const std::vector<RankGemm> gemms = shard_gemms(config, tp);
  const bool cuda = recipe.train.device == "cuda";
  const std::string tp_field = tp > 1 ? ", layout.tp" : "";

  if (workload.fp8.scaling == "tensor" && cuda) {
    const std::vector<GemmWidth> off = off_widths(gemms, 16, {});
    if (!off.empty())
      rules.add("workload.precision, train.device" + tp_field,
                "found FP8 linear layers on train.device cuda with " + widths_text(off) +
                    ", expected multiples of 16 (cuBLASLt's FP8 GEMMs need n and k in multiples of 16: the "
                    "forward, input-gradient and weight-gradient GEMMs of qkv, o_proj, gate_up and down), or "
                    "workload.precision: bf16 (train.device cpu takes any width)");
  }
  if (workload.fp8.scaling != "block") return;
  // Block scaling counts its blocks within each TP rank's shard (model/linear.h): they are one
  // rank's blocks of the whole tensors only where each piece of a shard is whole 128-blocks.
  // Else TP would quantize otherwise than one rank.
  std::vector<GemmWidth> straddling;
  if (tp > 1)
    for (const RankGemm& gemm : gemms)
      for (const GemmWidth& piece : gemm.sharded)
        if (piece.width % kFp8BlockSize != 0 &&
            std::none_of(straddling.begin(), straddling.end(),
                         [&](const GemmWidth& w) { return w.what == piece.what; })) {
          straddling.push_back(piece);
          rules.add("workload.fp8.scaling, layout.tp",
                    "found block scaling with " + widths_text({piece}) +
                        ", expected a multiple of 128 (blocks of 128 must not straddle TP shards; tensor "
                        "scaling has no such rule)");
        }
  if (!cuda) return;
  std::vector<GemmWidth> off = off_widths(gemms, kFp8BlockSize, straddling);
  std::string found = off.empty() ? "" : widths_text(off);
  if (workload.row_tokens % kFp8BlockSize != 0)
    found +=
        (found.empty() ? "" : " and ") + std::string("workload.row_tokens = ") + str(workload.row_tokens);
  if (!found.empty())
    rules.add(
        "workload.fp8.scaling, train.device" + tp_field,
        "found block scaling on train.device cuda with " + found +
            ", expected multiples of 128 (cuBLASLt's block-scaled FP8 GEMMs and the block casts take whole "
            "128-blocks: every n and k of the linear layers' GEMMs, and the forward's tokens), or "
            "workload.fp8.scaling: tensor (train.device cpu takes a partial last block)");
}

// LoRA's width of a target: the adapter's rank may not exceed its module's narrower side.
int64_t lora_module_width(const ModelConfig& config, LoraTarget target) {
  const ParamKind layer = lora_layer_of(target);
  const int64_t in = layer == ParamKind::o_proj ? config.q_dim()
                     : layer == ParamKind::down ? config.intermediate_size
                                                : config.hidden_size;
  return std::min(in, lora_target_rows(config, target));
}

void lora_rules(const Recipe& recipe, const ModelConfig* config, Rules& rules) {
  const LoraSpec& lora = recipe.train.lora;
  if (!lora.enabled()) return;
  if (lora.targets.empty())
    rules.add("train.lora.targets",
              "found an empty list, expected at least one of q_proj k_proj v_proj o_proj "
              "gate_proj up_proj down_proj");
  for (size_t i = 0; i < lora.targets.size(); ++i) {
    LoraTarget target{};
    if (!lora_target_parse(lora.targets[i], &target)) continue;  // the schema's enum says so
    if (std::find(lora.targets.begin(), lora.targets.begin() + static_cast<std::ptrdiff_t>(i),
                  lora.targets[i]) != lora.targets.begin() + static_cast<std::ptrdiff_t>(i))
      rules.add("train.lora.targets", "found " + lora.targets[i] + " twice, expected each module once");
    if (config && config->num_experts == 0 && lora.rank > lora_module_width(*config, target))
      rules.add("train.lora.rank, train.lora.targets", "found rank " + str(lora.rank) + " above " +
                                                           lora.targets[i] + "'s width " +
                                                           str(lora_module_width(*config, target)) +
                                                           ", expected at most the narrower side of every "
                                                           "targeted module");
  }
  if (!(lora.dropout >= 0 && lora.dropout < 1))
    rules.add("train.lora.dropout",
              "found " + std::to_string(lora.dropout) + ", expected a number in [0, 1)");
  if (config && config->num_experts > 0)
    rules.add("train.lora, model",
              "found a mixture of experts, expected a dense model (LoRA on experts is "
              "not implemented yet)");
}

void train_rules(const Recipe& recipe, Rules& rules) {
  if (recipe.train.checkpoint_keep_best && recipe.train.eval_path.empty())
    rules.add("train.checkpoint.keep_best, train.eval",
              "found keep_best true with no train.eval, expected a train.eval to rank the checkpoints by (or "
              "keep_best: false)");
}

}  // namespace

std::vector<Violation> recipe_rules(const Recipe& recipe, const ModelConfig* config,
                                    const RuleCapabilities& capabilities) {
  Rules rules;
  const LayoutSpec& layout = recipe.layout;
  // The rules below divide by these; the schema's bounds (>= 1) come first.
  for (int64_t size : {layout.tp, layout.pp, layout.cp, layout.dp, layout.vpp}) {
    if (size < 1) {
      rules.add("layout", "found a size below 1 (tp " + str(layout.tp) + ", pp " + str(layout.pp) + ", cp " +
                              str(layout.cp) + ", dp " + str(layout.dp) + ", vpp " + str(layout.vpp) +
                              "), expected sizes >= 1");
      return rules.take();
    }
  }
  if (config)
    LOOM_ASSERT(config->num_attention_heads > 0 && config->num_key_value_heads > 0 &&
                    config->num_hidden_layers > 0 && config->intermediate_size > 0 && config->vocab_size > 0,
                "recipe_rules needs a whole model config");
  layout_rules(recipe, config, rules);
  device_rules(recipe, capabilities, rules);
  if (config) fp8_rules(recipe, *config, rules);
  train_rules(recipe, rules);
  lora_rules(recipe, config, rules);
  return rules.take();
}

}  // namespace loom
