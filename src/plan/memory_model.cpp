// The per-GPU memory model (plan.h). Every activation term is a tensor qwen3.cpp allocates
// in the activation arena, which never frees inside a micro-batch: the forward's tensors
// stay until its backward, the backward's gradient scratch is allocated once.
#include <algorithm>
#include <string>

#include "plan/plan.h"
#include "plan/shard.h"

namespace loom {
namespace {

int64_t align_up(int64_t bytes, int64_t alignment) {
  return (std::max<int64_t>(bytes, 1) + alignment - 1) / alignment * alignment;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// What Qwen3Model::stage_forward allocates per layer (qwen3.h LayerActivations; the o_proj
// and down outputs go to one buffer of the micro-batch, qwen3.h ResidualDelta), bf16
// activations and fp32 statistics. Under TP each GPU holds its heads and FFN columns of every token; the
// residual stream and the norms are sequence-sharded under SP.
std::vector<LayerTensor> layer_tensors(const GpuShard& g) {
  const int64_t h = g.hidden;
  std::vector<LayerTensor> tensors = {
      {"norm1", 2 * h, true},
      {"rstd1", 4, true},
      {"residual_in", 2 * h, true},
      {"qkv", 2 * g.qkv_dim, false},
      {"qkv_rot", 2 * g.qkv_dim, false},
      {"qk_rstd", 4 * (g.q_heads + g.kv_heads), false},
      {"attn", 2 * g.q_dim, false},
      {"lse", 4 * g.q_heads, false},
      {"residual_mid", 2 * h, true},
      {"norm2", 2 * h, true},
      {"rstd2", 4, true},
      {"gate_up", 2 * 2 * g.ffn, false},
      {"act", 2 * g.ffn, false},
  };
  // Families without q/k norm (Llama, Qwen2, Mistral) keep no q/k norm statistics.
  if (!g.qk_norm) std::erase_if(tensors, [](const LayerTensor& t) { return t.name == "qk_rstd"; });
  return tensors;
}

// The op workspace arena (cuda_ops.h): each op releases it and asks for its temporaries;
// DeviceArena adds a block when a request does not fit and, at the next release, merges
// its blocks into one of their total. So it ends as the sum of the requests that grew it.
class WorkspaceArenaSim {
 public:
  explicit WorkspaceArenaSim(int64_t alignment) : alignment_(alignment) {}
  void op(std::initializer_list<int64_t> requests) {
    if (blocks_.size() > 1) {
      int64_t total = 0;
      for (const Block& b : blocks_) total += b.bytes;
      blocks_ = {{total, 0}};
    }
    for (Block& b : blocks_) b.used = 0;
    for (int64_t bytes : requests) {
      if (bytes <= 0) continue;
      const int64_t size = align_up(bytes, alignment_);
      auto fit = std::find_if(blocks_.begin(), blocks_.end(),
                              [&](const Block& b) { return b.bytes - b.used >= size; });
      if (fit == blocks_.end()) {
        blocks_.push_back({size, 0});
        fit = blocks_.end() - 1;
      }
      fit->used += size;
    }
  }
  int64_t reserved() const {
    int64_t total = 0;
    for (const Block& b : blocks_) total += b.bytes;
    return total;
  }

 private:
  struct Block {
    int64_t bytes = 0, used = 0;
  };
  int64_t alignment_;
  std::vector<Block> blocks_;
};

struct Workspace {
  int64_t reserved = 0;
  int64_t logits = 0, sdpa_backward = 0, sdpa_forward = 0;
};

// isolated_tokens: isolated_attention_tokens (plan.h), 0 for rows packing: a THD backward is
// one call over its bucketed shape, by row or not.
Workspace workspace_for_stage(const GpuShard& g, const PlanConstants& c, int64_t multiprocessors, int64_t s,
                              bool attention_by_row, int64_t isolated_tokens) {
  Workspace w;
  const int64_t layers = g.stage_layers[static_cast<size_t>(s)];
  w.sdpa_forward = c.sdpa_forward_workspace_bytes;
  const int64_t rows_a_call = attention_by_row ? 1 : g.rows;
  const int64_t tokens_a_call = isolated_tokens > 0 ? isolated_tokens : rows_a_call * g.row_tokens;
  const double dq_accumulator = 4.0 * static_cast<double>(tokens_a_call * g.q_heads * g.head_dim);
  w.sdpa_backward = static_cast<int64_t>(c.sdpa_backward_workspace_dq_units * dq_accumulator);
  w.logits = g.last(s) ? std::min(c.loss_chunk_tokens, g.tokens) * g.vocab * 2 : 0;
  const int64_t weight_grad_blocks = c.weight_grad_blocks_per_sm * multiprocessors;
  const int64_t norm_partials = std::min(g.seq_tokens, weight_grad_blocks) * g.hidden * 4;
  const int64_t qk_partials = 2 * weight_grad_blocks * g.head_dim * 4;
  // embedding.cu: rows, positions, sorted rows, sorted positions, then CUB's radix-sort
  // buffers (about a second copy of keys and values).
  const int64_t sort = 4 * align_up(g.tokens * 4, 256) + 2 * g.tokens * 8;
  const int64_t reduce_partials = c.reduce_blocks_per_sm * multiprocessors * 8;  // doubles
  WorkspaceArenaSim arena(c.arena_alignment);
  for (int pass = 0; pass < 2; ++pass) {  // the second pass shows the merged, steady arena
    for (int64_t l = 0; l < layers; ++l) arena.op({w.sdpa_forward});
    if (g.last(s)) {
      arena.op({w.logits});
      arena.op({norm_partials});
    }
    for (int64_t l = 0; l < layers; ++l) {
      arena.op({norm_partials});
      arena.op({w.sdpa_backward});
      arena.op({qk_partials});
      arena.op({norm_partials});
    }
    if (g.first(s)) arena.op({sort});
    arena.op({reduce_partials});
  }
  w.reserved = arena.reserved();
  return w;
}

int64_t communicators(const LayoutSpec& layout) {
  int64_t count = layout.world_size() > 1 ? 1 : 0;
  for (int64_t size : {layout.tp, layout.cp, layout.dp, layout.pp}) count += size > 1 ? 1 : 0;
  if (layout.cp > 1 && layout.dp > 1) ++count;  // dp_cp, where gradients are reduced
  if (layout.pp > 1) ++count;                   // the embedding group of first and last stage
  return count;
}

void add_term(StageMemory& m, std::string name, std::string what, int64_t bytes, bool in_arenas = true) {
  m.terms.push_back({std::move(name), std::move(what), bytes, in_arenas});
}

// An activation's bytes in its arena: per token of the micro-batch, or of this GPU's
// sequence shard under SP.
struct ActivationSize {
  const GpuShard& g;
  int64_t alignment;
  int64_t operator()(int64_t bytes_per_token, bool sequence_sharded) const {
    return align_up(bytes_per_token * (sequence_sharded ? g.seq_tokens : g.tokens), alignment);
  }
};

// One layer's kept tensors, and the parts of them recompute treats on their own.
struct LayerBytes {
  int64_t total = 0;
  int64_t residual = 0;        // residual_in: a stage's first is its input
  int64_t attention_core = 0;  // what selective recompute drops
};

LayerBytes layer_bytes(const std::vector<LayerTensor>& tensors, const ActivationSize& tensor) {
  LayerBytes out;
  for (const LayerTensor& t : tensors) {
    const int64_t bytes = tensor(t.bytes_per_token, t.sequence_sharded);
    out.total += bytes;
    if (t.name == "residual_in") out.residual = bytes;
    // Selective recompute (model/recompute.h) drops the q/k-normed rotated qkv, the attention
    // output and its log-sum-exp of every layer into one shared set.
    if (t.name == "qkv_rot" || t.name == "attn" || t.name == "lse") out.attention_core += bytes;
  }
  return out;
}

// This GPU's share of the distributed optimizer (1/dp of its parameters) and the part of it
// that stays on the GPU (less the offloaded fraction).
struct OptimizerShare {
  int64_t shard = 0;
  int64_t on_gpu = 0;
};

OptimizerShare optimizer_share(int64_t params, int64_t dp, double offload) {
  const int64_t shard = ceil_div(params, dp);
  return {shard, static_cast<int64_t>(static_cast<double>(shard) * (1.0 - offload) + 0.5)};
}

// The engine's weights, grads and optimizer arenas (train/cuda_param_store.cpp).
void add_engine_terms(StageMemory& m, const GpuShard& g, const PlanConstants& c, double offload) {
  const int64_t a = c.arena_alignment;
  const int64_t n = m.params;
  add_term(m, "weights", "bf16 weights: 2 B x " + std::to_string(n) + " parameters on this GPU",
           align_up(2 * n, a));
  add_term(m, "main_grads", "fp32 main grads: 4 B a parameter (full on every DP rank)", align_up(4 * n, a));
  const OptimizerShare share = optimizer_share(n, g.dp, offload);
  // train/cuda_param_store.cpp reduce-scatters into a buffer of its own (a Comm does not
  // promise an in-place reduce-scatter); with one DP rank the grads are the slice.
  if (g.dp > 1)
    add_term(m, "main_grads.dp_slice",
             "fp32 reduce-scatter output: 4 B a parameter of 1/" + std::to_string(g.dp),
             align_up(4 * share.shard, a));
  const std::string of = "1/" + std::to_string(g.dp) + " (distributed optimizer)" +
                         (offload > 0 ? ", less the offloaded share" : "");
  add_term(m, "optimizer.adam_moments", "fp32 Adam m and v: 8 B a parameter of " + of,
           share.on_gpu > 0 ? 2 * align_up(4 * share.on_gpu, a) : 0);
  add_term(m, "optimizer.remainders", "int16 master remainders: 2 B a parameter of " + of,
           share.on_gpu > 0 ? align_up(2 * share.on_gpu, a) : 0);
  int64_t chunks = 0;
  for (int64_t size : g.stage_tensor_sizes(m.stage)) chunks += ceil_div(size, c.adam_chunk_elements);
  chunks = static_cast<int64_t>(static_cast<double>(ceil_div(chunks, g.dp)) * (1.0 - offload) + 0.5);
  add_term(m, "optimizer.chunk_table", "Adam's per-chunk records (64K elements a chunk)",
           chunks > 0 ? align_up(chunks * c.adam_chunk_record_bytes, a) : 0);
  // The offload stages its copies in pinned host memory (optim/cuda_adamw.h): nothing on
  // the GPU beyond the shares above.
}

// What one micro-batch keeps of a stage's layers for backward under layout.recompute, and
// the recomputed layers' transient activations.
struct KeptLayers {
  int64_t kept = 0;
  int64_t transient = 0;
  std::string recompute_what;
};

KeptLayers kept_layers(const RecomputeSpec& rc, int64_t layers, const LayerBytes& layer) {
  KeptLayers out;
  if (layers == 0) {
    out.kept = 0;
  } else if (!rc.enabled) {
    out.kept = layers * layer.total - layer.residual;
  } else if (rc.granularity == "selective") {
    out.kept = layers * (layer.total - layer.attention_core) - layer.residual;
    out.transient = layer.attention_core;
    out.recompute_what = "one layer's attention core (qkv_rot, attn, lse) recomputed in backward";
  } else if (rc.method == "uniform") {
    const int64_t per_chunk = std::min(rc.num_layers, layers);
    out.kept = (ceil_div(layers, per_chunk) - 1) * layer.residual;
    out.transient = per_chunk * layer.total - layer.residual;
    out.recompute_what = "one chunk of " + std::to_string(per_chunk) + " layer(s) recomputed in backward";
  } else {  // block: the first num_layers layers of the stage
    const int64_t recomputed = std::min(rc.num_layers, layers);
    out.kept = (layers - recomputed) * layer.total + (recomputed - 1) * layer.residual;
    out.transient = layer.total - layer.residual;
    out.recompute_what = "one recomputed layer at a time";
  }
  return out;
}

// Activations: what one micro-batch keeps for backward, times those in flight, and the
// buffers of one micro-batch's backward.
void add_activation_terms(StageMemory& m, const GpuShard& g, const PlanConstants& c, const RecomputeSpec& rc,
                          const LayerBytes& layer, const ActivationSize& tensor) {
  const int64_t s = m.stage;
  const int64_t h = g.hidden;
  const int64_t layers = m.layers;
  const KeptLayers kept = kept_layers(rc, layers, layer);
  // A micro-batch with positions without a target (a loss mask) may run its lm_head on
  // its loss rows alone (qwen3.h MicroBatch): their positions and targets, at most T each,
  // and in the backward their final norm output and its gradient. Counted where the
  // micro-batch is long enough to use them.
  const bool loss_rows = g.last(s) && g.tokens > c.loss_rows_granule;
  const int64_t stage_input =
      tensor(2 * h, true) + 2 * tensor(4, false) + (loss_rows ? 2 * tensor(4, false) : 0);
  // qwen3.h ResidualDelta: [T, H], and [T_s, H] after the reduce-scatter under SP.
  const int64_t residual_delta = tensor(2 * h, false) + (g.sp ? tensor(2 * h, true) : 0);
  const int64_t final_norm = g.last(s) ? 2 * tensor(2 * h, true) + tensor(4, true) : 0;
  const std::string times = std::to_string(m.in_flight) + " micro-batch(es) in flight x ";
  add_term(m, "activations.layers",
           times + std::to_string(layers) + " layers x " + std::to_string(layer.total) +
               " B a layer (less the first layer's residual, the stage input)" +
               (rc.enabled ? ", after recompute" : ""),
           m.in_flight * kept.kept);
  add_term(m, "activations.stage_input",
           times + (g.first(s) ? "embedding output" : "received activations") + " and token ids / targets" +
               (loss_rows ? " / loss rows" : ""),
           m.in_flight * stage_input);
  if (final_norm > 0)
    add_term(m, "activations.final_norm", times + "final residual, norm output and rstd",
             m.in_flight * final_norm);
  add_term(m, "activations.residual_delta", times + "o_proj / down output, every layer's in turn",
           m.in_flight * residual_delta);
  if (kept.transient > 0) add_term(m, "activations.recompute", kept.recompute_what, kept.transient);
  // A stage's input gradient is copied out before it is sent: the next micro-batch's input
  // may arrive into the same slot of activations in the same exchange.
  if (!g.first(s))
    add_term(m, "activations.pipeline_send", "the input gradient being sent back", tensor(2 * h, true));
  // Forward_backward's gradient scratch, once: d_residual, d_act, d_gate_up, d_norm,
  // d_attn, d_qkv (qk_norm_rope_backward works on it in place), and on the last stage nll
  // and d_final.
  int64_t scratch = tensor(2 * h, true) + tensor(2 * g.ffn, false) + tensor(4 * g.ffn, false) +
                    tensor(2 * h, false) + tensor(2 * g.q_dim, false) + tensor(2 * g.qkv_dim, false);
  if (g.last(s)) scratch += tensor(4, false) + tensor(2 * h, false);
  if (loss_rows) scratch += 2 * tensor(2 * h, false);
  add_term(m, "activations.backward_scratch",
           std::string("one micro-batch's gradient buffers (qwen3.cpp forward_backward)") +
               (loss_rows ? ", the loss rows' final norm output and gradient" : ""),
           scratch);
  if (g.tp > 1)
    add_term(
        m, "activations.tp_buffers",
        "gathered input of one GEMM (" +
            std::string(c.sp_regather_in_backward ? "norms re-gathered in backward" : "norms kept gathered") +
            "; the pre-reduce-scatter partial sums are the residual delta's)",
        tensor(2 * h, false));
  if (g.sp && !c.sp_regather_in_backward)
    add_term(m, "activations.sp_gathered_norms", "gathered norm1 and norm2 kept for the weight gradients",
             m.in_flight * layers * 2 * (tensor(2 * h, false) - tensor(2 * h, true)));
}

// FP8 linear layers (model/linear.h): each FP8 layer's weights cast once per step, W and
// Wᵀ (2 B a weight), and the backward's operands of its largest layer while its GEMMs run:
// the output gradient in both orientations (2 B an element) and the input transposed (1 B).
void add_fp8_terms(StageMemory& m, const GpuShard& g, const PlanInput& input, const ActivationSize& tensor) {
  const int64_t layers = plan_fp8_layers(input, g.stage_layers, m.stage);
  if (layers == 0) return;
  add_term(m, "fp8.weights",
           "FP8 weights and their transposes: 2 B a linear-layer weight of " + std::to_string(layers) +
               " FP8 layers",
           align_up(2 * layers * g.layer_matmul_params(), input.constants.arena_alignment));
  const int64_t h = g.hidden;
  const int64_t gate_up = 2 * 2 * g.ffn + h, down = 2 * h + g.ffn, qkv = 2 * g.qkv_dim + h;
  add_term(m, "fp8.backward_operands",
           "one linear layer's FP8 output gradient (both orientations) and transposed input, in its backward",
           tensor(std::max({gate_up, down, qkv}), false));
  if (input.workload.fp8.scaling == "block") {
    // Block scaling (model/linear.h): f32 inverse scales, one per 128 × 128 block of W and of
    // Wᵀ (rows padded to 4 scales), and one per 128 values of each backward operand.
    const auto blocks = [](int64_t n) { return (n + 127) / 128; };
    const auto padded_blocks = [&](int64_t n) { return (blocks(n) + 3) / 4 * 4; };
    const auto weight_scales = [&](int64_t n, int64_t k) {
      return 4 * (blocks(n) * padded_blocks(k) + blocks(k) * padded_blocks(n));
    };
    const int64_t per_layer = weight_scales(g.qkv_dim, h) + weight_scales(h, g.q_dim) +
                              weight_scales(2 * g.ffn, h) + weight_scales(h, g.ffn);
    add_term(
        m, "fp8.block_scales",
        "block scaling's inverse scales: the FP8 weights' (4 B a 128 × 128 block, both orientations) and one "
        "linear layer's backward operands' (4 B a 128 values)",
        align_up(layers * per_layer, input.constants.arena_alignment) +
            tensor(std::max({4 * g.ffn + h, 2 * h + g.ffn, 2 * g.qkv_dim + h}) / 32, false));
    return;
  }
  // Under tensor scaling and without SP an FP8 layer keeps its inputs' FP8 transposes (norm1, norm2 and the
  // SwiGLU output, 1 B an element) in place of the bf16 tensors activations.layers counts (2 B), and the bf16
  // ones live in two buffers the layers share (qwen3.cpp keeps_fp8_inputs). Counted over the layers that keep
  // everything (not recomputed), taken to be FP8 ones first: exact without bf16_first_layers /
  // bf16_last_layers beside block recompute.
  if (g.sp) return;
  const RecomputeSpec& rc = input.layout.recompute;
  int64_t kept_whole = m.layers;
  if (rc.enabled && rc.granularity != "selective")
    kept_whole = rc.method == "uniform" ? 0 : m.layers - std::min(rc.num_layers, m.layers);
  const int64_t keeping = std::min(layers, kept_whole);
  add_term(m, "fp8.kept_inputs",
           std::to_string(m.in_flight) + " micro-batch(es) in flight x " + std::to_string(keeping) +
               " FP8 layers keeping norm1, norm2 and the SwiGLU output as FP8 transposes (1 B) instead of "
               "bf16 (2 B): the bytes saved against activations.layers",
           -m.in_flight * keeping * (2 * tensor(h, true) + tensor(g.ffn, false)));
  add_term(m, "fp8.shared_inputs",
           std::to_string(m.in_flight) +
               " micro-batch(es) in flight x the bf16 norm and SwiGLU outputs the FP8 layers share",
           m.in_flight * (tensor(2 * h, false) + tensor(2 * g.ffn, false)));
}

// The op workspace and the tables, then what lives outside the arenas.
void add_workspace_and_outside_terms(StageMemory& m, const GpuShard& g, const PlanInput& input) {
  const PlanConstants& c = input.constants;
  const int64_t a = c.arena_alignment;
  const int64_t isolated_tokens = isolated_attention_tokens(input, g.rows);
  const Workspace w = workspace_for_stage(g, c, input.gpu.multiprocessors, m.stage,
                                          input.attention_backward_by_row, isolated_tokens);
  const std::string sdpa_calls =
      isolated_tokens > 0 ? "isolated rows as THD, one call of at most " + std::to_string(isolated_tokens) +
                                " bucketed tokens"
      : input.attention_backward_by_row ? "one row a call: all rows in one call would not fit"
                                        : "all rows in one call";
  add_term(m, "workspace",
           "op workspace arena: lm_head logits chunk (" + std::to_string(w.logits) + " B), SDPA backward (" +
               std::to_string(w.sdpa_backward) + " B, GUESS, " + sdpa_calls + "), kernel partials",
           w.reserved);
  const int64_t tables =
      align_up(8, a) + align_up(g.tokens * 4, a) + align_up(g.row_tokens * g.head_dim * 4, a);
  add_term(m, "tables", "token positions and the RoPE cos/sin table", tables);

  // Outside the arenas: not in max_mem_gib, but on the GPU.
  const int64_t arenas = m.arena_bytes();
  add_term(m, "outside.cuda_context", "CUDA context and library kernels (GUESS)", c.cuda_context_bytes,
           false);
  add_term(m, "outside.cublas_workspace", "cuBLASLt workspace (gemm.h)", c.cublas_workspace_bytes, false);
  const int64_t comms = communicators(input.layout);
  if (comms > 0)
    add_term(m, "outside.nccl", std::to_string(comms) + " NCCL communicator(s) (GUESS a communicator)",
             comms * c.nccl_bytes_per_communicator, false);
  add_term(m, "outside.allocator_slack", "cudaMalloc pages and fragmentation (GUESS: a share of the arenas)",
           static_cast<int64_t>(c.allocator_slack_fraction * static_cast<double>(arenas)), false);
}

// The host: CudaAdamW's pinned block (optim/cuda_adamw.h host_bytes), the weights read in
// and final/ written out a piece at a time (fp32 piece, its bf16 bits and remainders), and a
// checkpoint's state on the writing rank, rank 0 of stage 0 (train/resume.h): a parallel
// layout gathers it whole; one GPU's engine writes it streamed where the host's
// MemAvailable does not hold a copy, so a piece is all it needs.
void add_host_terms(StageMemory& m, const GpuShard& g, const PlanInput& input, double offload) {
  const PlanConstants& c = input.constants;
  const int64_t n = m.params;
  const OptimizerShare share = optimizer_share(n, g.dp, offload);
  const int64_t offloaded = offload > 0 ? share.shard - share.on_gpu : 0;
  m.host_terms.push_back(
      {"host.optimizer_offload",
       "pinned: Adam m and v, int16 remainders and the bf16 mirror of the offloaded share (12 B a "
       "parameter), two grad staging chunks",
       offloaded > 0 ? 12 * offloaded + 2 * std::min(c.offload_chunk_elements, offloaded) * 4 : 0, false});
  m.host_terms.push_back({"host.weight_pieces", "the weights' load and final/'s save, one piece at a time",
                          8 * std::min(c.weight_piece_elements, n), false});
  const bool one_gpu = g.tp == 1 && g.pp == 1 && g.cp == 1 && g.dp == 1;
  if (input.checkpoints && m.stage == 0 && one_gpu)
    m.host_terms.push_back(
        {"host.checkpoint_state",
         "a checkpoint written streamed: one piece of fp32 values and its bf16 + remainder staging (a "
         "copy of master, m and v, 12 B a parameter, only where MemAvailable holds it: then written in "
         "the background; a resume reads in host.weight_pieces' pieces)",
         8 * std::min(c.checkpoint_piece_elements, n), false});
  else if (input.checkpoints && m.stage == 0)
    m.host_terms.push_back(
        {"host.checkpoint_state",
         "a checkpoint's master, m and v in fp32 (12 B a parameter of the whole model), gathered on "
         "the writing rank",
         12 * input.model.total_params(), false});
}

}  // namespace

int64_t StageMemory::arena_bytes() const {
  int64_t total = 0;
  for (const MemoryTerm& t : terms)
    if (t.in_arenas) total += t.bytes;
  return total;
}

int64_t StageMemory::device_bytes() const {
  int64_t total = 0;
  for (const MemoryTerm& t : terms) total += t.bytes;
  return total;
}

int64_t StageMemory::host_bytes() const {
  int64_t total = 0;
  for (const MemoryTerm& t : host_terms) total += t.bytes;
  return total;
}

MemoryPlan plan_memory(const PlanInput& input, const MicroBatchShape& micro) {
  const LayoutSpec& layout = input.layout;
  const GpuShard g = gpu_shard(input.model, layout, micro);
  const ActivationSize tensor{g, input.constants.arena_alignment};
  MemoryPlan plan;
  plan.layer_tensors = layer_tensors(g);
  const LayerBytes layer = layer_bytes(plan.layer_tensors, tensor);
  plan.layer_bytes = layer.total;
  const double offload = layout.offload.enabled ? layout.offload.optimizer_fraction : 0.0;
  for (int64_t s = 0; s < g.pp; ++s) {
    StageMemory m;
    m.stage = s;
    m.layers = g.stage_layers[static_cast<size_t>(s)];
    m.in_flight = std::min(g.pp - s, micro.micro_batches);
    m.params = g.stage_params(s);
    add_engine_terms(m, g, input.constants, offload);
    add_activation_terms(m, g, input.constants, layout.recompute, layer, tensor);
    add_fp8_terms(m, g, input, tensor);
    add_workspace_and_outside_terms(m, g, input);
    add_host_terms(m, g, input, offload);
    plan.stages.push_back(std::move(m));
  }
  for (size_t s = 1; s < plan.stages.size(); ++s)
    if (plan.stages[s].device_bytes() > plan.stages[plan.peak_stage].device_bytes()) plan.peak_stage = s;
  return plan;
}

}  // namespace loom
