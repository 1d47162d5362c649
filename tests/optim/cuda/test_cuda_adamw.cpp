// CudaAdamW (optim/cuda_adamw.h) at offload fractions 0, 0.5 and 1 against the CPU
// precision-aware step, bit for bit (label gpu; skipped with a message where no GPU is
// visible). Each failure names the run, the step, the array and the first differing element.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/cuda_check.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "optim/adamw.h"
#include "optim/cuda_adamw.h"
#include "optim/precision_master.h"
#include "support/bitwise_diff.h"

namespace loom {
namespace {

constexpr AdamWConfig kRecipe{0.9f, 0.98f, 1e-8f, 0.1f};
constexpr int kSteps = 3;

float lr_at(int step) {
  return 1e-3f * static_cast<float>(step);
}

struct Problem {
  std::vector<ParamRange> ranges;
  int64_t n = 0;
  std::vector<float> master;
  std::vector<std::vector<float>> grads;  // per step
};

// A model-like table (matrices, norms, a gap of untouched elements, an odd-sized tail),
// masters with all 32 bits in use and some exact bf16 ties, grads spanning 1e-10 .. 1.
Problem make_problem() {
  Problem p;
  p.ranges = {{0, 200000, true}, {200000, 1024, false}, {201024, 99991, true}, {301100, 4096, false}};
  p.n = 305300;
  std::mt19937 rng(11);
  std::normal_distribution<float> w(0.0f, 0.02f);
  p.master.resize(static_cast<size_t>(p.n));
  for (float& x : p.master) x = w(rng);
  for (int64_t i = 200000; i < 201024; ++i) p.master[i] += 1.0f;  // norms near 1
  for (int64_t i = 0; i < p.n; i += 211)
    p.master[i] = std::bit_cast<float>((std::bit_cast<uint32_t>(p.master[i]) & 0xfffe0000u) | 0x8000u);
  std::uniform_real_distribution<float> exponent(-10.0f, 0.0f);
  std::bernoulli_distribution sign(0.5);
  for (int s = 0; s < kSteps; ++s) {
    std::vector<float> g(static_cast<size_t>(p.n));
    for (float& x : g) x = (sign(rng) ? -1.0f : 1.0f) * std::pow(10.0f, exponent(rng));
    p.grads.push_back(std::move(g));
  }
  return p;
}

// The state after each step: masters, moments and the bf16 weights the model reads.
struct State {
  std::vector<float> master, m, v;
  std::vector<uint16_t> bits;
};

std::vector<State> cpu_reference(const Problem& p) {
  std::vector<uint16_t> bits(static_cast<size_t>(p.n));
  std::vector<int16_t> rem(static_cast<size_t>(p.n));
  master_split_array(p.master.data(), p.n, bits.data(), rem.data());
  std::vector<float> m(p.n, 0.0f), v(p.n, 0.0f);
  std::vector<State> out;
  for (int s = 1; s <= kSteps; ++s) {
    adamw_step_bf16_remainder(kRecipe, lr_at(s), s, p.ranges, bits.data(), rem.data(), p.grads[s - 1].data(),
                              m.data(), v.data());
    State state{std::vector<float>(static_cast<size_t>(p.n)), m, v, bits};
    master_rebuild_array(bits.data(), rem.data(), p.n, state.master.data());
    out.push_back(std::move(state));
  }
  return out;
}

class CudaAdamWTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible: the CudaAdamW tests did not run";
    // A non-blocking stream, like the engine's work, so that only the optimizer's own events
    // order the copies before the test reads the weights.
    LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  // One run: CudaAdamW at `options` for kSteps steps; the state after each step. The weights
  // are read back on the optimizer's stream, as the next forward would read them.
  // grad_scale: passed to each step, which multiplies the unscaled grads as it reads them.
  std::vector<State> run(const Problem& p, const CudaAdamWOptions& options, int64_t* host_bytes = nullptr,
                         float grad_scale = 1.0f) {
    DeviceArena arena("test tensors");
    auto* bits = static_cast<uint16_t*>(arena.allocate_bytes(p.n * 2, "bf16 weights"));
    auto* grads = static_cast<float*>(arena.allocate_bytes(p.n * 4, "grads"));
    CudaAdamW adam(p.ranges, p.n, bits, grads, stream_, options);
    adam.load(p.master.data(), nullptr, nullptr);
    if (host_bytes) *host_bytes = adam.host_bytes();
    std::vector<State> out;
    for (int s = 1; s <= kSteps; ++s) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(grads, p.grads[s - 1].data(), static_cast<size_t>(p.n) * 4,
                                      cudaMemcpyHostToDevice, stream_));
      adam.step(kRecipe, lr_at(s), s, grad_scale);
      State state;
      state.bits.resize(static_cast<size_t>(p.n));
      LOOM_CUDA_CHECK(cudaMemcpyAsync(state.bits.data(), bits, static_cast<size_t>(p.n) * 2,
                                      cudaMemcpyDeviceToHost, stream_));
      LOOM_CUDA_CHECK(cudaStreamSynchronize(stream_));
      state.master.resize(static_cast<size_t>(p.n));
      state.m.resize(static_cast<size_t>(p.n));
      state.v.resize(static_cast<size_t>(p.n));
      adam.save(state.master.data(), state.m.data(), state.v.data());
      out.push_back(std::move(state));
    }
    return out;
  }

  void expect_equal(const std::vector<State>& got, const std::vector<State>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < got.size(); ++s) {
      const std::string at = what + ", after step " + std::to_string(s + 1) + ": ";
      std::string d;
      EXPECT_EQ(d = first_difference(got[s].bits, want[s].bits), "")
          << at << "bf16 weights on the GPU differ, " << d;
      EXPECT_EQ(d = first_difference(got[s].master, want[s].master), "")
          << at << "fp32 masters differ, " << d;
      EXPECT_EQ(d = first_difference(got[s].m, want[s].m), "") << at << "Adam m differs, " << d;
      EXPECT_EQ(d = first_difference(got[s].v, want[s].v), "") << at << "Adam v differs, " << d;
    }
  }

  cudaStream_t stream_ = nullptr;
};

