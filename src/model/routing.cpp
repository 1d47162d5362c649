#include "model/routing.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom {

MoeAuxLoss moe_aux_loss_from(const std::string& kind, double coef) {
  if (kind.empty()) return {};
  LOOM_ASSERT(kind == "hf" || kind == "megatron", "unknown aux loss kind " + kind);
  return {kind == "hf" ? MoeAuxLossKind::hf : MoeAuxLossKind::megatron, coef};
}

AuxLossTerm megatron_aux_loss(const LayerRouting& layer, int64_t top_k, int64_t tokens) {
  const size_t experts = layer.tokens.size();
  const double t = static_cast<double>(tokens);
  const double factor = static_cast<double>(experts) / (static_cast<double>(top_k) * t * t);
  AuxLossTerm term;
  term.d_probs.resize(experts);
  double dot = 0.0;
  for (size_t e = 0; e < experts; ++e) {
    dot += layer.probs[e] * layer.tokens[e];
    term.d_probs[e] = factor * layer.tokens[e];
  }
  term.value = factor * dot;
  return term;
}

AuxLossTerm hf_aux_loss(const std::vector<const LayerRouting*>& layers, int64_t tokens) {
  LOOM_ASSERT(!layers.empty(), "the hf aux loss needs a sparse layer");
  const size_t experts = layers.front()->tokens.size();
  std::vector<double> routed(experts, 0.0), probs(experts, 0.0);
  for (const LayerRouting* layer : layers)
    for (size_t e = 0; e < experts; ++e) {
      routed[e] += layer->tokens[e];
      probs[e] += layer->probs[e];
    }
  // The means over the S · T rows of the stacked router outputs.
  const double rows = static_cast<double>(layers.size()) * static_cast<double>(tokens);
  const double factor = static_cast<double>(experts) / (rows * rows);
  AuxLossTerm term;
  term.d_probs.resize(experts);
  double dot = 0.0;
  for (size_t e = 0; e < experts; ++e) {
    dot += routed[e] * probs[e];
    term.d_probs[e] = factor * routed[e];
  }
  term.value = factor * dot;
  return term;
}

ExpertLoad expert_load(const std::vector<double>& tokens) {
  ExpertLoad load;
  if (tokens.empty()) return load;
  load.min = *std::min_element(tokens.begin(), tokens.end());
  load.max = *std::max_element(tokens.begin(), tokens.end());
  double sum = 0.0;
  for (double x : tokens) sum += x;
  const double mean = sum / static_cast<double>(tokens.size());
  if (mean <= 0.0) return load;
  double squares = 0.0;
  for (double x : tokens) squares += (x - mean) * (x - mean);
  load.cv = std::sqrt(squares / static_cast<double>(tokens.size())) / mean;
  return load;
}

}  // namespace loom
