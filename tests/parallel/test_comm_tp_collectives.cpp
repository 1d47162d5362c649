// CommTpCollectives (parallel/comm_tp_collectives.h): the host wait `ready` runs before each call
// on a Comm that is not stream-ordered, and never on one that is (its calls are queued behind
// their producers on the same stream).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/comm_tp_collectives.h"

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

}  // namespace
}  // namespace loom
