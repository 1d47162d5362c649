// SocketComm between real processes (fork, ports chosen by the kernel): every op and dtype
// gives InProcessComm's bits; two ranks exchanging large buffers both ways do not
// deadlock; splits; a rank that never calls times out naming it; a rank that dies in the
// middle of a collective makes the others throw within the timeout, naming it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "core/error.h"
#include "parallel/in_process_comm.h"
#include "parallel/socket_comm.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr CommTimeout kTimeout = 10000ms;

// What the ranks of a forked world hand back: each rank's bytes and message.
struct Shared {
  static constexpr size_t kRanks = 4;
  static constexpr size_t kResultBytes = 8u << 20;
  static constexpr size_t kMessageBytes = 1024;
  struct Slot {
    uint64_t size;
    char message[kMessageBytes];
    uint8_t bytes[kResultBytes];
  } slots[kRanks];
};

struct RankOutcome {
  int exit_code = -1;  // -1: did not end within the limit (then killed)
  std::vector<uint8_t> bytes;
  std::string message;  // what the body threw, if anything
};

// Runs body(rank's world comm) in `size` forked processes joined through a real rendezvous
// and returns each one's result bytes (what body returned), or the message it threw.
// body runs after socket_world_join; a rank whose body throws exits 3, else 0 (after the
// rendezvous' finish). The rendezvous' own failure handler is silenced: these tests look at
// what SocketComm itself reports.
std::vector<RankOutcome> run_processes(int size, const std::function<std::vector<uint8_t>(Comm&)>& body,
                                       std::chrono::milliseconds limit = 30s) {
  EXPECT_LE(static_cast<size_t>(size), Shared::kRanks);
  void* memory = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(memory, MAP_FAILED);
  auto* shared = static_cast<Shared*>(memory);
  int port = 0;
  const int listen_fd = rendezvous_listen("127.0.0.1", 0, &port);
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      World world;
      world.rank = r;
      world.size = size;
      world.master_addr = "127.0.0.1";
      world.master_port = port;
      world.source = "torchrun";
      if (r == 0)
        world.rendezvous_fd = listen_fd;
      else
        ::close(listen_fd);
      Shared::Slot& slot = shared->slots[r];
      int code = 0;
      try {
        SocketWorld sockets = socket_world_join(world, kTimeout, [](const std::string&) {});
        std::vector<uint8_t> out = body(*sockets.comm);
        if (out.size() > Shared::kResultBytes) throw std::runtime_error("result too large for the test");
        slot.size = out.size();
        std::memcpy(slot.bytes, out.data(), out.size());
        sockets.rendezvous->finish(kTimeout);
      } catch (const std::exception& e) {
        std::strncpy(slot.message, e.what(), Shared::kMessageBytes - 1);
        code = 3;
      }
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  ::close(listen_fd);
  std::vector<RankOutcome> outcomes(static_cast<size_t>(size));
  const auto end = Clock::now() + limit;
  for (int r = 0; r < size; ++r) {
    int status = 0;
    while (::waitpid(pids[static_cast<size_t>(r)], &status, WNOHANG) == 0) {
      if (Clock::now() > end) {
        for (pid_t p : pids) ::kill(p, SIGKILL);
        ::waitpid(pids[static_cast<size_t>(r)], &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    RankOutcome& o = outcomes[static_cast<size_t>(r)];
    o.exit_code = status == -1 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const Shared::Slot& slot = shared->slots[r];
    o.bytes.assign(slot.bytes, slot.bytes + slot.size);
    o.message = slot.message;
  }
  ::munmap(memory, sizeof(Shared));
  return outcomes;
}

// The same body on InProcessComm's threads: each rank's bytes.
std::vector<std::vector<uint8_t>> run_threads(int size,
                                              const std::function<std::vector<uint8_t>(Comm&)>& body) {
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(size));
  run_in_process(size, [&](Comm& comm) { out[static_cast<size_t>(comm.rank())] = body(comm); });
  return out;
}

// Values whose rank-order sum differs from other orders in the low bits: magnitudes spread
// over many binades, signs mixed; i32 near the limits so that sums wrap.
std::vector<uint8_t> inputs(DType dtype, size_t count, int rank, uint32_t salt) {
  std::mt19937 rng(1000u * static_cast<uint32_t>(rank) + salt);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<uint8_t> out(comm_bytes(count, dtype));
  for (size_t i = 0; i < count; ++i) {
    double v = std::ldexp(mantissa(rng), exponent(rng));
    switch (dtype) {
      case DType::f32: reinterpret_cast<float*>(out.data())[i] = static_cast<float>(v); break;
      case DType::f64: reinterpret_cast<double*>(out.data())[i] = v; break;
      case DType::bf16: reinterpret_cast<bf16*>(out.data())[i] = float_to_bf16(static_cast<float>(v)); break;
      case DType::i32: reinterpret_cast<int32_t*>(out.data())[i] = static_cast<int32_t>(rng()); break;
      default: break;
    }
  }
  return out;
}

void append(std::vector<uint8_t>& out, const std::vector<uint8_t>& bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}

// Every op of comm.h in every dtype; returns all the results, in order.
std::vector<uint8_t> every_op(Comm& comm) {
  const int n = comm.size(), r = comm.rank();
  std::vector<uint8_t> out;
  uint32_t salt = 0;
  for (DType dtype : {DType::f32, DType::bf16, DType::i32, DType::f64}) {
    const size_t elem = comm_bytes(1, dtype);
    const size_t count = 1031;  // not a multiple of anything
    std::vector<uint8_t> data = inputs(dtype, count, r, ++salt);
    comm.all_reduce_sum(data.data(), count, dtype, kTimeout);
    append(out, data);

    std::vector<uint8_t> send = inputs(dtype, count * static_cast<size_t>(n), r, ++salt);
    std::vector<uint8_t> recv(count * elem);
    comm.reduce_scatter_sum(send.data(), recv.data(), count, dtype, kTimeout);
    append(out, recv);

    std::vector<uint8_t> mine = inputs(dtype, count, r, ++salt);
    std::vector<uint8_t> gathered(count * elem * static_cast<size_t>(n));
    comm.all_gather(mine.data(), gathered.data(), count, dtype, kTimeout);
    append(out, gathered);
    // In place: this rank's slot already holds its part.
    std::vector<uint8_t> in_place(count * elem * static_cast<size_t>(n), 0xab);
    std::memcpy(in_place.data() + static_cast<size_t>(r) * count * elem, mine.data(), count * elem);
    comm.all_gather(in_place.data() + static_cast<size_t>(r) * count * elem, in_place.data(), count, dtype,
                    kTimeout);
    append(out, in_place);

    std::vector<uint8_t> b = inputs(dtype, count, r, ++salt);
    comm.broadcast(b.data(), count, dtype, n - 1, kTimeout);
    append(out, b);

    // A ring, both directions in one exchange.
    std::vector<uint8_t> to_next = inputs(dtype, count, r, ++salt), to_prev = inputs(dtype, 7, r, ++salt);
    std::vector<uint8_t> from_prev(count * elem), from_next(7 * elem);
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    P2POp ops[] = {{P2POp::Kind::send, to_next.data(), count, dtype, next},
                   {P2POp::Kind::send, to_prev.data(), 7, dtype, prev},
                   {P2POp::Kind::recv, from_prev.data(), count, dtype, prev},
                   {P2POp::Kind::recv, from_next.data(), 7, dtype, next}};
    comm.exchange(ops, kTimeout);
    append(out, from_prev);
    append(out, from_next);
  }
  comm.barrier(kTimeout);

  // Split into even and odd ranks (with n odd, the last rank joins none), then a
  // collective and an exchange in each new group.
  const int covered = n % 2 ? n - 1 : n;
  std::vector<int> members;
  if (r < covered)
    for (int m = r % 2; m < covered; m += 2) members.push_back(m);
  std::unique_ptr<Comm> half = comm.split(members, "half", kTimeout);
  EXPECT_EQ(half == nullptr, members.empty());
  if (half) {
    EXPECT_EQ(half->size(), static_cast<int>(members.size()));
    EXPECT_EQ(half->world_rank_of(half->rank()), r);
    std::vector<uint8_t> data = inputs(DType::f32, 257, r, 99);
    half->all_reduce_sum(data.data(), 257, DType::f32, kTimeout);
    append(out, data);
    if (half->size() > 1) {
      const int peer = half->rank() ^ 1;
      if (peer < half->size()) {
        std::vector<uint8_t> got(4 * sizeof(int32_t));
        std::vector<uint8_t> sent = inputs(DType::i32, 4, r, 7);
        P2POp ops[] = {{P2POp::Kind::send, sent.data(), 4, DType::i32, peer},
                       {P2POp::Kind::recv, got.data(), 4, DType::i32, peer}};
        half->exchange(ops, kTimeout);
        append(out, got);
      }
    }
  }
  comm.barrier(kTimeout);
  return out;
}

TEST(SocketComm, EveryOpAndDtypeGivesInProcessCommsBits) {
  {
    // The inputs are such that the order of the sum shows in the bits: the f32 all_reduce's
    // inputs of 3 ranks summed in reverse order differ from rank order somewhere.
    std::vector<std::vector<uint8_t>> x;
    for (int r = 0; r < 3; ++r) x.push_back(inputs(DType::f32, 1031, r, 1));
    auto at = [&](int r, size_t i) {
      return reinterpret_cast<const float*>(x[static_cast<size_t>(r)].data())[i];
    };
    int differ = 0;
    for (size_t i = 0; i < 1031; ++i)
      differ += (at(0, i) + at(1, i)) + at(2, i) != (at(2, i) + at(1, i)) + at(0, i);
    EXPECT_GT(differ, 10);
  }
  for (int n : {2, 3, 4}) {
    std::vector<std::vector<uint8_t>> expected = run_threads(n, every_op);
    std::vector<RankOutcome> got = run_processes(n, every_op);
    for (int r = 0; r < n; ++r) {
      const RankOutcome& o = got[static_cast<size_t>(r)];
      ASSERT_EQ(o.exit_code, 0) << "world of " << n << ", rank " << r << ": " << o.message;
      ASSERT_FALSE(o.bytes.empty());
      EXPECT_TRUE(o.bytes == expected[static_cast<size_t>(r)]) << "world of " << n << ", rank " << r;
    }
  }
}

// 4 MiB f32 all_reduce over 3 processes, and 8 MiB each way between two ranks in one
// exchange: far over the socket buffers, so both ranks write while the other writes.
TEST(SocketComm, LargeBuffersAndBothWayExchange) {
  constexpr size_t kCount = 1u << 20;
  auto body = [](Comm& comm) {
    std::vector<float> data(kCount);
    for (size_t i = 0; i < kCount; ++i)
      data[i] = static_cast<float>(i % 1000) * 0.25f + static_cast<float>(comm.rank());
    comm.all_reduce_sum(data.data(), kCount, DType::f32, kTimeout);
    std::vector<uint8_t> out(reinterpret_cast<uint8_t*>(data.data()),
                             reinterpret_cast<uint8_t*>(data.data() + kCount));
    if (comm.rank() < 2) {
      std::vector<int32_t> mine(2 * kCount), theirs(2 * kCount);
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<int32_t>(i) * (comm.rank() ? -1 : 1);
      const int peer = 1 - comm.rank();
      P2POp ops[] = {{P2POp::Kind::send, mine.data(), mine.size(), DType::i32, peer},
                     {P2POp::Kind::recv, theirs.data(), theirs.size(), DType::i32, peer}};
      comm.exchange(ops, kTimeout);
      for (size_t i = 0; i < theirs.size(); i += 4099)
        if (theirs[i] != static_cast<int32_t>(i) * (peer ? -1 : 1)) throw std::runtime_error("wrong data");
    }
    return out;
  };
  std::vector<std::vector<uint8_t>> expected = run_threads(3, body);
  auto start = Clock::now();
  std::vector<RankOutcome> got = run_processes(3, body);
  for (int r = 0; r < 3; ++r) {
    ASSERT_EQ(got[static_cast<size_t>(r)].exit_code, 0) << got[static_cast<size_t>(r)].message;
    EXPECT_TRUE(got[static_cast<size_t>(r)].bytes == expected[static_cast<size_t>(r)]) << r;
  }
  EXPECT_LT(Clock::now() - start, 10s);
}

// Two groups over the same connections, used at once by two threads of each process
// (as a trainer overlapping TP and DP traffic would): frames of one never reach the other.
TEST(SocketComm, GroupsSharingConnectionsWorkFromTwoThreads) {
  std::vector<RankOutcome> got = run_processes(2, [](Comm& comm) {
    std::unique_ptr<Comm> a = comm.split({0, 1}, "a", kTimeout);
    std::unique_ptr<Comm> b = comm.split({0, 1}, "b", kTimeout);
    std::vector<int32_t> sums(2, 0);
    auto work = [&](Comm& group, int which) {
      for (int i = 0; i < 200; ++i) {
        int32_t v[3] = {i, which, group.rank()};
        group.all_reduce_sum(v, 3, DType::i32, kTimeout);
        if (v[0] != 2 * i || v[1] != 2 * which || v[2] != 1) throw std::runtime_error("wrong sum");
        int32_t mine = 1000 * which + i, theirs = -1;
        P2POp ops[] = {{P2POp::Kind::send, &mine, 1, DType::i32, 1 - group.rank()},
                       {P2POp::Kind::recv, &theirs, 1, DType::i32, 1 - group.rank()}};
        group.exchange(ops, kTimeout);
        if (theirs != mine) throw std::runtime_error("a message of the other group");
        sums[static_cast<size_t>(which)] += v[0];
      }
    };
    std::exception_ptr error;
    std::thread other([&] {
      try {
        work(*b, 1);
      } catch (...) {
        error = std::current_exception();
      }
    });
    work(*a, 0);
    other.join();
    if (error) std::rethrow_exception(error);
    return std::vector<uint8_t>(reinterpret_cast<uint8_t*>(sums.data()),
                                reinterpret_cast<uint8_t*>(sums.data() + 2));
  });
  for (const RankOutcome& o : got) {
    ASSERT_EQ(o.exit_code, 0) << o.message;
    ASSERT_EQ(o.bytes.size(), 8u);
    int32_t sums[2];
    std::memcpy(sums, o.bytes.data(), 8);
    EXPECT_EQ(sums[0], 200 * 199);
    EXPECT_EQ(sums[1], 200 * 199);
  }
}

TEST(SocketComm, RankThatNeverCallsTimesOutNamingIt) {
  auto start = Clock::now();
  std::vector<RankOutcome> got = run_processes(3, [](Comm& comm) {
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(1500ms);  // alive, but not taking part
      return std::vector<uint8_t>{};
    }
    float x = 1.0f;
    comm.all_reduce_sum(&x, 1, DType::f32, 200ms);
    return std::vector<uint8_t>{};
  });
  EXPECT_LT(Clock::now() - start, 5s);
  for (int r : {0, 1}) {
    const RankOutcome& o = got[static_cast<size_t>(r)];
    EXPECT_EQ(o.exit_code, 3);
    EXPECT_EQ(o.message,
              "group 'world' (world ranks [0, 1, 2]) rank " + std::to_string(r) +
                  ": all_reduce #1 (1 F32) timed out after 200 ms waiting for rank 2 (world rank 2)");
  }
}

// A recv nobody sends to, and a send nobody receives (it reaches the peer's process, which
// does not take it), each in a split group.
TEST(SocketComm, PointToPointTimeoutsNameThePeer) {
  for (int receiver_waits : {1, 0}) {
    std::vector<RankOutcome> got = run_processes(3, [&](Comm& comm) {
      std::unique_ptr<Comm> pp = comm.split(comm.rank() < 2 ? std::vector<int>{0, 1} : std::vector<int>{2},
                                            comm.rank() < 2 ? "pp" : "alone", kTimeout);
      float x[4] = {};
      const bool acts = comm.rank() == (receiver_waits ? 0 : 1);
      if (acts && receiver_waits) pp->recv(x, 4, DType::f32, 1, 150ms);
      if (acts && !receiver_waits) pp->send(x, 4, DType::f32, 0, 150ms);
      if (!acts) std::this_thread::sleep_for(600ms);
      return std::vector<uint8_t>{};
    });
    if (receiver_waits)
      EXPECT_EQ(
          got[0].message,
          "group 'pp' (world ranks [0, 1]) rank 0: recv of 4 F32 from rank 1 (world rank 1) timed out after "
          "150 ms");
    else
      EXPECT_EQ(
          got[1].message,
          "group 'pp' (world ranks [0, 1]) rank 1: send of 4 F32 to rank 0 (world rank 0) (not received) "
          "timed out after 150 ms");
  }
}

TEST(SocketComm, MismatchedCollectivesAreNamed) {
  std::vector<RankOutcome> got = run_processes(2, [](Comm& comm) {
    float x[2] = {};
    if (comm.rank() == 0)
      comm.all_reduce_sum(x, 2, DType::f32, kTimeout);
    else
      comm.broadcast(x, 2, DType::f32, 0, kTimeout);
    return std::vector<uint8_t>{};
  });
  EXPECT_EQ(
      got[0].message,
      "group 'world' (world ranks [0, 1]) rank 0: mismatched collectives: this rank called all_reduce #1 (2 "
      "F32), rank 1 (world rank 1) called broadcast #1 (2 F32)");
}

TEST(SocketComm, RankDyingMidCollectiveEndsTheOthersWithinTheTimeout) {
  auto start = Clock::now();
  std::vector<RankOutcome> got = run_processes(3, [](Comm& comm) {
    std::vector<double> x(1000, 1.0);
    comm.all_reduce_sum(x.data(), x.size(), DType::f64, kTimeout);
    if (comm.rank() == 2) {
      std::this_thread::sleep_for(100ms);  // the others are in the next collective by now
      ::raise(SIGKILL);
    }
    comm.all_reduce_sum(x.data(), x.size(), DType::f64, 5000ms);
    return std::vector<uint8_t>{};
  });
  EXPECT_LT(Clock::now() - start, 4s);  // well within the 5 s timeout
  EXPECT_EQ(got[2].exit_code, 128 + SIGKILL);
  for (int r : {0, 1}) {
    const RankOutcome& o = got[static_cast<size_t>(r)];
    EXPECT_EQ(o.exit_code, 3);
    // "closed", or "broke: Connection reset by peer" when unread data was left behind.
    EXPECT_NE(
        o.message.find(
            "group 'world' (world ranks [0, 1, 2]) rank " + std::to_string(r) +
            ": all_reduce #2 (1000 F64): rank 2 (world rank 2) is gone before it took part: its connection"),
        std::string::npos)
        << o.message;
  }
}

// After a failure, the process's groups are unusable: later calls throw with the first
// message instead of running.
TEST(SocketComm, GroupsAreUnusableAfterAFailure) {
  std::vector<RankOutcome> got = run_processes(2, [](Comm& comm) {
    std::unique_ptr<Comm> other = comm.split({0, 1}, "other", kTimeout);
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(600ms);
      return std::vector<uint8_t>{};
    }
    try {
      comm.barrier(100ms);
    } catch (const RuntimeFailure&) {
    }
    other->barrier(kTimeout);
    return std::vector<uint8_t>{};
  });
  EXPECT_EQ(
      got[0].message,
      "group 'other' (world ranks [0, 1]) rank 0: barrier #1 stopped: group 'world' (world ranks [0, 1]) "
      "rank 0: barrier #2 timed out after 100 ms waiting for rank 1 (world rank 1)");
}

}  // namespace
}  // namespace loom
