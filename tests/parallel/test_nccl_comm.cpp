// NcclComm on one GPU: every call in a world of one, splits, the timeout of a world whose
// other rank never joins, and stream-ordered calls (on_stream): queued in stream order
// without a host wait, and synchronize's bounded wait. Skipped with a message where no GPU
// is visible. Run with NCCL_NVLS_ENABLE=0 on the lent machines (docs/parallel.md).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "parallel/nccl_comm.h"
#include "support/stream_hold.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
constexpr CommTimeout kTimeout = 60s;

bool have_gpu(std::string* why) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess)
    *why = std::string("no CUDA device: ") + cudaGetErrorString(e);
  else if (count == 0)
    *why = "no CUDA device visible";
  return e == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU()                    \
  do {                                        \
    std::string why;                          \
    if (!have_gpu(&why)) GTEST_SKIP() << why; \
  } while (0)

// A device copy of host values.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(const std::vector<T>& host) : count(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr, count * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> host() const {
    std::vector<T> out(count);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
};

TEST(NcclComm, WorldOfOne) {
  SKIP_WITHOUT_GPU();
  std::unique_ptr<Comm> world = nccl_comm_create(nccl_unique_id(), 0, 1, 0, nullptr, kTimeout);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->name(), "world");

  DeviceBuffer<float> f({1.5f, -2.0f, 3.25f});
  world->all_reduce_sum(f.ptr, 3, DType::f32, kTimeout);
  EXPECT_EQ(f.host(), (std::vector<float>{1.5f, -2.0f, 3.25f}));

  DeviceBuffer<bf16> b({float_to_bf16(0.75f), float_to_bf16(-8.0f)});
  world->all_reduce_sum(b.ptr, 2, DType::bf16, kTimeout);
  EXPECT_EQ(bf16_to_float(b.host()[0]), 0.75f);
  EXPECT_EQ(bf16_to_float(b.host()[1]), -8.0f);

  DeviceBuffer<int32_t> i({7, -3});
  world->all_reduce_sum(i.ptr, 2, DType::i32, kTimeout);
  EXPECT_EQ(i.host(), (std::vector<int32_t>{7, -3}));

  DeviceBuffer<double> d({0.1, 0.2});
  DeviceBuffer<double> d_out({0.0, 0.0});
  world->reduce_scatter_sum(d.ptr, d_out.ptr, 2, DType::f64, kTimeout);
  EXPECT_EQ(d_out.host(), (std::vector<double>{0.1, 0.2}));

  DeviceBuffer<float> g_out({0.0f, 0.0f, 0.0f});
  world->all_gather(f.ptr, g_out.ptr, 3, DType::f32, kTimeout);
  EXPECT_EQ(g_out.host(), f.host());

  world->broadcast(i.ptr, 2, DType::i32, 0, kTimeout);
  EXPECT_EQ(i.host(), (std::vector<int32_t>{7, -3}));
  world->barrier(kTimeout);

  // Send to and receive from itself in one batched exchange.
  DeviceBuffer<float> recv({0.0f, 0.0f, 0.0f});
  P2POp ops[2] = {{P2POp::Kind::send, f.ptr, 3, DType::f32, 0},
                  {P2POp::Kind::recv, recv.ptr, 3, DType::f32, 0}};
  world->exchange(ops, kTimeout);
  EXPECT_EQ(recv.host(), f.host());

  std::unique_ptr<Comm> tp = world->split({0}, "tp", kTimeout);
  ASSERT_NE(tp, nullptr);
  EXPECT_EQ(tp->name(), "tp");
  EXPECT_EQ(tp->world_ranks(), std::vector<int>{0});
  tp->all_reduce_sum(f.ptr, 3, DType::f32, kTimeout);
  EXPECT_EQ(f.host(), (std::vector<float>{1.5f, -2.0f, 3.25f}));
  EXPECT_EQ(world->split({}, "none", kTimeout), nullptr);
}

