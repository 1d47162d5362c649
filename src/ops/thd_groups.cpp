#include "ops/thd_groups.h"

#include <algorithm>

#include "ops/op_workspace.h"

namespace loom {
namespace {

constexpr int64_t kInt32Limit = (int64_t{1} << 31) - 1;

int64_t workspace(int64_t sequences, int64_t sequence_tokens, const ThdWorkspaceModel& model) {
  return sequences * sequence_tokens * model.bytes_per_token;
}

}  // namespace

ThdWorkspaceModel thd_workspace_model(const HeadLayout& heads, double dq_units, int64_t bound_bytes) {
  const double dq_token = 4.0 * static_cast<double>(heads.q_heads * std::max<int64_t>(heads.head_dim, 128));
  return {static_cast<int64_t>(dq_units * dq_token), bound_bytes, heads.total_heads() * heads.head_dim};
}

int64_t thd_bucketed_sequences(int64_t count, int64_t sequence_tokens, const ThdWorkspaceModel& model) {
  int64_t floor = op_workspace::kThdMinSequences;
  while (floor > 1 && workspace(floor, sequence_tokens, model) > model.bound_bytes) floor /= 2;
  return op_workspace::power_of_two_at_least(count, floor);
}

std::vector<ThdGroup> thd_backward_groups(std::span<const int32_t> offsets, const ThdWorkspaceModel& model) {
  using op_workspace::kThdMinSequenceTokens;
  using op_workspace::power_of_two_at_least;
  std::vector<ThdGroup> groups;
  const auto count = static_cast<int64_t>(offsets.size()) - 1;
  const auto length = [&](int64_t i) {
    return int64_t{offsets[static_cast<size_t>(i + 1)]} - offsets[static_cast<size_t>(i)];
  };
  const auto shape = [&](ThdGroup& g, int64_t longest) {
    g.sequence_tokens = power_of_two_at_least(longest, kThdMinSequenceTokens);
    g.sequences = thd_bucketed_sequences(g.count, g.sequence_tokens, model);
    g.workspace_bytes = workspace(g.sequences, g.sequence_tokens, model);
  };
  for (int64_t i = 0; i < count;) {
    ThdGroup group{i, 1, offsets[static_cast<size_t>(i)], length(i)};
    int64_t longest = length(i);
    shape(group, longest);
    for (int64_t j = i + 1; j < count; ++j) {
      ThdGroup wider = group;
      wider.count += 1;
      wider.tokens += length(j);
      shape(wider, std::max(longest, length(j)));
      // The window's last offset (its tokens' end) in elements of the widest tensor.
      if (wider.workspace_bytes > model.bound_bytes || wider.tokens * model.token_elements > kInt32Limit)
        break;
      group = wider;
      longest = std::max(longest, length(j));
    }
    groups.push_back(group);
    i += group.count;
  }
  return groups;
}

}  // namespace loom
