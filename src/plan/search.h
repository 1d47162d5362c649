// `loom plan --search`: the layouts of a recipe's model for its GPU count and workload,
// ranked by predicted tokens/s/GPU among those that fit.
//
// Candidates: tp a power of two up to the GPUs of a node; pp a divisor of the layers
// (even split); cp a power of two, in its all_gather and its ring form when above 1, where
// no layout of that tp and pp fits with cp 1 (CP takes its GPUs from DP, which does the same
// work a GPU without CP's transfers: it pays for rows too long for one GPU, or a global
// batch too small for the DP ranks), a micro-batch of one row then; dp the
// rest (ep each power of two dividing it, for a mixture of experts); sequence parallelism on
// or off when tp > 1; recompute none, selective or full (uniform, 1 layer); optimizer offload
// none or 1.0; activation offload off or on (the rules take it with full recompute and pp 1
// alone); 1, 2, 4 or 8 rows per micro-batch (max_tokens_per_gpu = rows · row_tokens /
// cp). A candidate
// that breaks one of the recipe's rules (recipe/rules.h recipe_rules, the recipe with the
// candidate's layout and gpu.count the GPUs searched: the split of the model, the FP8 GEMMs'
// widths, ...) or whose global batch does not split over its dp is left out; the rest are
// planned with the recipe's GPU and constants.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace loom {

struct SearchResult {
  int64_t gpus = 0;
  std::vector<Plan> fitting;  // best first: most tokens/s/GPU, then least GPU + host memory
  int64_t considered = 0;     // candidates the recipe's rules allow
  int64_t not_fitting = 0;
};

// The recipe gives the model, workload, GPU, constants and the rules' other fields; gpus > 0
// overrides its layout's world size.
SearchResult plan_search(const Recipe& recipe, int64_t gpus);
std::string search_to_text(const SearchResult& result, size_t top);
nlohmann::json search_to_json(const SearchResult& result, size_t top);

}  // namespace loom
