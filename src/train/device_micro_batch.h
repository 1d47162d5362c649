// A micro-batch on the GPU: its token ids, targets and loss rows copied into device memory,
// the rows as they are (host RowSpans). What both CUDA engines run the model on.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "core/allocator.h"
#include "model/qwen3.h"
#include "ops/cuda/cuda_check.h"
#include "train/rows.h"

namespace loom {

// Allocates the ids, targets and loss rows in `arena` and queues their copies on `stream`;
// `batch` must stay alive until the stream has run them.
inline MicroBatch micro_batch_to_device(const MicroBatchData& batch, TensorAllocator& arena,
                                        cudaStream_t stream) {
  auto upload = [&](const std::vector<int32_t>& values, const char* what) {
    const int64_t n = static_cast<int64_t>(values.size());
    Tensor t = arena.allocate({n}, DType::i32, what);
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(t.data, values.data(), static_cast<size_t>(n) * 4, cudaMemcpyHostToDevice, stream));
    return t;
  };
  MicroBatch b;
  b.ids = upload(batch.ids, "token ids");
  b.targets = upload(batch.targets, "targets");
  b.rows = batch.rows;
  if (!batch.loss_positions.empty()) {
    b.loss_positions = upload(batch.loss_positions, "loss row positions");
    b.loss_targets = upload(batch.loss_targets, "loss row targets");
    b.loss_rows = batch.loss_rows;
  }
  return b;
}

}  // namespace loom
