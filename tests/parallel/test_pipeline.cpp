// The 1F1B schedule on CPU ranks: toy stages give the unpipelined result bit for bit, and
// each stage runs Megatron's order of operations.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <sstream>

#include "parallel/in_process_comm.h"
#include "parallel/pipeline.h"

namespace loom {
namespace {

using namespace std::chrono_literals;
constexpr CommTimeout kTimeout = 20s;
constexpr int kWidth = 3;

// Stage s computes y = W_s x row by row (x: rows × kWidth); the last stage's loss is
// ½ Σ y², so ∂loss/∂y = y. Backward: dW_s += dyᵀ x, dx = W_sᵀ dy.
struct ToyModel {
  int stages = 0;
  std::vector<std::vector<float>> weights;  // [stage][kWidth · kWidth], row-major W
  std::vector<std::vector<float>> inputs;   // [mb][rows · kWidth]

  ToyModel(int num_stages, int microbatches) : stages(num_stages) {
    for (int s = 0; s < stages; ++s) {
      std::vector<float> w(kWidth * kWidth);
      for (int i = 0; i < kWidth * kWidth; ++i)
        w[static_cast<size_t>(i)] = 0.1f * static_cast<float>((7 * s + 3 * i) % 11) - 0.45f;
      weights.push_back(w);
    }
    for (int mb = 0; mb < microbatches; ++mb) {
      int rows = 1 + mb % 3;  // micro-batches differ in size
      std::vector<float> x(static_cast<size_t>(rows * kWidth));
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = 0.25f * static_cast<float>((5 * mb + 2 * static_cast<int>(i)) % 9) - 1.0f;
      inputs.push_back(x);
    }
  }
  int rows(int mb) const { return static_cast<int>(inputs[static_cast<size_t>(mb)].size()) / kWidth; }

