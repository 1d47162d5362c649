#include "io/param_source.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"

namespace loom {

namespace {

void copy_range(const float* data, int64_t numel, int64_t begin, int64_t count, float* dst) {
  LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= numel, "range past the end of the parameters");
  std::memcpy(dst, data + begin, static_cast<size_t>(count) * 4);
}

}  // namespace

void ArrayParamSource::read(int64_t begin, int64_t count, float* dst) {
  copy_range(data_, numel_, begin, count, dst);
}

void OwnedParamSource::read(int64_t begin, int64_t count, float* dst) {
  copy_range(data_.data(), static_cast<int64_t>(data_.size()), begin, count, dst);
}

std::vector<float> param_source_read_all(ParamSource& source, int64_t numel) {
  std::vector<float> all(static_cast<size_t>(numel));
  source.read(0, numel, all.data());
  return all;
}

HfTensorRanges::HfTensorRanges(const ParamTable& table) : total_numel_(table.total_numel) {
  const size_t n = table.hf_tensors.size();
  offsets_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const HfTensorSpec& spec = table.hf_tensors[i];
    const ParamSpec& p = table.params[static_cast<size_t>(spec.param)];
    const int64_t row_elems = p.shape[0] ? p.numel() / p.shape[0] : 0;
    offsets_[i] = p.offset + spec.row_offset * row_elems;
  }
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), size_t{0});
  std::stable_sort(order_.begin(), order_.end(),
                   [&](size_t a, size_t b) { return offsets_[a] < offsets_[b]; });
  int64_t next = 0;
  for (size_t i : order_) {
    LOOM_ASSERT(offsets_[i] == next,
                "HF tensors do not tile the parameter buffer at " + table.hf_tensors[i].hf_name);
    starts_.push_back(next);
    numels_.push_back(table.hf_tensors[i].shape.numel());
    next += numels_.back();
  }
  LOOM_ASSERT(next == total_numel_, "HF tensors do not cover the parameter buffer");
}

std::vector<HfTensorRanges::Piece> HfTensorRanges::pieces(int64_t begin, int64_t count) const {
  LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= total_numel_,
              "range [" + std::to_string(begin) + ", +" + std::to_string(count) + ") past the " +
                  std::to_string(total_numel_) + " parameters");
  std::vector<Piece> out;
  const int64_t end = begin + count;
  // The last tensor starting at or before `begin`; empty tensors are skipped by the loop.
  size_t k = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin());
  k = k == 0 ? 0 : k - 1;
  for (; k < order_.size() && starts_[k] < end; ++k) {
    const int64_t lo = std::max(begin, starts_[k]), hi = std::min(end, starts_[k] + numels_[k]);
    if (hi > lo) out.push_back({order_[k], lo - starts_[k], hi - lo, lo - begin});
  }
  return out;
}

}  // namespace loom
