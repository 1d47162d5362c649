#include "optim/precision_master.h"

#include "core/parallel.h"

namespace loom {
namespace {

constexpr int64_t kGrain =
    1 << 16;  // elements: a split costs ~1 ns, so smaller chunks are not worth a thread

}  // namespace

void master_split_array(const float* master, int64_t n, uint16_t* bf16_bits, int16_t* remainder) {
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) master_split(master[i], &bf16_bits[i], &remainder[i]);
  });
}

void master_rebuild_array(const uint16_t* bf16_bits, const int16_t* remainder, int64_t n, float* master) {
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) master[i] = master_rebuild(bf16_bits[i], remainder[i]);
  });
}

}  // namespace loom
