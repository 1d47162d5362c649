#include "model/shard_spec.h"

#include <numeric>
#include <utility>

#include "core/error.h"

namespace loom {
namespace {

std::string str(int64_t value) {
  return std::to_string(value);
}

void check_tp(const ModelConfig& model, int64_t tp, std::vector<ShardViolation>& out) {
  if (model.num_attention_heads % tp != 0)
    out.push_back({"layout.tp", "found " + str(tp) + ", expected a divisor of the model's " +
                                    str(model.num_attention_heads) + " attention heads"});
  const int64_t kv = model.num_key_value_heads;
  if (kv % tp != 0 && tp % kv != 0)
    out.push_back({"layout.tp", "found " + str(tp) + ", expected a divisor of the model's " + str(kv) +
                                    " KV heads or a multiple of it (KV heads replicated)"});
  if (model.intermediate_size % tp != 0)
    out.push_back({"layout.tp", "found " + str(tp) + ", expected a divisor of the model's FFN size " +
                                    str(model.intermediate_size)});
  if (model.vocab_size % tp != 0)
    out.push_back({"layout.tp", "found " + str(tp) + ", expected a divisor of the model's vocabulary of " +
                                    str(model.vocab_size)});
}

void check_layer_split(const ModelConfig& model, const ShardLayout& layout,
                       std::vector<ShardViolation>& out) {
  const int64_t layers = model.num_hidden_layers, pp = layout.pp, vpp = layout.vpp;
  if (layout.layer_split.empty()) {
    if (layers % (pp * vpp) != 0)
      out.push_back({vpp > 1 ? "layout.pp, layout.vpp, layout.layer_split" : "layout.pp, layout.layer_split",
                     "found pp" + std::string(vpp > 1 ? "·vpp = " + str(pp * vpp) : " = " + str(pp)) +
                         " with layer_split null, expected a divisor of the model's " + str(layers) +
                         " layers, or a layer_split"});
    return;
  }
  const std::vector<int64_t>& split = layout.layer_split;
  const int64_t stages = static_cast<int64_t>(split.size());
  const int64_t sum = std::accumulate(split.begin(), split.end(), int64_t{0});
  if (stages != pp)
    out.push_back(
        {"layout.layer_split, layout.pp",
         "found " + str(stages) + " entries, expected one per pipeline stage (pp = " + str(pp) + ")"});
  if (sum != layers)
    out.push_back({"layout.layer_split", "found entries summing to " + str(sum) + ", expected the model's " +
                                             str(layers) + " layers"});
  for (size_t i = 0; i < split.size(); ++i) {
    const std::string entry = "layout.layer_split[" + std::to_string(i) + "]";
    if (split[i] < 1)
      out.push_back(
          {entry, "found " + str(split[i]) + " layers, expected at least 1 (a stage runs a layer)"});
    else if (split[i] % vpp != 0)
      out.push_back({entry + ", layout.vpp",
                     "found " + str(split[i]) + " layers, expected a multiple of vpp = " + str(vpp)});
  }
}

}  // namespace

std::vector<ShardViolation> shard_layout_check(const ModelConfig& config, const ShardLayout& layout) {
  LOOM_ASSERT(layout.tp >= 1 && layout.pp >= 1 && layout.vpp >= 1, "shard_layout_check needs sizes >= 1");
  std::vector<ShardViolation> out;
  check_tp(config, layout.tp, out);
  check_layer_split(config, layout, out);
  if (layout.ep < 1)
    out.push_back({"layout.ep", "found " + str(layout.ep) + ", expected at least 1"});
  else if (layout.ep > 1 && config.num_experts == 0)
    out.push_back({"layout.ep", "found " + str(layout.ep) + ", expected 1 (a dense model has no experts)"});
  else if (layout.ep > 1 && config.num_experts % layout.ep != 0)
    out.push_back({"layout.ep", "found " + str(layout.ep) + ", expected a divisor of the model's " +
                                    str(config.num_experts) + " experts (num_experts)"});
  return out;
}

void shard_layout_require(const ModelConfig& config, const ShardLayout& layout) {
  const std::vector<ShardViolation> violations = shard_layout_check(config, layout);
  if (!violations.empty()) throw_input_error(violations[0].field, violations[0].what);
}

std::vector<int64_t> stage_layer_counts(const ModelConfig& config, const ShardLayout& layout) {
  LOOM_ASSERT(shard_layout_check(config, layout).empty(),
              "the layers of a layout that does not split the model");
  if (!layout.layer_split.empty()) return layout.layer_split;
  return std::vector<int64_t>(static_cast<size_t>(layout.pp), config.num_hidden_layers / layout.pp);
}

LayerRange stage_layer_range(const ModelConfig& config, const ShardLayout& layout, int64_t stage) {
  const std::vector<int64_t> counts = stage_layer_counts(config, layout);
  LOOM_ASSERT(stage >= 0 && stage < layout.pp, "a stage outside the layout");
  const int64_t begin =
      std::accumulate(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(stage), int64_t{0});
  return {begin, begin + counts[static_cast<size_t>(stage)]};
}

HeadLayout shard_heads(const ModelConfig& config, int64_t tp) {
  const int64_t kv = config.num_key_value_heads;
  return {config.num_attention_heads / tp, kv >= tp ? kv / tp : 1, config.head_dim};
}

int64_t shard_kv_share(const ModelConfig& config, int64_t tp) {
  return config.num_key_value_heads < tp ? tp / config.num_key_value_heads : 1;
}

int64_t shard_ffn(const ModelConfig& config, int64_t tp) {
  return config.intermediate_size / tp;
}

int64_t shard_experts(const ModelConfig& config, int64_t ep) {
  return config.num_experts / ep;
}

bool is_expert_kind(ParamKind kind) {
  return kind == ParamKind::experts_gate_up || kind == ParamKind::experts_down;
}

int64_t shard_vocab(const ModelConfig& config, int64_t tp) {
  return config.vocab_size / tp;
}

int64_t shard_vocab_begin(const ModelConfig& config, int64_t tp, int64_t tp_rank) {
  return tp_rank * shard_vocab(config, tp);
}

std::vector<RankGemm> shard_gemms(const ModelConfig& config, int64_t tp) {
  const HeadLayout heads = shard_heads(config, tp);
  const GemmWidth hidden{"hidden_size", config.hidden_size};
  const GemmWidth q{"q heads · head_dim", heads.q_heads * heads.head_dim};
  const GemmWidth kv{"kv heads · head_dim", heads.kv_heads * heads.head_dim};
  const GemmWidth ffn{"intermediate_size", shard_ffn(config, tp)};
  return {{ParamKind::qkv, {"(q + 2·kv heads) · head_dim", q.width + 2 * kv.width}, hidden, {q, kv}},
          {ParamKind::o_proj, hidden, q, {q}},
          {ParamKind::gate_up, {"2 · intermediate_size", 2 * ffn.width}, hidden, {ffn}},
          {ParamKind::down, hidden, ffn, {ffn}}};
}

TensorShard tensor_shard(const ModelConfig& c, const ShardLayout& layout, int64_t r, int64_t stage,
                         const ParamSpec& full, int64_t ep_rank) {
  const int64_t tp = layout.tp, hd = c.head_dim, h = c.hidden_size;
  const bool first = stage == 0, last = stage == layout.pp - 1;
  const LayerRange layers = stage_layer_range(c, layout, stage);
  const bool in_stage = full.layer >= layers.begin && full.layer < layers.end;
  const bool sp = layout.sequence_parallel && tp > 1;
  TensorShard t;

  auto hold = [&](std::vector<RowBlock> blocks, int64_t col, int64_t cols) {
    int64_t rows = 0;
    for (const RowBlock& b : blocks) rows += b.rows;
    t.held = true;
    t.blocks = std::move(blocks);
    t.col = col;
    t.cols = cols;
    t.shape = full.shape.ndim == 1 ? Shape{rows} : Shape{rows, cols};
    t.counted = t.shape.numel();
  };
  auto partial = [&](PartialGroup group, int64_t offset, int64_t numel) {
    t.partial_group = group;
    t.partial_offset = offset;
    t.partial_numel = numel;
  };
  // Replicated over TP, counted on rank 0; its grad partial over TP where `partial_grad`.
  auto norm = [&](bool partial_grad) {
    hold({{0, full.shape[0]}}, 0, 1);
    if (tp > 1 && r != 0) t.counted = 0;
    if (partial_grad && tp > 1) partial(PartialGroup::tp, 0, t.shape.numel());
  };
  auto vocab_rows = [&] {
    const int64_t vocab = shard_vocab(c, tp);
    hold({{r * vocab, vocab}}, 0, h);
    if (c.tie_word_embeddings && layout.pp > 1) {
      partial(PartialGroup::embedding, 0, t.shape.numel());
      // The last stage's copy is the first stage's tensor again.
      if (!first) t.counted = 0;
    }
  };

  switch (full.kind) {
    case ParamKind::embedding:
      if (first || (last && c.tie_word_embeddings)) vocab_rows();
      break;
    case ParamKind::lm_head:
      if (last) vocab_rows();
      break;
    case ParamKind::final_norm:
      if (last) norm(sp);
      break;
    case ParamKind::input_norm:
    case ParamKind::post_attn_norm:
      if (in_stage) norm(sp);
      break;
    case ParamKind::q_norm:
    case ParamKind::k_norm:
      if (in_stage) norm(true);
      break;
    case ParamKind::qkv:
    case ParamKind::qkv_bias:
      if (in_stage) {
        // The bias is split with its rows: one column of the weight's row blocks.
        const int64_t cols = full.kind == ParamKind::qkv ? h : 1;
        const HeadLayout heads = shard_heads(c, tp);
        const int64_t share = shard_kv_share(c, tp);
        const int64_t q_rows = heads.q_heads * hd, kv_rows = heads.kv_heads * hd;
        // The rank's own KV heads, or the one its q heads use.
        const int64_t kv_first = share > 1 ? r / share : r * heads.kv_heads;
        hold({{r * q_rows, q_rows},
              {c.q_dim() + kv_first * hd, kv_rows},
              {c.q_dim() + c.kv_dim() + kv_first * hd, kv_rows}},
             0, cols);
        if (share > 1) {
          partial(PartialGroup::kv, q_rows * cols, 2 * kv_rows * cols);
          if (r % share != 0) t.counted = q_rows * cols;
        }
      }
      break;
    case ParamKind::o_proj:
      if (in_stage) {
        const int64_t q_cols = shard_heads(c, tp).q_heads * hd;
        hold({{0, h}}, r * q_cols, q_cols);
      }
      break;
    case ParamKind::gate_up:
      if (in_stage) {
        const int64_t f = shard_ffn(c, tp);
        hold({{r * f, f}, {c.intermediate_size + r * f, f}}, 0, h);
      }
      break;
    case ParamKind::down:
      if (in_stage) {
        const int64_t f = shard_ffn(c, tp);
        hold({{0, h}}, r * f, f);
      }
      break;
    case ParamKind::router:
    case ParamKind::experts_gate_up:
    case ParamKind::experts_down:
      // Whole on every TP rank: the router and the EP rank's experts run on the rank's tokens
      // (its T/tp under SP, whose grads are then partial over TP, as a norm's).
      if (in_stage) {
        const int64_t rows = full.kind == ParamKind::router ? full.shape[0] : full.shape[0] / layout.ep;
        hold({{full.kind == ParamKind::router ? 0 : ep_rank * rows, rows}}, 0, full.shape[1]);
        if (tp > 1 && r != 0) t.counted = 0;
        if (sp && tp > 1) partial(PartialGroup::tp, 0, t.shape.numel());
      }
      break;
    // LoRA's adapters (model/lora.h) as Megatron-Bridge splits them. A column-parallel layer's
    // (qkv, gate_up) A reads the whole input: whole on every rank, its grad a partial sum over
    // TP (each rank's d_t comes from its rows of B); each B takes the rows its module's weight
    // has here (q heads, KV heads, the FFN share), shared KV heads' partial as the weight's.
    // A row-parallel layer's (o_proj, down) A takes the weight's columns (x · Aᵀ is then
    // all-reduced over TP), its B whole on every rank with the same grad on each.
    case ParamKind::lora_qkv_a:
    case ParamKind::lora_gate_up_a:
      if (in_stage) {
        hold({{0, full.shape[0]}}, 0, full.shape[1]);
        if (tp > 1 && r != 0) t.counted = 0;
        if (tp > 1) partial(PartialGroup::tp, 0, t.shape.numel());
      }
      break;
    case ParamKind::lora_o_proj_a:
      if (in_stage) {
        const int64_t q_cols = shard_heads(c, tp).q_heads * hd;
        hold({{0, full.shape[0]}}, r * q_cols, q_cols);
      }
      break;
    case ParamKind::lora_down_a:
      if (in_stage) {
        const int64_t f = shard_ffn(c, tp);
        hold({{0, full.shape[0]}}, r * f, f);
      }
      break;
    case ParamKind::lora_q_b:
      if (in_stage) {
        const int64_t q_rows = shard_heads(c, tp).q_heads * hd;
        hold({{r * q_rows, q_rows}}, 0, full.shape[1]);
      }
      break;
    case ParamKind::lora_k_b:
    case ParamKind::lora_v_b:
      if (in_stage) {
        const HeadLayout heads = shard_heads(c, tp);
        const int64_t share = shard_kv_share(c, tp), kv_rows = heads.kv_heads * hd;
        const int64_t kv_first = share > 1 ? r / share : r * heads.kv_heads;
        hold({{kv_first * hd, kv_rows}}, 0, full.shape[1]);
        if (share > 1) {
          partial(PartialGroup::kv, 0, t.shape.numel());
          if (r % share != 0) t.counted = 0;
        }
      }
      break;
    case ParamKind::lora_gate_b:
    case ParamKind::lora_up_b:
      if (in_stage) {
        const int64_t f = shard_ffn(c, tp);
        hold({{r * f, f}}, 0, full.shape[1]);
      }
      break;
    case ParamKind::lora_o_b:
    case ParamKind::lora_down_b:
      if (in_stage) {
        hold({{0, full.shape[0]}}, 0, full.shape[1]);
        if (tp > 1 && r != 0) t.counted = 0;
      }
      break;
  }
  return t;
}

}  // namespace loom
