// Stream-ordered helpers for code outside the CUDA backend (the engine's CUDA parameter
// store, train/cuda_param_store.cpp): copies, fills and waits on a stream, and a side
// stream whose work runs beside a main stream's until the main stream joins it. They keep
// the CUDA runtime's calls, and their error checks, inside ops/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/allocator.h"

namespace loom::cuda {

// Queued on `stream`: dst = src (any direction the pointers' memory allows), or bytes of
// `value`. `src` must stay valid until the stream has run the copy.
void copy_async(void* dst, const void* src, size_t bytes, cudaStream_t stream);
void fill_async(void* dst, int value, size_t bytes, cudaStream_t stream);
// The host waits for the work queued on `stream` so far.
void synchronize(cudaStream_t stream);
// This host thread's current device: `index` among the visible ones; which one it is.
void set_device(int index);
int current_device();
// An i32 tensor of `arena` holding `values`, copied on `stream` (values must outlive the copy).
Tensor upload_i32(const std::vector<int32_t>& values, TensorAllocator& arena, cudaStream_t stream,
                  const char* what);

// A non-blocking stream for work that may run beside a main stream's: start_after orders
// what is queued on it next after the main stream's work so far; join_into makes the main
// stream's later work wait for what was queued on it so far.
class SideStream {
 public:
  SideStream();
  // Waits for the stream's work (an error surfaces elsewhere: no throwing from here).
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;

  cudaStream_t get() const { return stream_; }
  void start_after(cudaStream_t main);
  void join_into(cudaStream_t main);

 private:
  cudaStream_t stream_ = nullptr;
  cudaEvent_t main_done_ = nullptr, side_done_ = nullptr;
};

}  // namespace loom::cuda
