// CommTpCollectives (parallel/comm_tp_collectives.h): the host wait `ready` runs before each call
// on a Comm that is not stream-ordered, and never on one that is (its calls are queued behind
// their producers on the same stream).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/comm_tp_collectives.h"
#include "parallel/in_process_comm.h"

namespace loom {
namespace {

// Records the calls made on it; host buffers, nothing moved.
class RecordingComm final : public Comm {
 public:
  RecordingComm(bool stream_ordered, std::vector<std::string>& log)
      : Comm("tp", 0, {0, 1}), stream_ordered_(stream_ordered), log_(log) {}
  void all_reduce_sum(void*, size_t, DType, CommTimeout) override { log_.push_back("all_reduce"); }
  void reduce_scatter_sum(const void*, void*, size_t, DType, CommTimeout) override {
    log_.push_back("reduce_scatter");
  }
  void all_gather(const void*, void*, size_t, DType, CommTimeout) override { log_.push_back("all_gather"); }
  void broadcast(void*, size_t, DType, int, CommTimeout) override { log_.push_back("broadcast"); }
  void barrier(CommTimeout) override { log_.push_back("barrier"); }
  void exchange(std::span<const P2POp>, CommTimeout) override { log_.push_back("exchange"); }
  std::unique_ptr<Comm> split(const std::vector<int>&, const std::string&, CommTimeout) override {
    return nullptr;
  }
  bool stream_ordered() const override { return stream_ordered_; }

 private:
  bool stream_ordered_;
  std::vector<std::string>& log_;
};

std::vector<std::string> calls(bool stream_ordered) {
  std::vector<std::string> log;
  RecordingComm comm(stream_ordered, log);
  CommTpCollectives tp(comm, CommTimeout(1000), [&] { log.push_back("ready"); });
  std::vector<float> part(2), full(4);
  const Tensor p{part.data(), {2}, DType::f32, Device::cpu}, f{full.data(), {4}, DType::f32, Device::cpu};
  tp.all_reduce(f);
  tp.all_gather(f, p);
  tp.reduce_scatter(p, f);
  return log;
}

TEST(CommTpCollectives, WaitsForTheProducersUnlessTheCommIsStreamOrdered) {
  EXPECT_EQ(calls(false), (std::vector<std::string>{"ready", "all_reduce", "ready", "all_gather", "ready",
                                                    "reduce_scatter"}));
  EXPECT_EQ(calls(true), (std::vector<std::string>{"all_reduce", "all_gather", "reduce_scatter"}));
}

// The ring form's shift (context parallelism): each rank receives the previous rank's block, the
// first the last's; over CP2 the two ranks swap. The ready wait runs before it as before the
// collectives.
TEST(CommTpCollectives, ShiftPassesEachBlockToTheNextRank) {
  for (int size : {2, 3, 4}) {
    std::vector<std::vector<float>> received(static_cast<size_t>(size));
    run_in_process(size, [&](Comm& group) {
      int waits = 0;
      CommTpCollectives collectives(group, CommTimeout(10000), [&] { ++waits; });
      TpCollectives& cp = collectives;  // the model's view of the CP hook
      const auto r = static_cast<float>(group.rank());
      std::vector<float> send{r, 10.0f * r, 100.0f * r}, recv(3, -1.0f);
      cp.wait(cp.start_shift(Tensor{recv.data(), {3}, DType::f32, Device::cpu},
                             Tensor{send.data(), {3}, DType::f32, Device::cpu}));
      EXPECT_EQ(waits, 1);
      received[static_cast<size_t>(group.rank())] = recv;
    });
    for (int r = 0; r < size; ++r) {
      const auto from = static_cast<float>((r + size - 1) % size);
      EXPECT_EQ(received[static_cast<size_t>(r)], (std::vector<float>{from, 10.0f * from, 100.0f * from}))
          << "rank " << r << " of " << size;
    }
  }
}

}  // namespace
}  // namespace loom
