// The router's statistics of a mixture of experts and the load-balancing losses read from
// them (docs/numerics.md, "Mixture of experts"). A sparse layer's census of a micro-batch
// is two host vectors over its E experts, summed over every token of the micro-batch (every
// TP rank's under sequence parallel): the (token, slot) pairs routed to each expert, which
// carry no gradient, and the sum of each expert's router probability, which does. Both
// losses are products of the two, so their gradient with respect to any token's
// probability of expert e is the same number for every token: a vector over the experts
// (Ops::moe_route_backward's d_probs_per_expert).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom {

enum class MoeAuxLossKind : uint8_t { none, hf, megatron };

// workload.moe.aux_loss.
struct MoeAuxLoss {
  MoeAuxLossKind kind = MoeAuxLossKind::none;
  double coef = 0.0;
};
// "hf" | "megatron" | "" (none); anything else is a caller's bug (the schema checked it).
MoeAuxLoss moe_aux_loss_from(const std::string& kind, double coef);

// One sparse layer's census of one micro-batch.
struct LayerRouting {
  std::vector<double> tokens;  // [E] (token, slot) pairs routed to each expert
  std::vector<double> probs;   // [E] Σ over the tokens of each expert's router probability
  // [E] the load-balancing loss's gradient with respect to each token's probability of each
  // expert, as the layer's backward applies it (set before the backward; empty: none).
  std::vector<double> d_probs;
};

// A load-balancing term and its gradient with respect to each token's router probability
// of each expert (the same for every token).
struct AuxLossTerm {
  double value = 0.0;
  std::vector<double> d_probs;  // [E]
};

// Megatron core's switch_load_balancing_loss_func for one layer of a micro-batch of T tokens,
// top-k, without the coefficient (Megatron multiplies it into E / (k · T²)):
// E / (k · T²) · Σ_e probs_e · tokens_e.
AuxLossTerm megatron_aux_loss(const LayerRouting& layer, int64_t top_k, int64_t tokens);

// transformers' load_balancing_loss_func over the S sparse layers of a micro-batch of T tokens
// (attention_mask None): E · Σ_e (Σ_l tokens_le) · (Σ_l probs_le) / (S · T)², without the
// coefficient (transformers multiplies it in when adding the term to the loss).
AuxLossTerm hf_aux_loss(const std::vector<const LayerRouting*>& layers, int64_t tokens);

// What a step's census reports per sparse layer: the (token, slot) pairs of the step each
// expert received, summarized.
struct ExpertLoad {
  double min = 0, max = 0;
  double cv = 0;  // coefficient of variation: standard deviation / mean (0: perfectly even)
};
ExpertLoad expert_load(const std::vector<double>& tokens);

// A step's routing: each sparse layer's tokens per expert over the step's micro-batches
// (layers of the whole model, in config.sparse_layer_numbers() order; a rank fills its own), and
// the aux loss's reported terms (hf: one per micro-batch; megatron: one per layer and
// micro-batch, without the coefficient), summed.
struct RoutingStats {
  std::vector<std::vector<double>> expert_tokens;
  double aux_loss_sum = 0.0;
  int64_t aux_loss_terms = 0;
};

}  // namespace loom
