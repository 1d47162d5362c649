// InProcessComm: the collectives' results (rank-order sums, bit for bit), point to point,
// splits, and that a missing, mismatched or failed peer ends every rank with a message
// naming it instead of a hang.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "core/error.h"
#include "parallel/in_process_comm.h"

namespace loom {
namespace {

using namespace std::chrono_literals;

constexpr CommTimeout kLong = 20s;  // a healthy call never waits this long

template <typename F>
std::string failure_of(int size, F body) {
  try {
    run_in_process(size, body);
  } catch (const RuntimeFailure& e) {
    return e.what();
  }
  return "";
}

TEST(InProcessComm, AllReduceSumsInRankOrder) {
  // In f32, (1e8 + 1) − 1e8 + 1 = 1 only in rank order: 1e8 + 1 rounds to 1e8. Any other
  // order (e.g. a tree: (1e8 + 1) + (−1e8 + 1)) gives 0 or 2.
  const float values[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  std::vector<float> results(4);
  run_in_process(4, [&](Comm& world) {
    float x[2] = {values[world.rank()], static_cast<float>(world.rank())};
    world.all_reduce_sum(x, 2, DType::f32, kLong);
    EXPECT_EQ(x[1], 6.0f);
    results[static_cast<size_t>(world.rank())] = x[0];
  });
  for (float r : results) EXPECT_EQ(r, 1.0f);
}

TEST(InProcessComm, AllReduceOtherDtypes) {
  run_in_process(3, [&](Comm& world) {
    const int r = world.rank();
    double d[1] = {0.1 * (r + 1)};
    world.all_reduce_sum(d, 1, DType::f64, kLong);
    EXPECT_EQ(d[0], (0.1 + 0.2) + 0.30000000000000004);  // rank order in f64

    // i32 wraps, as NCCL's int32 sum does.
    int32_t i[2] = {r == 0 ? std::numeric_limits<int32_t>::max() : 1, r};
    world.all_reduce_sum(i, 2, DType::i32, kLong);
    EXPECT_EQ(i[0], std::numeric_limits<int32_t>::min() + 1);
    EXPECT_EQ(i[1], 3);

    // bf16 accumulates in f32 and rounds once: 1 + 2^-8 + 2^-8 = 1 + 2^-7 (a bf16), where
    // rounding after each add would stay at 1 (1 + 2^-8 is a tie that rounds to even).
    bf16 b[1] = {float_to_bf16(r == 0 ? 1.0f : std::ldexp(1.0f, -8))};
    world.all_reduce_sum(b, 1, DType::bf16, kLong);
    EXPECT_EQ(bf16_to_float(b[0]), 1.0f + std::ldexp(1.0f, -7));
  });
}

TEST(InProcessComm, ReduceScatterAllGatherBroadcast) {
  run_in_process(4, [&](Comm& world) {
    const int r = world.rank(), n = world.size();
    // send[j] = 10·r + j over n·2 elements; rank r gets Σ_q send_q[2r + j].
    std::vector<float> send(8), recv(2);
    for (int j = 0; j < 8; ++j) send[static_cast<size_t>(j)] = static_cast<float>(10 * r + j);
    world.reduce_scatter_sum(send.data(), recv.data(), 2, DType::f32, kLong);
    for (int j = 0; j < 2; ++j)
      EXPECT_EQ(recv[static_cast<size_t>(j)], static_cast<float>(60 + n * (2 * r + j)));

    // All-gather in place: rank r's slice is its own input.
    std::vector<int32_t> gathered(8, -1);
    gathered[static_cast<size_t>(2 * r)] = r;
    gathered[static_cast<size_t>(2 * r + 1)] = 100 + r;
    world.all_gather(gathered.data() + 2 * r, gathered.data(), 2, DType::i32, kLong);
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(gathered[static_cast<size_t>(2 * q)], q);
      EXPECT_EQ(gathered[static_cast<size_t>(2 * q + 1)], 100 + q);
    }

    double value[3] = {static_cast<double>(r), 1.5 * r, -r * 1.0};
    world.broadcast(value, 3, DType::f64, 2, kLong);
    EXPECT_EQ(value[0], 2.0);
    EXPECT_EQ(value[1], 3.0);
    EXPECT_EQ(value[2], -2.0);
    world.barrier(kLong);
  });
}

TEST(InProcessComm, ExchangeRingAndSendRecv) {
  run_in_process(4, [&](Comm& world) {
    const int r = world.rank(), n = world.size();
    // Every rank sends right and receives from the left in one batched call.
    float out[3] = {float(r), float(r) + 0.5f, float(r) * 2};
    float in[3] = {};
    P2POp ops[2] = {{P2POp::Kind::send, out, 3, DType::f32, (r + 1) % n},
                    {P2POp::Kind::recv, in, 3, DType::f32, (r + n - 1) % n}};
    world.exchange(ops, kLong);
    const float left = static_cast<float>((r + n - 1) % n);
    EXPECT_EQ(in[0], left);
    EXPECT_EQ(in[1], left + 0.5f);
    EXPECT_EQ(in[2], left * 2);

    // Plain send/recv between pairs, several in a row, matched in order.
    for (int k = 0; k < 3; ++k) {
      int32_t v = 10 * r + k;
      if (r % 2 == 0) {
        world.send(&v, 1, DType::i32, r + 1, kLong);
      } else {
        world.recv(&v, 1, DType::i32, r - 1, kLong);
        EXPECT_EQ(v, 10 * (r - 1) + k);
      }
    }
  });
}

TEST(InProcessComm, SplitMakesIndependentGroups) {
  run_in_process(4, [&](Comm& world) {
    const int r = world.rank();
    std::vector<int> members = r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    std::unique_ptr<Comm> pair = world.split(members, "pair", kLong);
    ASSERT_NE(pair, nullptr);
    EXPECT_EQ(pair->name(), "pair");
    EXPECT_EQ(pair->size(), 2);
    EXPECT_EQ(pair->rank(), r / 2);
    EXPECT_EQ(pair->world_ranks(), members);
    int32_t x = r;
    pair->all_reduce_sum(&x, 1, DType::i32, kLong);
    EXPECT_EQ(x, r % 2 == 0 ? 2 : 4);

    // Only ranks 1 and 3 join; the others get no group.
    std::unique_ptr<Comm> odd =
        world.split(r % 2 ? std::vector<int>{1, 3} : std::vector<int>{}, "odd", kLong);
    EXPECT_EQ(odd == nullptr, r % 2 == 0);
    if (odd) {
      std::unique_ptr<Comm> single = odd->split({odd->rank()}, "single", kLong);
      EXPECT_EQ(single->world_ranks(), std::vector<int>{r});
      float y = 1.5f;
      single->all_reduce_sum(&y, 1, DType::f32, kLong);
      EXPECT_EQ(y, 1.5f);
    }
  });
}

// Host Comms have no device stream: their calls finish before returning, so there is no
// stream-ordered form of them and nothing for synchronize to wait for.
TEST(InProcessComm, HasNoStreamOrderedForm) {
  run_in_process(2, [&](Comm& world) {
    EXPECT_FALSE(world.stream_ordered());
    EXPECT_EQ(world.on_stream(nullptr), nullptr);
    world.synchronize(kLong);
  });
}

TEST(InProcessComm, MissingPeerTimesOutNamingIt) {
  auto start = std::chrono::steady_clock::now();
  std::string message = failure_of(3, [](Comm& world) {
    if (world.rank() == 2) return;  // never takes part
    float x = 1;
    world.all_reduce_sum(&x, 1, DType::f32, 200ms);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  EXPECT_NE(message.find("group 'world'"), std::string::npos) << message;
  EXPECT_NE(message.find("all_reduce #1 (1 F32) timed out after 200 ms waiting for rank 2 (world rank 2)"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("rank 1 (world rank 1)"), std::string::npos) << message;  // rank 1 did arrive
}

TEST(InProcessComm, RecvFromSilentPeerNamesIt) {
  std::string message = failure_of(2, [](Comm& world) {
    std::unique_ptr<Comm> pp = world.split({0, 1}, "pp", kLong);
    if (pp->rank() == 1) return;
    float x[4];
    pp->recv(x, 4, DType::f32, 1, 150ms);
  });
  EXPECT_NE(message.find("group 'pp' (world ranks [0, 1]) rank 0: recv of 4 F32 from rank 1 (world rank 1) "
                         "timed out after 150 ms"),
            std::string::npos)
      << message;
}

TEST(InProcessComm, SendsAreSynchronousLikeNccl) {
  // Two blocking sends towards each other deadlock on NCCL; here they time out.
  std::string message = failure_of(2, [](Comm& world) {
    float x = 1;
    world.send(&x, 1, DType::f32, 1 - world.rank(), 150ms);
    world.recv(&x, 1, DType::f32, 1 - world.rank(), 150ms);
  });
  EXPECT_NE(message.find("send of 1 F32 to rank"), std::string::npos) << message;
  EXPECT_NE(message.find("timed out"), std::string::npos) << message;
}

TEST(InProcessComm, MismatchedCollectivesFail) {
  std::string message = failure_of(2, [](Comm& world) {
    std::vector<float> x(5, 1.0f);
    world.all_reduce_sum(x.data(), world.rank() == 0 ? 4 : 5, DType::f32, kLong);
  });
  EXPECT_NE(message.find("mismatched collectives"), std::string::npos) << message;
  std::string p2p = failure_of(2, [](Comm& world) {
    float x[2] = {};
    if (world.rank() == 0)
      world.send(x, 2, DType::f32, 1, kLong);
    else
      world.recv(x, 1, DType::f32, 0, kLong);
  });
  EXPECT_NE(p2p.find("matched a send of 2 F32"), std::string::npos) << p2p;
}

TEST(InProcessComm, FailedRankStopsTheOthersAtOnce) {
  // Ranks 1..3 wait in a barrier with a long timeout; rank 0 throws. They must stop well
  // before the timeout, and the first rank's own error is the one reported.
  auto start = std::chrono::steady_clock::now();
  std::atomic<int> stopped{0};
  try {
    run_in_process(4, [&](Comm& world) {
      if (world.rank() == 0) throw std::runtime_error("boom on rank 0");
      try {
        world.barrier(kLong);
      } catch (const RuntimeFailure& e) {
        EXPECT_NE(std::string(e.what()).find("boom on rank 0"), std::string::npos) << e.what();
        ++stopped;
        throw;
      }
    });
    FAIL() << "run_in_process returned normally";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom on rank 0");
  }
  EXPECT_EQ(stopped.load(), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

}  // namespace
}  // namespace loom
