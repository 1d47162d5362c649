// OverlappedTpCollectives (parallel/overlapped_tp_collectives.h) over NCCL in a world of one
// (label gpu; skipped with a message where no GPU is visible; NCCL runs one rank a GPU, so a
// collective here is a copy, but the streams and events around it are the real ones): a
// started collective reads what the compute stream wrote before it, the compute stream runs
// on while it is held up, wait() orders the compute stream's next work after it, and the
// engine's bounded wait (on_compute().synchronize) covers it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "parallel/nccl_comm.h"
#include "parallel/overlapped_tp_collectives.h"
#include "support/stream_hold.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
constexpr CommTimeout kTimeout = 60s;

class OverlappedTpCollectivesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      GTEST_SKIP() << "no CUDA device visible: the overlapped TP collectives test did not run";
    compute_ = std::make_unique<TestStream>();
    world_ = nccl_comm_create(nccl_unique_id(), 0, 1, 0, nullptr, kTimeout);
    tp_ = overlapped_tp_collectives_create(*world_, compute_->s, kTimeout);
    ASSERT_NE(tp_, nullptr);
  }
  Tensor device_i32(int64_t n) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, static_cast<size_t>(n) * 4), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, static_cast<size_t>(n) * 4), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the legacy stream's fill, before the streams' work
    buffers_.push_back(p);
    return Tensor{p, {n}, DType::i32, Device::cuda};
  }
  static std::vector<int32_t> host(const Tensor& t) {
    std::vector<int32_t> out(static_cast<size_t>(t.numel()));
    EXPECT_EQ(cudaMemcpy(out.data(), t.data, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  void TearDown() override {
    cudaDeviceSynchronize();
    tp_.reset();
    world_.reset();
    for (void* p : buffers_) cudaFree(p);
    compute_.reset();
  }

  std::unique_ptr<TestStream> compute_;  // made once a GPU is known to be there
  std::unique_ptr<Comm> world_;
  std::unique_ptr<OverlappedTpCollectives> tp_;
  std::vector<void*> buffers_;
};

TEST_F(OverlappedTpCollectivesTest, HasNoOverlappedFormOverAHostComm) {
  EXPECT_TRUE(tp_->on_compute().stream_ordered());
  // A Comm without a stream-ordered form (here a host Comm; HostStagedComm likewise).
  class HostOnly final : public Comm {
   public:
    HostOnly() : Comm("tp", 0, {0}) {}
    void all_reduce_sum(void*, size_t, DType, CommTimeout) override {}
    void reduce_scatter_sum(const void*, void*, size_t, DType, CommTimeout) override {}
    void all_gather(const void*, void*, size_t, DType, CommTimeout) override {}
    void broadcast(void*, size_t, DType, int, CommTimeout) override {}
    void barrier(CommTimeout) override {}
    void exchange(std::span<const P2POp>, CommTimeout) override {}
    std::unique_ptr<Comm> split(const std::vector<int>&, const std::string&, CommTimeout) override {
      return nullptr;
    }
  } host_only;
  EXPECT_EQ(overlapped_tp_collectives_create(host_only, compute_->s, kTimeout), nullptr);
}

TEST_F(OverlappedTpCollectivesTest, StartedCollectivesRunBesideTheComputeStream) {
  constexpr int64_t n = 4096;
  const std::vector<int32_t> pattern(n, 0x01010101);  // what a memset of bytes 1 writes
  Tensor part = device_i32(n), full = device_i32(n), reduced = device_i32(n), copy = device_i32(n),
         unrelated = device_i32(n);
  // Each kind once, waited for: whatever NCCL sets up on a first use is done.
  tp_->wait(tp_->start_all_gather(full, part));
  tp_->wait(tp_->start_reduce_scatter(reduced, full));
  tp_->wait(tp_->start_all_reduce(reduced));
  tp_->on_compute().synchronize(kTimeout);

  // The compute stream writes `part` while held; the started gather must read that write.
  StreamHold compute_hold(compute_->s, 30s);
  ASSERT_EQ(cudaMemsetAsync(part.data, 1, n * 4, compute_->s), cudaSuccess);
  const TpPending gathered = tp_->start_all_gather(full, part);
  compute_hold.release();
  // The side stream held behind the gather: compute work that does not wait for it runs.
  StreamHold side_hold(tp_->side_stream(), 30s);
  const TpPending reduced_pending = tp_->start_reduce_scatter(reduced, full);
  ASSERT_EQ(cudaMemsetAsync(unrelated.data, 1, n * 4, compute_->s), cudaSuccess);
  cudaEvent_t unrelated_done = nullptr, copy_done = nullptr;
  ASSERT_EQ(cudaEventCreate(&unrelated_done), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&copy_done), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(unrelated_done, compute_->s), cudaSuccess);
  const auto end = std::chrono::steady_clock::now() + 20s;
  while (cudaEventQuery(unrelated_done) == cudaErrorNotReady && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(cudaEventQuery(unrelated_done), cudaSuccess)
      << "the compute stream waited for a started collective";
  EXPECT_FALSE(side_hold.finished());
  // After wait, the compute stream's next work waits for the collectives.
  tp_->wait(gathered);
  tp_->wait(reduced_pending);
  ASSERT_EQ(cudaMemcpyAsync(copy.data, reduced.data, n * 4, cudaMemcpyDeviceToDevice, compute_->s),
            cudaSuccess);
  ASSERT_EQ(cudaEventRecord(copy_done, compute_->s), cudaSuccess);
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(cudaEventQuery(copy_done), cudaErrorNotReady) << "wait did not order the compute stream";
  side_hold.release();
  tp_->on_compute().synchronize(kTimeout);
  EXPECT_EQ(host(full), pattern);
  EXPECT_EQ(host(copy), pattern);
  cudaEventDestroy(unrelated_done);
  cudaEventDestroy(copy_done);
}

// A started collective that never finishes ends the engine's bounded wait with the usual
// message, though it runs on the side stream and nothing on the compute stream waits for it.
TEST_F(OverlappedTpCollectivesTest, TheBoundedWaitCoversTheSideStream) {
  constexpr int64_t n = 16;
  Tensor part = device_i32(n), full = device_i32(n);
  tp_->wait(tp_->start_all_gather(full, part));
  tp_->on_compute().synchronize(kTimeout);
  StreamHold side_hold(tp_->side_stream(), 3s);  // released by its limit only
  tp_->start_all_gather(full, part);
  try {
    tp_->on_compute().synchronize(300ms);
    FAIL() << "no error";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(std::string(e.what()).find(": stream-ordered all_gather #"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("did not finish within 300 ms"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom
