#include "ops/cuda/stream.h"

#include "ops/cuda/cuda_check.h"

namespace loom::cuda {

void copy_async(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
}

void fill_async(void* dst, int value, size_t bytes, cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, stream));
}

void synchronize(cudaStream_t stream) {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

void set_device(int index) {
  LOOM_CUDA_CHECK(cudaSetDevice(index));
}

int current_device() {
  int device = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

Tensor upload_i32(const std::vector<int32_t>& values, TensorAllocator& arena, cudaStream_t stream,
                  const char* what) {
  Tensor t = arena.allocate({static_cast<int64_t>(values.size())}, DType::i32, what);
  copy_async(t.data, values.data(), values.size() * sizeof(int32_t), stream);
  return t;
}

SideStream::SideStream() {
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (cudaEvent_t* e : {&main_done_, &side_done_})
    LOOM_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
}

SideStream::~SideStream() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : {main_done_, side_done_})
    if (e) cudaEventDestroy(e);
  if (stream_) cudaStreamDestroy(stream_);
}

void SideStream::start_after(cudaStream_t main) {
  LOOM_CUDA_CHECK(cudaEventRecord(main_done_, main));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(stream_, main_done_, 0));
}

void SideStream::join_into(cudaStream_t main) {
  LOOM_CUDA_CHECK(cudaEventRecord(side_done_, stream_));
  LOOM_CUDA_CHECK(cudaStreamWaitEvent(main, side_done_, 0));
}

}  // namespace loom::cuda