  static std::vector<float> forward(const std::vector<float>& w, const std::vector<float>& x) {
    std::vector<float> y(x.size(), 0.0f);
    for (size_t r = 0; r < x.size() / kWidth; ++r)
      for (int i = 0; i < kWidth; ++i)
        for (int j = 0; j < kWidth; ++j)
          y[r * kWidth + i] += w[static_cast<size_t>(i * kWidth + j)] * x[r * kWidth + j];
    return y;
  }
  // Accumulates dW and returns dx.
  static std::vector<float> backward(const std::vector<float>& w, const std::vector<float>& x,
                                     const std::vector<float>& dy, std::vector<float>& dw) {
    std::vector<float> dx(x.size(), 0.0f);
    for (size_t r = 0; r < x.size() / kWidth; ++r)
      for (int i = 0; i < kWidth; ++i)
        for (int j = 0; j < kWidth; ++j) {
          dw[static_cast<size_t>(i * kWidth + j)] += dy[r * kWidth + i] * x[r * kWidth + j];
          dx[r * kWidth + j] += w[static_cast<size_t>(i * kWidth + j)] * dy[r * kWidth + i];
        }
    return dx;
  }
  static float loss(const std::vector<float>& y) {
    float l = 0;
    for (float v : y) l += 0.5f * v * v;
    return l;
  }
};

struct Result {
  std::vector<std::vector<float>> grads;  // [stage]
  float loss = 0;
};

// The unpipelined computation: micro-batch after micro-batch through all stages.
Result serial(const ToyModel& m) {
  Result out;
  out.grads.assign(static_cast<size_t>(m.stages), std::vector<float>(kWidth * kWidth, 0.0f));
  for (const auto& x : m.inputs) {
    std::vector<std::vector<float>> acts{x};
    for (int s = 0; s < m.stages; ++s)
      acts.push_back(ToyModel::forward(m.weights[static_cast<size_t>(s)], acts.back()));
    out.loss += ToyModel::loss(acts.back());
    std::vector<float> grad = acts.back();
    for (int s = m.stages - 1; s >= 0; --s)
      grad = ToyModel::backward(m.weights[static_cast<size_t>(s)], acts[static_cast<size_t>(s)], grad,
                                out.grads[static_cast<size_t>(s)]);
  }
  return out;
}

// The same through pipeline_run_1f1b, one rank per stage.
Result pipelined(const ToyModel& m) {
  Result out;
  out.grads.assign(static_cast<size_t>(m.stages), {});
  const int microbatches = static_cast<int>(m.inputs.size());
  run_in_process(m.stages, [&](Comm& pp) {
    const int s = pp.rank();
    const bool first = s == 0, last = s == m.stages - 1;
    const std::vector<float>& w = m.weights[static_cast<size_t>(s)];
    std::map<int, std::vector<float>> input, output, output_grad, input_grad;
    std::vector<float> dw(kWidth * kWidth, 0.0f);
    float loss = 0;
    PipelineStage stage;
    stage.activation_count = [&](int mb) { return static_cast<size_t>(m.rows(mb) * kWidth); };
    stage.input_buffer = [&](int mb) {
      input[mb].assign(static_cast<size_t>(m.rows(mb) * kWidth), 0.0f);
      return static_cast<void*>(input[mb].data());
    };
    stage.forward = [&](int mb) -> const void* {
      if (first) input[mb] = m.inputs[static_cast<size_t>(mb)];
      output[mb] = ToyModel::forward(w, input[mb]);
      if (last) loss += ToyModel::loss(output[mb]);
      return output[mb].data();
    };
    stage.output_grad_buffer = [&](int mb) {
      output_grad[mb].assign(static_cast<size_t>(m.rows(mb) * kWidth), 0.0f);
      return static_cast<void*>(output_grad[mb].data());
    };
    stage.backward = [&](int mb) -> const void* {
      const std::vector<float>& dy = last ? output[mb] : output_grad[mb];
      input_grad[mb] = ToyModel::backward(w, input[mb], dy, dw);
      return input_grad[mb].data();
    };
    pipeline_run_1f1b(pp, stage, microbatches, kTimeout);
    out.grads[static_cast<size_t>(s)] = dw;
    if (last) out.loss = loss;
  });
  return out;
}

TEST(Pipeline, EqualsTheUnpipelinedComputation) {
  for (int stages : {1, 2, 4}) {
    for (int microbatches : {1, 2, 3, 4, 7}) {
      ToyModel model(stages, microbatches);
      Result want = serial(model), got = pipelined(model);
      // Same operations in the same order: equal bit for bit.
      EXPECT_EQ(got.loss, want.loss) << stages << " stages, " << microbatches << " micro-batches";
      for (int s = 0; s < stages; ++s)
        EXPECT_EQ(got.grads[static_cast<size_t>(s)], want.grads[static_cast<size_t>(s)])
            << "stage " << s << " of " << stages << ", " << microbatches << " micro-batches";
    }
  }
}

// Records the schedule's transfers as Megatron names them, each leg tagged with the
// micro-batch its one-float payload carries: rF (recv forward, from the previous stage),
// sF (send forward), rB (recv backward, from the next stage), sB (send backward); the legs
// of one batched exchange are joined by '+'.
class RecordingComm final : public Comm {
 public:
  RecordingComm(Comm& inner, std::vector<std::string>& log)
      : Comm(inner.name(), inner.rank(), inner.world_ranks()), inner_(inner), log_(log) {}
  void all_reduce_sum(void*, size_t, DType, CommTimeout) override { FAIL(); }
  void reduce_scatter_sum(const void*, void*, size_t, DType, CommTimeout) override { FAIL(); }
  void all_gather(const void*, void*, size_t, DType, CommTimeout) override { FAIL(); }
  void broadcast(void*, size_t, DType, int, CommTimeout) override { FAIL(); }
  void barrier(CommTimeout) override { FAIL(); }
  std::unique_ptr<Comm> split(const std::vector<int>&, const std::string&, CommTimeout) override {
    return nullptr;
  }
  void exchange(std::span<const P2POp> ops, CommTimeout timeout) override {
    inner_.exchange(ops, timeout);
    std::string entry;
    for (const P2POp& op : ops) {
      bool send = op.kind == P2POp::Kind::send, next = op.peer == rank() + 1;
      entry += std::string(entry.empty() ? "" : "+") + (send ? "s" : "r") + (next == send ? "F" : "B") +
               std::to_string(static_cast<int>(*static_cast<float*>(op.data)));
    }
    log_.push_back(entry);
  }

