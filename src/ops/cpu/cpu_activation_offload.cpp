#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "core/error.h"
#include "ops/activation_offload.h"

namespace loom {
namespace {

class CpuActivationOffload final : public ActivationOffload {
 public:
  Tensor slot(size_t index, Shape shape, DType dtype) override {
    Tensor t{nullptr, shape, dtype, Device::cpu};
    std::vector<uint8_t>& bytes = slots_[index % kSlots];
    bytes.resize(std::max(bytes.size(), t.nbytes()));
    poison(bytes);
    t.data = bytes.data();
    inputs_[index].tensor = t;
    return t;
  }

  void to_host(size_t index) override {
    Input& in = input(index);
    in.host.resize(in.tensor.nbytes());
    std::memcpy(in.host.data(), in.tensor.data, in.tensor.nbytes());
  }

  Tensor from_host(size_t index, size_t prefetch) override {
    Input& in = input(index);
    LOOM_ASSERT(in.host.size() == in.tensor.nbytes(), "a chunk input fetched before it went to the host");
    // The slot may have been handed to another chunk since: it is this chunk's again.
    Tensor t = slot(index, in.tensor.shape, in.tensor.dtype);
    std::memcpy(t.data, in.host.data(), t.nbytes());
    (void)prefetch;  // the copy is synchronous here: nothing to start early
    return t;
  }

  int64_t host_bytes() const override {
    int64_t total = 0;
    for (const auto& [index, in] : inputs_) total += static_cast<int64_t>(in.host.size());
    return total;
  }
  int64_t device_bytes() const override {
    int64_t total = 0;
    for (const std::vector<uint8_t>& s : slots_) total += static_cast<int64_t>(s.size());
    return total;
  }

 private:
  struct Input {
    Tensor tensor;              // where it was written (its slot), its shape and dtype
    std::vector<uint8_t> host;  // the host arena's copy
  };
  Input& input(size_t index) {
    auto found = inputs_.find(index);
    LOOM_ASSERT(found != inputs_.end(), "a chunk input that never had a slot");
    return found->second;
  }
  // A slot handed out again holds NaN until its new chunk writes it (fp32 NaN bytes: 0xFF).
  static void poison(std::vector<uint8_t>& bytes) { std::fill(bytes.begin(), bytes.end(), uint8_t{0xFF}); }

  std::vector<uint8_t> slots_[kSlots];
  std::map<size_t, Input> inputs_;
};

}  // namespace

std::unique_ptr<ActivationOffload> cpu_activation_offload() {
  return std::make_unique<CpuActivationOffload>();
}

}  // namespace loom
