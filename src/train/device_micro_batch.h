// A micro-batch on the GPU: its token ids and targets copied into device memory, the rows
// as they are (host RowSpans). What both CUDA engines run the model on.
#pragma once

#include <cuda_runtime.h>

#include "core/allocator.h"
#include "model/qwen3.h"
#include "ops/cuda/cuda_check.h"
#include "train/rows.h"

namespace loom {

// Allocates the ids and targets in `arena` and queues their copies on `stream`; `batch` must
// stay alive until the stream has run them.
inline MicroBatch micro_batch_to_device(const MicroBatchData& batch, TensorAllocator& arena,
                                        cudaStream_t stream) {
  const int64_t t = static_cast<int64_t>(batch.ids.size());
  MicroBatch b{arena.allocate({t}, DType::i32, "token ids"), arena.allocate({t}, DType::i32, "targets"),
               batch.rows};
  LOOM_CUDA_CHECK(cudaMemcpyAsync(b.ids.data, batch.ids.data(), static_cast<size_t>(t) * 4,
                                  cudaMemcpyHostToDevice, stream));
  LOOM_CUDA_CHECK(cudaMemcpyAsync(b.targets.data, batch.targets.data(), static_cast<size_t>(t) * 4,
                                  cudaMemcpyHostToDevice, stream));
  return b;
}

}  // namespace loom
