// A CUDA stream held up from the host, for the tests of stream-ordered communication
// (NcclComm::on_stream, the overlapped TP collectives): what is queued behind the hold does
// not run until it is released, so a call that returns meanwhile has not waited for the
// stream, and work on another stream that finishes meanwhile did not wait for it.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace loom {

// A host function queued on the stream that returns once released, or after `limit` (so that
// a failing test cannot hang).
class StreamHold {
 public:
  StreamHold(cudaStream_t stream, std::chrono::milliseconds limit) : limit_(limit) {
    EXPECT_EQ(cudaLaunchHostFunc(stream, &StreamHold::hold, this), cudaSuccess);
  }
  // Releases the hold and gives the stream the limit's time to pass it: the host function
  // reads this object.
  ~StreamHold() {
    release();
    const auto end = std::chrono::steady_clock::now() + limit_;
    while (!finished_ && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  void release() { released_ = true; }
  bool finished() const { return finished_; }

 private:
  static void hold(void* self) {
    auto* h = static_cast<StreamHold*>(self);
    const auto end = std::chrono::steady_clock::now() + h->limit_;
    while (!h->released_ && std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    h->finished_ = true;
  }
  std::chrono::milliseconds limit_;
  std::atomic<bool> released_{false}, finished_{false};
};

// A non-blocking stream, synchronized and destroyed at the end of its scope.
struct TestStream {
  cudaStream_t s = nullptr;
  TestStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~TestStream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  TestStream(const TestStream&) = delete;
  TestStream& operator=(const TestStream&) = delete;
};

}  // namespace loom
