#include "parallel/micro_batching.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace loom {

namespace {

int64_t tokens_of(const std::vector<int64_t>& bin, const std::vector<int64_t>& lengths) {
  int64_t sum = 0;
  for (int64_t row : bin) sum += lengths[static_cast<size_t>(row)];
  return sum;
}

// slime's _split_bin_by_tokens: longest first (a stable sort), each row to the lighter half.
std::pair<std::vector<int64_t>, std::vector<int64_t>> split_bin(const std::vector<int64_t>& bin,
                                                                const std::vector<int64_t>& lengths) {
  std::vector<int64_t> order = bin;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return lengths[static_cast<size_t>(a)] > lengths[static_cast<size_t>(b)];
  });
  std::pair<std::vector<int64_t>, std::vector<int64_t>> halves;
  int64_t sums[2] = {0, 0};
  for (int64_t row : order) {
    int h = sums[0] <= sums[1] ? 0 : 1;
    (h == 0 ? halves.first : halves.second).push_back(row);
    sums[h] += lengths[static_cast<size_t>(row)];
  }
  return halves;
}

// slime's expand_bins_by_splitting: grows `bins` towards `target` by splitting the
// multi-row bin with the most tokens (ties: the highest index, as Python's max over
// (sum, index) tuples picks); stops when only single-row bins are left.
void expand_bins(std::vector<std::vector<int64_t>>& bins, size_t target,
                 const std::vector<int64_t>& lengths) {
  while (bins.size() < target) {
    int64_t best_sum = -1;
    size_t best = bins.size();
    for (size_t i = 0; i < bins.size(); ++i) {
      if (bins[i].size() < 2) continue;
      int64_t sum = tokens_of(bins[i], lengths);
      if (sum >= best_sum) {
        best_sum = sum;
        best = i;
      }
    }
    if (best == bins.size()) return;
    auto [left, right] = split_bin(bins[best], lengths);
    bins[best] = std::move(left);
    bins.push_back(std::move(right));
  }
}

}  // namespace

std::vector<std::vector<int64_t>> micro_batches_first_fit(const std::vector<int64_t>& row_lengths,
                                                          int64_t cap) {
  std::vector<std::vector<int64_t>> bins;
  std::vector<int64_t> sums;
  for (size_t row = 0; row < row_lengths.size(); ++row) {
    int64_t length = row_lengths[row];
    auto fits = std::find_if(sums.begin(), sums.end(), [&](int64_t s) { return s + length <= cap; });
    if (fits == sums.end()) {
      bins.push_back({static_cast<int64_t>(row)});
      sums.push_back(length);
    } else {
      size_t j = static_cast<size_t>(fits - sums.begin());
      bins[j].push_back(static_cast<int64_t>(row));
      sums[j] += length;
    }
  }
  return bins;
}

MicroBatchPlan micro_batches_plan(const std::vector<int64_t>& row_lengths, int64_t max_tokens_per_gpu, int cp,
                                  int dp) {
  LOOM_ASSERT(max_tokens_per_gpu > 0 && cp >= 1 && dp >= 1, "micro-batching needs a positive cap, cp and dp");
  const size_t rows = row_lengths.size();
  const size_t ranks = static_cast<size_t>(dp);
  if (rows < ranks)
    throw_input_error("workload.global_batch, layout.dp", "a step of " + std::to_string(rows) +
                                                              " rows cannot give each of " +
                                                              std::to_string(dp) + " DP ranks a row");

  std::vector<std::vector<int64_t>> bins = micro_batches_first_fit(row_lengths, max_tokens_per_gpu * cp);
  const size_t target = std::max((bins.size() + ranks - 1) / ranks * ranks, ranks);
  expand_bins(bins, target, row_lengths);
  if (bins.size() != target)
    throw_input_error("workload.global_batch, layout.dp",
                      "the " + std::to_string(rows) + " rows of a step make " + std::to_string(bins.size()) +
                          " micro-batches even split one row each, and DP " + std::to_string(dp) + " needs " +
                          std::to_string(target) + " (a multiple of dp)");

  MicroBatchPlan plan;
  plan.per_rank.resize(ranks);
  for (size_t k = 0; k < bins.size(); ++k) plan.per_rank[k % ranks].push_back(std::move(bins[k]));
  return plan;
}

}  // namespace loom
