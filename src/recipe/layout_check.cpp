#include "recipe/layout_check.h"

#include <string>

#include "core/error.h"
#include "model/shard_spec.h"

namespace loom {
namespace {

std::string str(int64_t value) {
  return std::to_string(value);
}

}  // namespace

std::vector<Violation> layout_check(const WorkloadSpec& workload, const LayoutSpec& layout,
                                    const Qwen3Config& model, int64_t gpu_count) {
  std::vector<Violation> out;
  auto add = [&](const std::string& field, const std::string& what) {
    out.push_back(Violation{"", 0, field, what});
  };
  const int64_t tp = layout.tp, pp = layout.pp, cp = layout.cp, dp = layout.dp;
  const int64_t row_tokens = workload.row_tokens;
  // The rules below divide by these; the schema's bounds (>= 1) come first.
  LOOM_ASSERT(model.num_attention_heads > 0 && model.num_key_value_heads > 0 && model.num_hidden_layers > 0 &&
                  model.intermediate_size > 0 && model.vocab_size > 0,
              "layout_check needs a model config");
  for (int64_t size : {tp, pp, cp, dp, layout.vpp}) {
    if (size < 1) {
      add("layout", "found a size below 1 (tp " + str(tp) + ", pp " + str(pp) + ", cp " + str(cp) + ", dp " +
                        str(dp) + ", vpp " + str(layout.vpp) + "), expected sizes >= 1");
      return out;
    }
  }

  if (gpu_count > 0 && layout.world_size() != gpu_count)
    add("layout.tp, layout.pp, layout.cp, layout.dp, gpu.count",
        "found tp·pp·cp·dp = " + str(tp) + "·" + str(pp) + "·" + str(cp) + "·" + str(dp) + " = " +
            str(layout.world_size()) + ", expected gpu.count = " + str(gpu_count));

  // The rules of the model's split over TP and PP: the sharding spec's, the engine's own.
  for (const ShardViolation& v : shard_layout_check(
           model, ShardLayout{tp, pp, layout.sequence_parallel, layout.layer_split, layout.vpp}))
    add(v.field, v.what);

  if (layout.max_tokens_per_gpu * cp < row_tokens)
    add("layout.max_tokens_per_gpu, workload.row_tokens",
        "found max_tokens_per_gpu " + str(layout.max_tokens_per_gpu) +
            (cp > 1 ? " · cp " + str(cp) + " = " + str(layout.max_tokens_per_gpu * cp) : "") +
            ", expected at least row_tokens = " + str(row_tokens) + " (a micro-batch holds whole rows)");
  if (layout.rows_per_microbatch > 0 &&
      layout.rows_per_microbatch * row_tokens > layout.max_tokens_per_gpu * cp)
    add("layout.rows_per_microbatch, layout.max_tokens_per_gpu",
        "found " + str(layout.rows_per_microbatch) + " rows of " + str(row_tokens) + " tokens = " +
            str(layout.rows_per_microbatch * row_tokens) + " tokens, expected at most max_tokens_per_gpu" +
            (cp > 1 ? " · cp" : "") + " = " + str(layout.max_tokens_per_gpu * cp));

  if (layout.sequence_parallel && tp == 1)
    add("layout.sequence_parallel, layout.tp", "found sequence_parallel true with tp = 1, expected tp > 1");
  if (layout.sequence_parallel && tp > 1 && row_tokens % tp != 0)
    add("workload.row_tokens, layout.sequence_parallel, layout.tp",
        "found " + str(row_tokens) + ", expected a multiple of tp = " + str(tp) +
            " (sequence parallelism splits each row over the TP ranks)");
  if (cp > 1 && row_tokens % (2 * cp) != 0)
    add("workload.row_tokens, layout.cp", "found " + str(row_tokens) +
                                              ", expected a multiple of 2·cp = " + str(2 * cp) +
                                              " (each CP rank takes two of 2·cp chunks of a row)");

  // Block-scaled FP8 counts its blocks within each TP rank's shard (model/linear.h): they are
  // one rank's blocks of the whole tensors only where each shard of a linear layer's sharded
  // dimension is whole 128-blocks (q and kv heads, the FFN). Else TP would quantize otherwise.
  if (workload.precision == "fp8" && workload.fp8.scaling == "block" && tp > 1 &&
      model.num_attention_heads % tp == 0 && model.intermediate_size % tp == 0) {
    const int64_t kv_heads = model.num_key_value_heads >= tp ? model.num_key_value_heads / tp : 1;
    const struct {
      const char* what;
      int64_t width;
    } shards[] = {{"q heads · head_dim", model.num_attention_heads / tp * model.head_dim},
                  {"kv heads · head_dim", kv_heads * model.head_dim},
                  {"intermediate_size", model.intermediate_size / tp}};
    for (const auto& shard : shards)
      if (shard.width % 128 != 0)
        add("workload.fp8.scaling, layout.tp",
            "found block scaling with a TP rank's " + std::string(shard.what) + " = " + str(shard.width) +
                ", expected a multiple of 128 (blocks of 128 must not straddle TP shards; tensor scaling "
                "has no such rule)");
  }

  if (workload.global_batch % dp != 0)
    add("workload.global_batch, layout.dp", "found " + str(workload.global_batch) +
                                                " rows, expected a multiple of dp = " + str(dp) +
                                                " (each DP rank takes an equal share)");

  if (layout.ep != 1)
    add("layout.ep", "found " + str(layout.ep) + ", expected 1 (Qwen3 dense has no experts)");
  if (layout.etp != 1)
    add("layout.etp", "found " + str(layout.etp) + ", expected 1 (Qwen3 dense has no experts)");
  if (!layout.dispatcher.empty())
    add("layout.dispatcher", "found " + layout.dispatcher + ", expected null (Qwen3 dense has no experts)");
  return out;
}

}  // namespace loom
