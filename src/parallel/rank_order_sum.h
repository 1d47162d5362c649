// The deterministic sum every CPU Comm computes (InProcessComm, SocketComm), shared so that
// a run of processes gives the same bits as the threaded tests.
//
// out[j] = Σ_r inputs[r][offset + j], r in rank order, acc = x_0 + x_1 + ... + x_{n-1}:
// f32 in f32, f64 in f64, bf16 accumulated in f32 and rounded once to bf16 (nearest even),
// i32 wrapping (as NCCL's int32 sum). inputs: one pointer per rank, each [offset + count]
// elements of dtype; out: [count], not aliasing an input.
#pragma once

#include <cstddef>
#include <vector>

#include "core/dtype.h"

namespace loom {

void sum_in_rank_order(void* out, const std::vector<const void*>& inputs, size_t offset, size_t count,
                       DType dtype);

}  // namespace loom
