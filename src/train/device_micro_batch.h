// A micro-batch on the GPU: its token ids, targets and loss rows copied into device memory,
// the rows as they are (host RowSpans). What both CUDA engines run the model on.
#pragma once

#include <cuda_runtime.h>

#include "core/allocator.h"
#include "model/qwen3.h"
#include "ops/cuda/cuda_check.h"
#include "train/rows.h"

namespace loom {

// Allocates the ids, targets and loss rows in `arena` and queues their copies on `stream`; `batch` must
// stay alive until the stream has run them.
inline MicroBatch micro_batch_to_device(const MicroBatchData& batch, TensorAllocator& arena,
                                        cudaStream_t stream) {
  const int64_t t = static_cast<int64_t>(batch.ids.size());
  MicroBatch b;
  b.ids = arena.allocate({t}, DType::i32, "token ids");
  b.targets = arena.allocate({t}, DType::i32, "targets");
  b.rows = batch.rows;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(b.ids.data, batch.ids.data(), static_cast<size_t>(t) * 4,
                                  cudaMemcpyHostToDevice, stream));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(b.targets.data, batch.targets.data(), static_cast<size_t>(t) * 4,
                                  cudaMemcpyHostToDevice, stream));
  const int64_t r = static_cast<int64_t>(batch.loss_positions.size());
  if (r > 0) {
    b.loss_positions = arena.allocate({r}, DType::i32, "loss row positions");
    b.loss_targets = arena.allocate({r}, DType::i32, "loss row targets");
    b.loss_rows = batch.loss_rows;
    LOOM_CUDA_CHECK(cudaMemcpyAsync(b.loss_positions.data, batch.loss_positions.data(),
                                    static_cast<size_t>(r) * 4, cudaMemcpyHostToDevice, stream));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(b.loss_targets.data, batch.loss_targets.data(),
                                    static_cast<size_t>(r) * 4, cudaMemcpyHostToDevice, stream));
  }
  return b;
}

}  // namespace loom
