// NcclComm on one GPU: every call in a world of one, splits, and the timeout of a world
// whose other rank never joins. Skipped with a message where no GPU is visible. Run with
// NCCL_NVLS_ENABLE=0 on the lent machines (docs/parallel.md).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "parallel/nccl_comm.h"

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