 private:
  Comm& inner_;
  std::vector<std::string>& log_;
};

// Runs the schedule with stages that pass the micro-batch number along and log F/B.
std::vector<std::string> schedule_of(int stages, int microbatches) {
  std::vector<std::string> logs(static_cast<size_t>(stages));
  run_in_process(stages, [&](Comm& world) {
    std::vector<std::string> log;
    RecordingComm pp(world, log);
    std::map<int, float> input, output_grad;
    float out = 0, grad = 0;
    PipelineStage stage;
    stage.activation_count = [](int) { return size_t{1}; };
    stage.input_buffer = [&](int mb) { return static_cast<void*>(&input[mb]); };
    stage.output_grad_buffer = [&](int mb) { return static_cast<void*>(&output_grad[mb]); };
    stage.forward = [&](int mb) -> const void* {
      if (pp.rank() > 0) {
        EXPECT_EQ(input[mb], static_cast<float>(mb));  // the right activation arrived
      }
      log.push_back("F" + std::to_string(mb));
      out = static_cast<float>(mb);
      return &out;
    };
    stage.backward = [&](int mb) -> const void* {
      if (pp.rank() < pp.size() - 1) {
        EXPECT_EQ(output_grad[mb], static_cast<float>(mb));
      }
      log.push_back("B" + std::to_string(mb));
      grad = static_cast<float>(mb);
      return &grad;
    };
    pipeline_run_1f1b(pp, stage, microbatches, kTimeout);
    std::string joined;
    for (const auto& entry : log) joined += (joined.empty() ? "" : " ") + entry;
    logs[static_cast<size_t>(world.rank())] = joined;
  });
  return logs;
}

// Worked out by hand from forward_backward_pipelining_without_interleaving: warm-up
// min(p − s − 1, M) forwards, recv_forward before the steady state, then forward +
// send_forward_recv_backward + backward + send_backward_recv_forward (send_backward on
// the last steady step), then cool-down recv_backward + backward + send_backward.
TEST(Pipeline, OrderOfOperationsPerStage4Stages6Microbatches) {
  std::vector<std::string> logs = schedule_of(4, 6);
  EXPECT_EQ(logs[0],
            "F0 sF0 F1 sF1 F2 sF2 "                       // warm-up: 3
            "F3 sF3+rB0 B0 F4 sF4+rB1 B1 F5 sF5+rB2 B2 "  // steady: 3 (no backward sends on stage 0)
            "rB3 B3 rB4 B4 rB5 B5");                      // cool-down: 3
  EXPECT_EQ(logs[1],
            "rF0 F0 sF0 rF1 F1 sF1 rF2 "
            "F2 sF2+rB0 B0 sB0+rF3 F3 sF3+rB1 B1 sB1+rF4 F4 sF4+rB2 B2 sB2+rF5 F5 sF5+rB3 B3 sB3 "
            "rB4 B4 sB4 rB5 B5 sB5");
  EXPECT_EQ(logs[2],
            "rF0 F0 sF0 rF1 "
            "F1 sF1+rB0 B0 sB0+rF2 F2 sF2+rB1 B1 sB1+rF3 F3 sF3+rB2 B2 sB2+rF4 F4 sF4+rB3 B3 sB3+rF5 "
            "F5 sF5+rB4 B4 sB4 "
            "rB5 B5 sB5");
  EXPECT_EQ(logs[3], "rF0 F0 B0 sB0+rF1 F1 B1 sB1+rF2 F2 B2 sB2+rF3 F3 B3 sB3+rF4 F4 B4 sB4+rF5 F5 B5 sB5");
}

TEST(Pipeline, OrderOfOperationsFewerMicrobatchesThanStages) {
  std::vector<std::string> logs = schedule_of(4, 2);
  EXPECT_EQ(logs[0], "F0 sF0 F1 sF1 rB0 B0 rB1 B1");  // all warm-up and cool-down
  EXPECT_EQ(logs[1], "rF0 F0 sF0 rF1 F1 sF1 rB0 B0 sB0 rB1 B1 sB1");
  EXPECT_EQ(logs[2], "rF0 F0 sF0 rF1 F1 sF1+rB0 B0 sB0 rB1 B1 sB1");
  EXPECT_EQ(logs[3], "rF0 F0 B0 sB0+rF1 F1 B1 sB1");
  // One stage: forward and backward alternate (forward_backward_no_pipelining).
  EXPECT_EQ(schedule_of(1, 3)[0], "F0 B0 F1 B1 F2 B2");
}

TEST(Pipeline, WarmupCounts) {
  EXPECT_EQ(pipeline_warmup_microbatches(4, 0, 8), 3);
  EXPECT_EQ(pipeline_warmup_microbatches(4, 3, 8), 0);
  EXPECT_EQ(pipeline_warmup_microbatches(4, 0, 2), 2);
  EXPECT_EQ(pipeline_warmup_microbatches(1, 0, 5), 0);
}

}  // namespace
}  // namespace loom
