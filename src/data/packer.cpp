#include "data/packer.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace loom {
namespace {
__extension__ typedef unsigned __int128 uint128;  // the multiply-high of the permutation
}  // namespace

std::vector<uint64_t> data_permutation(uint64_t n, uint64_t seed) {
  std::vector<uint64_t> p(n);
  for (uint64_t i = 0; i < n; ++i) p[i] = i;
  uint64_t state = seed;
  auto next = [&state] {
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (uint64_t i = n; i-- > 1;) {
    const uint64_t j = static_cast<uint64_t>((static_cast<uint128>(next()) * (i + 1)) >> 64);
    std::swap(p[i], p[j]);
  }
  return p;
}

RowPacker::RowPacker(int64_t row_tokens, int32_t eos_id, RowSink sink)
    : row_tokens_(row_tokens), eos_id_(eos_id), sink_(std::move(sink)) {
  if (row_tokens < 2) throw_input_error("row_tokens", std::to_string(row_tokens) + ", expected at least 2");
  tokens_.reserve(static_cast<size_t>(row_tokens));
  mask_.reserve(static_cast<size_t>(row_tokens));
}

void RowPacker::push(int32_t token, uint8_t mask) {
  tokens_.push_back(token);
  mask_.push_back(mask);
  if (static_cast<int64_t>(tokens_.size()) < row_tokens_) return;
  int64_t targets = 0;
  for (size_t t = 1; t < mask_.size(); ++t) targets += mask_[t];
  if (targets > 0) {
    sink_(tokens_.data(), mask_.data());
    ++stats_.rows;
    stats_.supervised_tokens += targets + mask_[0];
  } else {
    ++stats_.rows_without_target;
  }
  tokens_.clear();
  mask_.clear();
}

void RowPacker::add(std::span<const int32_t> tokens, std::span<const uint8_t> loss_mask) {
  LOOM_ASSERT(tokens.size() == loss_mask.size(), "tokens and loss mask of one conversation differ in length");
  if (stats_.conversations > 0) push(eos_id_, 0);
  ++stats_.conversations;
  for (size_t i = 0; i < tokens.size(); ++i) push(tokens[i], loss_mask[i]);
}

PackStats RowPacker::finish() {
  stats_.tail_tokens_dropped = static_cast<int64_t>(tokens_.size());
  tokens_.clear();
  mask_.clear();
  return stats_;
}

IsolatedPlan isolated_pack_plan(std::span<const uint64_t> lengths, int64_t row_tokens, TooLong too_long,
                                uint64_t seed) {
  IsolatedPlan plan;
  const auto limit = static_cast<uint64_t>(row_tokens);
  std::vector<uint64_t> order;
  for (uint64_t c : data_permutation(lengths.size(), seed)) {
    if (lengths[c] > limit) {
      if (too_long == TooLong::drop) {
        ++plan.too_long_dropped;
        continue;
      }
      ++plan.too_long_truncated;
    }
    if (lengths[c] > 0) order.push_back(c);
  }
  auto length = [&](uint64_t c) { return std::min(lengths[c], limit); };
  std::stable_sort(order.begin(), order.end(), [&](uint64_t a, uint64_t b) { return length(a) > length(b); });
  // Open rows by (free space, opening order): lower_bound finds the best fit, and of equal
  // fits the row opened first.
  std::set<std::pair<uint64_t, size_t>> open;
  std::vector<std::vector<uint64_t>> rows;
  for (uint64_t c : order) {
    auto best = open.lower_bound({length(c), 0});
    size_t row = rows.size();
    uint64_t free = limit;
    if (best != open.end()) {
      row = best->second;
      free = best->first;
      open.erase(best);
    } else {
      rows.emplace_back();
    }
    rows[row].push_back(c);
    free -= length(c);
    if (free > 0) open.insert({free, row});
  }
  for (uint64_t r : data_permutation(rows.size(), seed + 1)) plan.rows.push_back(std::move(rows[r]));
  return plan;
}

}  // namespace loom