CudaAdamWOptions offload(double fraction, bool overlap = true) {
  CudaAdamWOptions o;
  o.offload_fraction = fraction;
  o.overlap = overlap;
  o.chunk_numel = 40009;  // several chunks, cut inside tensors
  return o;
}

TEST_F(CudaAdamWTest, EveryOffloadFractionIsBitwiseTheCpuStep) {
  const Problem p = make_problem();
  const std::vector<State> want = cpu_reference(p);
  const std::vector<State> gpu = run(p, offload(0.0));
  expect_equal(gpu, want, "offload 0 (all on the GPU) vs the CPU's adamw_step_bf16_remainder");
  for (double fraction : {0.5, 1.0}) {
    const std::string name = "offload " + std::to_string(fraction);
    expect_equal(run(p, offload(fraction)), want, name + ", overlapped, vs the CPU step");
    expect_equal(run(p, offload(fraction)), gpu, name + ", overlapped, vs offload 0");
  }
  expect_equal(run(p, offload(0.5, false)), want, "offload 0.5, copies in turn, vs the CPU step");
  // One chunk as large as the share: a single staging slot in use.
  CudaAdamWOptions one_chunk = offload(1.0);
  one_chunk.chunk_numel = p.n;
  expect_equal(run(p, one_chunk), want, "offload 1.0 in one chunk vs the CPU step");
}

