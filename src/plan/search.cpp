#include "plan/search.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "recipe/rules.h"

namespace loom {
namespace {

std::vector<RecomputeSpec> recompute_choices() {
  RecomputeSpec none, selective, full;
  selective.enabled = true;
  selective.granularity = "selective";
  full.enabled = true;
  full.granularity = "full";
  full.method = "uniform";
  full.num_layers = 1;
  return {none, selective, full};
}

std::vector<OffloadSpec> offload_choices() {
  OffloadSpec none, all;
  all.enabled = true;
  all.optimizer_fraction = 1.0;
  return {none, all};
}

}  // namespace

SearchResult plan_search(const Recipe& recipe, int64_t gpus) {
  const PlanInput base = plan_input_from_recipe(recipe);
  SearchResult result;
  result.gpus = gpus > 0 ? gpus : base.layout.world_size();
  const int64_t layers = base.model.num_hidden_layers;
  for (int64_t tp = 1; tp <= std::min(result.gpus, base.gpus_per_node); tp *= 2) {
    if (result.gpus % tp != 0) continue;
    for (int64_t pp = 1; pp <= result.gpus / tp; ++pp) {
      if ((result.gpus / tp) % pp != 0 || layers % pp != 0) continue;
      // Context parallelism: each power of two dividing the rest, in either form (the rules
      // refuse a cp that does not cut the rows into 2·cp chunks, and cp beside ep), where no
      // layout of this tp and pp fits without it: CP takes its GPUs from DP, whose ranks do the
      // same work a GPU with no transfers in the step, so it pays only for rows too long for
      // one GPU or a global batch too small for the DP ranks (no cp = 1 candidate then).
      bool fits_without_cp = false;
      for (int64_t cp = 1; cp <= result.gpus / tp / pp; cp *= 2) {
        if ((result.gpus / tp / pp) % cp != 0 || (cp > 1 && fits_without_cp)) continue;
        const int64_t dp = result.gpus / tp / pp / cp;
        // Expert parallelism over DP for a mixture of experts: each power of two dividing dp
        // (the rules refuse those that do not divide the experts).
        std::vector<int64_t> eps{1};
        if (base.model.num_experts > 0)
          for (int64_t ep = 2; ep <= dp; ep *= 2)
            if (dp % ep == 0) eps.push_back(ep);
        const std::vector<std::string> forms =
            cp > 1 ? std::vector<std::string>{"all_gather", "ring"} : std::vector<std::string>{"all_gather"};
        for (int64_t ep : eps)
          for (const std::string& form : forms)
            for (bool sp : tp > 1 ? std::vector<bool>{false, true} : std::vector<bool>{false})
              for (const RecomputeSpec& recompute : recompute_choices())
                for (const OffloadSpec& offload : offload_choices())
                  for (bool activation_offload : {false, true})
                    for (int64_t rows : {1, 2, 4, 8}) {
                      PlanInput in = base;
                      LayoutSpec& l = in.layout;
                      l = LayoutSpec{};
                      l.tp = tp;
                      l.pp = pp;
                      l.cp = cp;
                      l.cp_comm = form;
                      l.dp = dp;
                      l.ep = ep;
                      l.sequence_parallel = sp;
                      // A micro-batch of `rows` whole rows, each spread over the cp GPUs.
                      l.max_tokens_per_gpu = rows * base.workload.row_tokens / cp;
                      l.recompute = recompute;
                      l.offload = offload;
                      l.activation_offload = activation_offload;
                      // Under CP a micro-batch of one row: CP is for rows a GPU cannot hold, at
                      // lengths where more rows a micro-batch gain GEMMs nothing.
                      if (rows * dp > base.workload.global_batch || (cp > 1 && rows > 1)) continue;
                      // The recipe with this layout, for the GPUs searched: one its rules refuse is
                      // no candidate (the machine's capabilities are not known, as for `loom plan`).
                      Recipe candidate = recipe;
                      candidate.layout = l;
                      candidate.gpu_count = result.gpus;
                      if (!recipe_rules(candidate, &candidate.model_config, {}).empty()) continue;
                      Plan plan;
                      try {
                        plan = plan_layout(in);
                      } catch (const InputError&) {
                        continue;  // the global batch does not split over this dp
                      }
                      ++result.considered;
                      if (plan.fits) {
                        fits_without_cp |= cp == 1;
                        result.fitting.push_back(std::move(plan));
                      } else {
                        ++result.not_fitting;
                      }
                    }
      }
    }
  }
  std::stable_sort(result.fitting.begin(), result.fitting.end(), [](const Plan& a, const Plan& b) {
    if (a.time.tokens_per_s_per_gpu != b.time.tokens_per_s_per_gpu)
      return a.time.tokens_per_s_per_gpu > b.time.tokens_per_s_per_gpu;
    // At equal speed the one that holds less in all: activation offload, whose copies hide under
    // the layers' compute, only where the inputs do not fit on the GPU.
    const auto held = [](const Plan& p) {
      return p.memory.peak().device_bytes() + p.memory.peak().host_bytes();
    };
    return held(a) < held(b);
  });
  return result;
}

std::string search_to_text(const SearchResult& r, size_t top) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "loom plan --search: %lld layouts on %lld GPUs considered, %zu fit, %lld do not\n",
                static_cast<long long>(r.considered), static_cast<long long>(r.gpus), r.fitting.size(),
                static_cast<long long>(r.not_fitting));
  out += line;
  if (r.fitting.empty()) return out + "no layout fits\n";
  std::snprintf(line, sizeof line, "%4s %12s %6s %8s %9s  %s\n", "rank", "tokens/s/GPU", "MFU", "GiB",
                "step ms", "layout");
  out += line;
  for (size_t i = 0; i < std::min(top, r.fitting.size()); ++i) {
    const Plan& p = r.fitting[i];
    std::snprintf(line, sizeof line, "%4zu %12.0f %6.3f %8.2f %9.1f  %s\n", i + 1,
                  p.time.tokens_per_s_per_gpu, p.time.mfu,
                  static_cast<double>(p.memory.peak().device_bytes()) / static_cast<double>(kGiB),
                  1e3 * p.time.step_s, plan_layout_label(p.input, p.micro).c_str());
    out += line;
  }
  return out;
}

nlohmann::json search_to_json(const SearchResult& r, size_t top) {
  nlohmann::json ranked = nlohmann::json::array();
  for (size_t i = 0; i < std::min(top, r.fitting.size()); ++i) ranked.push_back(plan_to_json(r.fitting[i]));
  return {{"gpus", r.gpus},
          {"considered", r.considered},
          {"fitting", r.fitting.size()},
          {"not_fitting", r.not_fitting},
          {"ranked", ranked}};
}

}  // namespace loom
