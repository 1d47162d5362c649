#include "model/recompute.h"

#include <algorithm>

#include "core/error.h"

namespace loom {

std::vector<LayerChunk> recompute_chunks(const RecomputePolicy& policy, int64_t layers) {
  std::vector<LayerChunk> chunks;
  if (policy.granularity != RecomputePolicy::Granularity::full) return chunks;
  LOOM_ASSERT(policy.num_layers >= 1, "recompute num_layers must be at least 1");
  if (policy.block) {
    for (int64_t l = 0; l < std::min(policy.num_layers, layers); ++l) chunks.push_back({l, l + 1});
  } else {
    for (int64_t l = 0; l < layers; l += policy.num_layers)
      chunks.push_back({l, std::min(l + policy.num_layers, layers)});
  }
  return chunks;
}

}  // namespace loom