// The engine's grad clip factor, applied inside the step on both shares instead of by a pass
// over the grads (train/cuda_param_store.cpp): bit for bit the CPU step on grads scaled first,
// including products that round into the subnormal range.
TEST_F(CudaAdamWTest, GradScaleIsBitwiseAScalePassFirstAtEveryFraction) {
  Problem p = make_problem();
  for (std::vector<float>& g : p.grads)
    for (int64_t i = 0; i < p.n; i += 97) g[i] = std::copysign(1.5e-38f, g[i]);  // g·c subnormal
  constexpr float kClip = 0.37f;
  Problem scaled = p;
  for (std::vector<float>& g : scaled.grads)
    for (float& x : g) x *= kClip;
  const std::vector<State> want = cpu_reference(scaled);
  for (double fraction : {0.0, 0.5, 1.0})
    for (bool overlap : {true, false}) {
      const std::string name =
          "offload " + std::to_string(fraction) + (overlap ? ", overlapped" : ", in turn");
      expect_equal(run(p, offload(fraction, overlap), nullptr, kClip), want,
                   name + ", step with grad scale 0.37 vs the CPU step on grads scaled first");
    }
}

TEST_F(CudaAdamWTest, OffloadKeepsTheShareOnTheHost) {
  const Problem p = make_problem();
  int64_t host = -1;
  run(p, offload(0.0), &host);
  EXPECT_EQ(host, 0);
  run(p, offload(0.5), &host);
  const int64_t c = 152650;  // round(0.5 · 305,300)
  EXPECT_EQ(host, c * 12 + 2 * 40009 * 4) << "m, v (4 B), mirror, remainders (2 B) and two staging slots";
}

// load_masters and save_masters, piece by piece, against load and save of whole arrays, bit
// for bit: pieces cut inside tensors and across the offloaded share's end.
TEST_F(CudaAdamWTest, PiecewiseLoadAndSaveEqualWholeArrays) {
  const Problem p = make_problem();
  DeviceArena arena("test tensors");
  auto* bits = static_cast<uint16_t*>(arena.allocate_bytes(p.n * 2, "bf16 weights"));
  auto* grads = static_cast<float*>(arena.allocate_bytes(p.n * 4, "grads"));
  std::mt19937 rng(5);
  for (double fraction : {0.0, 0.5, 1.0}) {
    const std::string name = "offload " + std::to_string(fraction);
    CudaAdamWOptions options = offload(fraction);
    options.piece_numel = 30011;
    // The reference: whole arrays in and out, after two steps.
    State want{std::vector<float>(p.n), std::vector<float>(p.n), std::vector<float>(p.n),
               std::vector<uint16_t>(p.n)};
    {
      CudaAdamW whole(p.ranges, p.n, bits, grads, stream_, options);
      whole.load(p.master.data(), nullptr, nullptr);
      for (int s = 1; s <= 2; ++s) {
        LOOM_CUDA_CHECK(cudaMemcpyAsync(grads, p.grads[s - 1].data(), static_cast<size_t>(p.n) * 4,
                                        cudaMemcpyHostToDevice, stream_));
        whole.step(kRecipe, lr_at(s), s);
      }
      whole.save(want.master.data(), want.m.data(), want.v.data());
      LOOM_CUDA_CHECK(
          cudaMemcpy(want.bits.data(), bits, static_cast<size_t>(p.n) * 2, cudaMemcpyDeviceToHost));
    }
    LOOM_CUDA_CHECK(cudaMemset(bits, 0xff, static_cast<size_t>(p.n) * 2));  // no leftovers of the reference
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy stream's fill, before the test stream's work
    CudaAdamW pieces(p.ranges, p.n, bits, grads, stream_, options);
    int64_t next = 0;
    pieces.load_masters([&](int64_t begin, int64_t count, float* dst) {
      EXPECT_EQ(begin, next) << name << ": pieces are asked for in order";
      EXPECT_GT(count, 0) << name;
      EXPECT_LE(count, options.piece_numel) << name << ": a piece larger than piece_numel";
      std::memcpy(dst, p.master.data() + begin, static_cast<size_t>(count) * 4);
      next = begin + count;
    });
    EXPECT_EQ(next, p.n) << name << ": load_masters read every element";
    // Random ranges of 1 .. 70,000 elements, covering [0, n), read back in pieces.
    const auto read_back = [&](CudaAdamW& adam) {
      std::vector<float> out(static_cast<size_t>(p.n), NAN);
      std::uniform_int_distribution<int64_t> size(1, 70000);
      for (int64_t begin = 0; begin < p.n;) {
        const int64_t count = std::min(size(rng), p.n - begin);
        adam.save_masters(begin, count, out.data() + begin);
        begin += count;
      }
      return out;
    };
    std::string d;
    EXPECT_EQ(d = first_difference(read_back(pieces), p.master), "")
        << name << ": masters loaded piece by piece and saved piece by piece differ from the input, " << d;
    for (int s = 1; s <= 2; ++s) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(grads, p.grads[s - 1].data(), static_cast<size_t>(p.n) * 4,
                                      cudaMemcpyHostToDevice, stream_));
      pieces.step(kRecipe, lr_at(s), s);
    }
    State got{read_back(pieces), std::vector<float>(p.n), std::vector<float>(p.n),
              std::vector<uint16_t>(p.n)};
    pieces.save(nullptr, got.m.data(), got.v.data());
    LOOM_CUDA_CHECK(cudaMemcpy(got.bits.data(), bits, static_cast<size_t>(p.n) * 2, cudaMemcpyDeviceToHost));
    expect_equal({got}, {want}, name + ": load_masters + 2 steps + save_masters vs load + 2 steps + save");
  }
}

