// fp32 parameters read piece by piece: flat ranges [begin, begin + count) of the layout a
// ParamTable gives (model/param_table.h), so that a consumer holding its own copy of the
// weights (the CUDA engine: bf16 on the GPU, remainders on the GPU or pinned on the host) never
// needs a host array of all of them beside it (4 B a parameter, 33 GB at 8B).
//
// Sources: random init (io/init.h), an HF checkpoint (io/hf_checkpoint.h), an array, and a
// trained engine's masters (train/engine.h); hf_checkpoint_save writes from one.
#pragma once

#include <cstdint>
#include <vector>

#include "model/param_table.h"

namespace loom {

class ParamSource {
 public:
  virtual ~ParamSource() = default;
  // Fills dst[0, count) with the elements [begin, begin + count) of the flat buffer;
  // 0 ≤ begin, begin + count ≤ the table's total_numel. Any range, in any order; the values
  // do not depend on how the buffer is cut into ranges.
  virtual void read(int64_t begin, int64_t count, float* dst) = 0;
};

// Over an array of `numel` elements the caller keeps alive.
class ArrayParamSource final : public ParamSource {
 public:
  ArrayParamSource(const float* data, int64_t numel) : data_(data), numel_(numel) {}
  explicit ArrayParamSource(const std::vector<float>& data)
      : ArrayParamSource(data.data(), static_cast<int64_t>(data.size())) {}
  void read(int64_t begin, int64_t count, float* dst) override;

 private:
  const float* data_;
  int64_t numel_;
};

// Over an array it owns: what a source over an engine that holds (or gathers) full fp32
// tensors gives.
class OwnedParamSource final : public ParamSource {
 public:
  explicit OwnedParamSource(std::vector<float> data) : data_(std::move(data)) {}
  void read(int64_t begin, int64_t count, float* dst) override;

 private:
  std::vector<float> data_;
};

// The whole flat buffer of `numel` elements, for consumers that keep fp32 parameters anyway
// (the CPU engines).
std::vector<float> param_source_read_all(ParamSource& source, int64_t numel);

// The HF tensors of a table in flat order: the map from a flat range to the pieces of the
// tensors it crosses. The tensors tile [0, total_numel) (checked).
class HfTensorRanges {
 public:
  explicit HfTensorRanges(const ParamTable& table);

  // One piece of a range: elements [first, first + count) of table.hf_tensors[tensor], which
  // go to dst + at for a range read into dst.
  struct Piece {
    size_t tensor;
    int64_t first;
    int64_t count;
    int64_t at;
  };
  // The pieces of [begin, begin + count), in order.
  std::vector<Piece> pieces(int64_t begin, int64_t count) const;
  // Where table.hf_tensors[i] starts in the flat buffer.
  int64_t offset(size_t i) const { return offsets_[i]; }

 private:
  int64_t total_numel_;
  std::vector<size_t> order_;     // hf_tensors indices by flat offset
  std::vector<int64_t> starts_;   // flat offset of order_[k]
  std::vector<int64_t> offsets_;  // flat offset of hf_tensors[i]
  std::vector<int64_t> numels_;   // numel of order_[k]
};

}  // namespace loom
