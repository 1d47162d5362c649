// The EP hook of DecoderModel (model/decoder.h): the exchanges of a sparse layer's tokens
// between the ranks of its expert-parallel group (parallel/groups.h), as an interface of its
// own, as TpCollectives is for TP, so that the model calls them without knowing the Comm
// under them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace loom {

class EpCollectives {
 public:
  virtual ~EpCollectives() = default;
  // Every rank's `counts` (host values, n each: its rows of each expert) in rank order, [ep·n].
  virtual std::vector<int32_t> all_gather_counts(const std::vector<int32_t>& counts) = 0;
  // All-to-all of rows (an all-to-all-v): this rank's send rows [Σ_{q<r} send_rows[q], + send_rows[r])
  // go to rank r, which places them at its recv rows [Σ_{q<s} recv_rows[q], + recv_rows[s]) for
  // this rank s. send_rows and recv_rows have one entry a rank; what rank s sends rank r is
  // what r expects from s. send [≥ Σ send_rows, H] and recv [≥ Σ recv_rows, H] of one dtype.
  virtual void all_to_all(Tensor recv, const std::vector<int64_t>& recv_rows, Tensor send,
                          const std::vector<int64_t>& send_rows) = 0;
};

}  // namespace loom