// save_moments and load_pieces, piece by piece, against save and load of whole arrays, bit for
// bit (what a checkpoint streamed beside the pinned offloaded state uses): the state after two
// steps read in random ranges (cut inside tensors and across the offloaded share's end) is
// save's, and loaded in pieces into another optimizer it is load's: the same weights, saved
// state and third step.
TEST_F(CudaAdamWTest, PiecewiseStateSaveAndLoadEqualWholeArrays) {
  const Problem p = make_problem();
  DeviceArena arena("test tensors");
  auto* bits = static_cast<uint16_t*>(arena.allocate_bytes(p.n * 2, "bf16 weights"));
  auto* grads = static_cast<float*>(arena.allocate_bytes(p.n * 4, "grads"));
  const auto step = [&](CudaAdamW& adam, int s) {
    LOOM_CUDA_CHECK(cudaMemcpyAsync(grads, p.grads[s - 1].data(), static_cast<size_t>(p.n) * 4,
                                    cudaMemcpyHostToDevice, stream_));
    adam.step(kRecipe, lr_at(s), s);
  };
  const auto saved = [&](CudaAdamW& adam) {
    State state{std::vector<float>(p.n), std::vector<float>(p.n), std::vector<float>(p.n),
                std::vector<uint16_t>(p.n)};
    adam.save(state.master.data(), state.m.data(), state.v.data());
    LOOM_CUDA_CHECK(
        cudaMemcpy(state.bits.data(), bits, static_cast<size_t>(p.n) * 2, cudaMemcpyDeviceToHost));
    return state;
  };
  std::mt19937 rng(7);
  for (double fraction : {0.0, 0.5, 1.0}) {
    const std::string name = "offload " + std::to_string(fraction);
    CudaAdamWOptions options = offload(fraction);
    options.piece_numel = 30011;
    State two, three;
    {
      CudaAdamW whole(p.ranges, p.n, bits, grads, stream_, options);
      whole.load(p.master.data(), nullptr, nullptr);
      step(whole, 1);
      step(whole, 2);
      two = saved(whole);
      // Random ranges of 1 .. 70,000 elements covering [0, n): m and v together, then each alone.
      State ranges{std::vector<float>(p.n, NAN), std::vector<float>(p.n, NAN), std::vector<float>(p.n, NAN),
                   two.bits};
      std::uniform_int_distribution<int64_t> size(1, 70000);
      for (int pass = 0; pass < 3; ++pass)
        for (int64_t begin = 0; begin < p.n;) {
          const int64_t count = std::min(size(rng), p.n - begin);
          if (pass == 0) whole.save_masters(begin, count, ranges.master.data() + begin);
          whole.save_moments(begin, count, pass != 2 ? ranges.m.data() + begin : nullptr,
                             pass != 1 ? ranges.v.data() + begin : nullptr);
          begin += count;
        }
      expect_equal({ranges}, {two}, name + ": save_masters + save_moments in ranges vs save");
      step(whole, 3);
      three = saved(whole);
    }
    LOOM_CUDA_CHECK(cudaMemset(bits, 0xff, static_cast<size_t>(p.n) * 2));  // no leftovers of the reference
    LOOM_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy stream's fill, before the test stream's work
    CudaAdamW pieces(p.ranges, p.n, bits, grads, stream_, options);
    int64_t next[3] = {0, 0, 0};
    const auto reader = [&](int group, const std::vector<float>& values) -> CudaRangeRead {
      return [&, group](int64_t begin, int64_t count, float* dst) {
        EXPECT_EQ(begin, next[group]) << name << ": pieces are asked for in order";
        EXPECT_GT(count, 0) << name;
        EXPECT_LE(count, options.piece_numel) << name << ": a piece larger than piece_numel";
        std::memcpy(dst, values.data() + begin, static_cast<size_t>(count) * 4);
        next[group] = begin + count;
      };
    };
    pieces.load_pieces(reader(0, two.master), reader(1, two.m), reader(2, two.v));
    for (int group = 0; group < 3; ++group) EXPECT_EQ(next[group], p.n) << name << ": every element read";
    expect_equal({saved(pieces)}, {two}, name + ": load_pieces + save vs load + save");
    step(pieces, 3);
    expect_equal({saved(pieces)}, {three}, name + ": load_pieces + step 3 vs the whole run's step 3");
  }
}