// A stream-ordered call returns while the stream is still held, and reads what the work
// queued before it wrote (a memset that runs only once the hold is released); the work
// queued after it sees its result; synchronize waits for all of it.
TEST(NcclComm, StreamOrderedCallsReturnBeforeTheStreamRunsThem) {
  SKIP_WITHOUT_GPU();
  TestStream stream;
  std::unique_ptr<Comm> world = nccl_comm_create(nccl_unique_id(), 0, 1, 0, stream.s, kTimeout);
  std::unique_ptr<Comm> queued = world->on_stream(stream.s);
  ASSERT_NE(queued, nullptr);
  EXPECT_FALSE(world->stream_ordered());
  EXPECT_TRUE(queued->stream_ordered());
  EXPECT_EQ(queued->name(), "world");
  constexpr size_t n = 1000;
  DeviceBuffer<int32_t> src(std::vector<int32_t>(n, 0)), gathered(std::vector<int32_t>(n, 0)),
      scattered(std::vector<int32_t>(n, 0)), copied(std::vector<int32_t>(n, 0));
  // Each kind of call once synchronously first: whatever NCCL sets up on a first use is done.
  world->all_gather(src.ptr, gathered.ptr, n, DType::i32, kTimeout);
  world->reduce_scatter_sum(gathered.ptr, scattered.ptr, n, DType::i32, kTimeout);
  world->all_reduce_sum(scattered.ptr, n, DType::i32, kTimeout);
  world->broadcast(scattered.ptr, n, DType::i32, 0, kTimeout);

  StreamHold hold(stream.s, 30s);
  ASSERT_EQ(cudaMemsetAsync(src.ptr, 1, n * 4, stream.s), cudaSuccess);  // 0x01010101 each
  queued->all_gather(src.ptr, gathered.ptr, n, DType::i32, kTimeout);
  queued->reduce_scatter_sum(gathered.ptr, scattered.ptr, n, DType::i32, kTimeout);
  queued->all_reduce_sum(scattered.ptr, n, DType::i32, kTimeout);
  queued->broadcast(scattered.ptr, n, DType::i32, 0, kTimeout);
  ASSERT_EQ(cudaMemcpyAsync(copied.ptr, scattered.ptr, n * 4, cudaMemcpyDeviceToDevice, stream.s),
            cudaSuccess);
  EXPECT_FALSE(hold.finished()) << "a stream-ordered call waited for the stream";
  hold.release();
  queued->synchronize(kTimeout);
  EXPECT_TRUE(hold.finished());
  EXPECT_EQ(cudaStreamQuery(stream.s), cudaSuccess) << "synchronize returned before the stream ran";
  const std::vector<int32_t> expected(n, 0x01010101);
  EXPECT_EQ(gathered.host(), expected);
  EXPECT_EQ(copied.host(), expected);

  // A split of a stream-ordered Comm is stream-ordered on the same stream; a barrier on it
  // still returns only once every rank (here the one) has entered it.
  std::unique_ptr<Comm> tp = queued->split({0}, "tp", kTimeout);
  ASSERT_NE(tp, nullptr);
  EXPECT_TRUE(tp->stream_ordered());
  tp->all_reduce_sum(copied.ptr, n, DType::i32, kTimeout);
  tp->barrier(kTimeout);
  EXPECT_EQ(cudaStreamQuery(stream.s), cudaSuccess);
  EXPECT_EQ(copied.host(), expected);
  // The synchronous Comm of the group still works beside its stream-ordered one.
  world->all_reduce_sum(copied.ptr, n, DType::i32, kTimeout);
  EXPECT_EQ(copied.host(), expected);
}

// A collective that does not finish within the timeout (here: queued behind a hold that
// outlasts it) makes synchronize abort the communicator and throw, naming the collective,
// the ranks waited for and what is queued behind it; every Comm of that communicator is
// unusable afterwards.
TEST(NcclComm, SynchronizeGivesUpOnACollectiveThatDoesNotFinish) {
  SKIP_WITHOUT_GPU();
  TestStream stream;
  std::unique_ptr<Comm> world = nccl_comm_create(nccl_unique_id(), 0, 1, 0, stream.s, kTimeout);
  std::unique_ptr<Comm> queued = world->on_stream(stream.s);
  DeviceBuffer<float> src({1.0f, 2.0f}), dst({0.0f, 0.0f});
  world->all_gather(src.ptr, dst.ptr, 2, DType::f32, kTimeout);
  queued->all_gather(src.ptr, dst.ptr, 2, DType::f32, kTimeout);  // #1, finishes
  queued->synchronize(kTimeout);

  StreamHold hold(stream.s, 3s);  // released by its limit only, after the timeout below
  queued->all_gather(src.ptr, dst.ptr, 2, DType::f32, kTimeout);  // #2
  queued->all_reduce_sum(dst.ptr, 2, DType::f32, kTimeout);       // #3
  const auto start = std::chrono::steady_clock::now();
  try {
    queued->synchronize(300ms);
    FAIL() << "no error";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(
        std::string(e.what()).find("group 'world' (world ranks [0]) rank 0: stream-ordered all_gather #2 "
                                   "(2 F32) did not finish within 300 ms waiting for no peer (this "
                                   "rank alone) (1 more collective(s) queued behind it)"),
        std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  EXPECT_THROW(world->all_reduce_sum(dst.ptr, 2, DType::f32, kTimeout), RuntimeFailure);
  EXPECT_THROW(queued->synchronize(kTimeout), RuntimeFailure);
  EXPECT_EQ(cudaStreamSynchronize(stream.s), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(NcclComm, PeerThatNeverJoinsTimesOut) {
  SKIP_WITHOUT_GPU();
  auto start = std::chrono::steady_clock::now();
  try {
    nccl_comm_create(nccl_unique_id(), 0, 2, 0, nullptr, 2000ms);
    FAIL() << "no error";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL world rank 0 of 2: initialisation timed out after 2000 ms"),
              std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
}

}  // namespace
}  // namespace loom