// state saved at one fraction resumes at another with the same bits (the engine's
// checkpoints are full tensors, layout-independent).
TEST_F(CudaAdamWTest, StateMovesBetweenFractionsBitForBit) {
  const Problem p = make_problem();
  const std::vector<State> want = cpu_reference(p);
  DeviceArena arena("test tensors");
  auto* bits = static_cast<uint16_t*>(arena.allocate_bytes(p.n * 2, "bf16 weights"));
  auto* grads = static_cast<float*>(arena.allocate_bytes(p.n * 4, "grads"));
  State saved{std::vector<float>(p.n), std::vector<float>(p.n), std::vector<float>(p.n), {}};
  {
    CudaAdamW first(p.ranges, p.n, bits, grads, stream_, offload(0.5));
    first.load(p.master.data(), nullptr, nullptr);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(grads, p.grads[0].data(), static_cast<size_t>(p.n) * 4,
                                    cudaMemcpyHostToDevice, stream_));
    first.step(kRecipe, lr_at(1), 1);
    first.save(saved.master.data(), saved.m.data(), saved.v.data());
  }
  for (double fraction : {0.0, 1.0}) {
    CudaAdamW second(p.ranges, p.n, bits, grads, stream_, offload(fraction));
    second.load(saved.master.data(), saved.m.data(), saved.v.data());
    for (int s = 2; s <= kSteps; ++s) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(grads, p.grads[s - 1].data(), static_cast<size_t>(p.n) * 4,
                                      cudaMemcpyHostToDevice, stream_));
      second.step(kRecipe, lr_at(s), s);
    }
    State got{std::vector<float>(p.n), std::vector<float>(p.n), std::vector<float>(p.n),
              std::vector<uint16_t>(p.n)};
    second.save(got.master.data(), got.m.data(), got.v.data());  // waits for the stream's work
    LOOM_CUDA_CHECK(cudaMemcpy(got.bits.data(), bits, static_cast<size_t>(p.n) * 2, cudaMemcpyDeviceToHost));
    expect_equal(
        {got}, {want.back()},
        "saved at offload 0.5 after step 1, resumed at offload " + std::to_string(fraction) + " to step 3");
  }
}

}  // namespace
}  // namespace loom
