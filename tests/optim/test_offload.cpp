// The CPU part of the optimizer offload (optim/offload.h): the split and chunking, the order
// of the pipelined copies, and that a step split between a "GPU" share (here the CPU
// reference on the GPU share's own arrays, as the CUDA kernel is bit for bit) and the
// offloaded share gives the reference step's bits at fractions 0, 0.5 and 1.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/offload.h"
#include "optim/precision_master.h"

namespace loom {
namespace {

constexpr AdamWConfig kRecipe{0.9f, 0.98f, 1e-8f, 0.1f};

bool same_ranges(const std::vector<ParamRange>& a, const std::vector<ParamRange>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].offset != b[i].offset || a[i].numel != b[i].numel || a[i].decay != b[i].decay) return false;
  return true;
}

std::string ranges_text(const std::vector<ParamRange>& ranges) {
  std::string out;
  for (const ParamRange& r : ranges)
    out += "{" + std::to_string(r.offset) + ", " + std::to_string(r.numel) + ", " +
           (r.decay ? "decay" : "no decay") + "} ";
  return out;
}

TEST(OffloadPlan, SplitsAtTheFractionAndChunksAcrossTensors) {
  // Three tensors with a gap (elements 15..19 in no range) and an untouched tail (33..39).
  const std::vector<ParamRange> ranges{{0, 10, true}, {10, 5, false}, {20, 13, true}};
  const OffloadPlan plan = offload_plan(ranges, 40, 0.5, 7);
  EXPECT_EQ(plan.cpu_numel, 20);
  EXPECT_EQ(plan.gpu_numel(), 20);
  ASSERT_EQ(plan.chunks.size(), 3u);
  EXPECT_EQ(plan.chunks[0].offset, 0);
  EXPECT_EQ(plan.chunks[0].numel, 7);
  EXPECT_TRUE(same_ranges(plan.chunks[0].ranges, {{0, 7, true}})) << ranges_text(plan.chunks[0].ranges);
  EXPECT_EQ(plan.chunks[1].offset, 7);
  EXPECT_TRUE(same_ranges(plan.chunks[1].ranges, {{0, 3, true}, {3, 4, false}}))
      << ranges_text(plan.chunks[1].ranges);
  EXPECT_EQ(plan.chunks[2].offset, 14);
  EXPECT_EQ(plan.chunks[2].numel, 6);
  EXPECT_TRUE(same_ranges(plan.chunks[2].ranges, {{0, 1, false}})) << ranges_text(plan.chunks[2].ranges);
  EXPECT_TRUE(same_ranges(plan.gpu_ranges, {{0, 13, true}})) << ranges_text(plan.gpu_ranges);
}

TEST(OffloadPlan, FractionsZeroAndOneLeaveOneShare) {
  const std::vector<ParamRange> ranges{{0, 10, true}, {10, 5, false}};
  const OffloadPlan none = offload_plan(ranges, 15, 0.0, 4);
  EXPECT_EQ(none.cpu_numel, 0);
  EXPECT_TRUE(none.chunks.empty());
  EXPECT_TRUE(same_ranges(none.gpu_ranges, ranges)) << ranges_text(none.gpu_ranges);
  const OffloadPlan all = offload_plan(ranges, 15, 1.0, 4);
  EXPECT_EQ(all.cpu_numel, 15);
  EXPECT_TRUE(all.gpu_ranges.empty());
  ASSERT_EQ(all.chunks.size(), 4u);
  EXPECT_EQ(all.chunks.back().numel, 3);
  EXPECT_EQ(offload_plan(ranges, 15, 1.0 / 3.0, 100).cpu_numel, 5);  // round(5.0)
  EXPECT_EQ(offload_plan(ranges, 15, 0.1, 100).cpu_numel, 2);        // round(1.5), half away from 0
}

TEST(OffloadPlan, FractionOutsideZeroOneNamesTheField) {
  const std::vector<ParamRange> ranges{{0, 10, true}};
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    try {
      offload_plan(ranges, 10, bad, 4);
      FAIL() << "fraction " << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("layout.offload.optimizer_fraction"), std::string::npos)
          << e.what();
    }
  }
}

// Every element of every range lands in exactly one share with its decay, for many chunk
// sizes and fractions.
TEST(OffloadPlan, SharesCoverEveryRangeOnce) {
  const std::vector<ParamRange> ranges{{0, 97, true}, {97, 3, false}, {110, 1, false}, {111, 250, true}};
  const int64_t n = 400;
  for (double fraction : {0.0, 0.13, 0.25, 0.5, 0.99, 1.0})
    for (int64_t chunk : {1, 2, 3, 7, 64, 1000}) {
      const OffloadPlan plan = offload_plan(ranges, n, fraction, chunk);
      std::vector<int> seen(n, 0);
      std::vector<int> decay(n, -1);
      int64_t next = 0;
      for (const OffloadChunk& c : plan.chunks) {
        EXPECT_EQ(c.offset, next);
        EXPECT_LE(c.numel, chunk);
        next += c.numel;
        for (const ParamRange& r : c.ranges)
          for (int64_t i = 0; i < r.numel; ++i) {
            ASSERT_LT(r.offset + i, c.numel);
            ++seen[c.offset + r.offset + i];
            decay[c.offset + r.offset + i] = r.decay;
          }
      }
      EXPECT_EQ(next, plan.cpu_numel);
      for (const ParamRange& r : plan.gpu_ranges)
        for (int64_t i = 0; i < r.numel; ++i) {
          ++seen[plan.cpu_numel + r.offset + i];
          decay[plan.cpu_numel + r.offset + i] = r.decay;
        }
      std::vector<int> want(n, 0), want_decay(n, -1);
      for (const ParamRange& r : ranges)
        for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
          want[i] = 1;
          want_decay[i] = r.decay;
        }
      EXPECT_EQ(seen, want) << "fraction " << fraction << ", chunk " << chunk;
      EXPECT_EQ(decay, want_decay) << "fraction " << fraction << ", chunk " << chunk;
    }
}

// A device simulated in host memory. eager: a copy happens when it starts (so a slot
// refilled too early overwrites grads the CPU has not stepped yet); lazy: when it is waited
// for (so a step that does not wait reads stale grads). Either mistake changes the bits.
class FakeCopies final : public OffloadCopies {
 public:
  FakeCopies(const float* device_grads, uint16_t* device_bits, bool eager)
      : grads_(device_grads), bits_(device_bits), eager_(eager) {}

  void start_grads_down(const OffloadChunk& chunk, float* staging, int slot) override {
    log += "down" + std::to_string(chunk.offset) + "@" + std::to_string(slot) + " ";
    EXPECT_FALSE(pending_[slot].active) << "slot " << slot << " refilled before its copy was waited for";
    pending_[slot] = {true, chunk.offset, chunk.numel, staging};
    if (eager_) land(slot);
  }
  void wait_grads_down(int slot) override {
    log += "wait@" + std::to_string(slot) + " ";
    EXPECT_TRUE(pending_[slot].active) << "wait on slot " << slot << " with no copy under way";
    if (!eager_) land(slot);
    pending_[slot].active = false;
  }
  void start_weights_up(const OffloadChunk& chunk, const uint16_t* bits) override {
    log += "up" + std::to_string(chunk.offset) + " ";
    ups_.push_back({chunk.offset, chunk.numel, bits});
    if (eager_) wait_weights_up();
  }
  void wait_weights_up() override {
    for (const Up& u : ups_) std::memcpy(bits_ + u.offset, u.bits, static_cast<size_t>(u.numel) * 2);
    ups_.clear();
  }
  void finish() override {
    log += "finish";
    wait_weights_up();
  }

  std::string log;

 private:
  struct Pending {
    bool active = false;
    int64_t offset = 0, numel = 0;
    float* staging = nullptr;
  };
  struct Up {
    int64_t offset, numel;
    const uint16_t* bits;
  };
  void land(int slot) {
    const Pending& p = pending_[slot];
    std::memcpy(p.staging, grads_ + p.offset, static_cast<size_t>(p.numel) * 4);
  }
  const float* grads_;
  uint16_t* bits_;
  bool eager_;
  Pending pending_[2];
  std::vector<Up> ups_;
};

TEST(OffloadStep, OverlappedCopiesRunOneChunkAhead) {
  const std::vector<ParamRange> ranges{{0, 12, true}};
  const OffloadPlan plan = offload_plan(ranges, 12, 1.0, 4);
  std::vector<float> grads(12, 1e-3f), staging0(4), staging1(4), m(12), v(12);
  std::vector<uint16_t> device_bits(12), mirror(12);
  std::vector<int16_t> rem(12);
  const OffloadHostState state{
      mirror.data(), rem.data(), m.data(), v.data(), {staging0.data(), staging1.data()}};
  FakeCopies overlapped(grads.data(), device_bits.data(), true);
  offload_step(plan, state, overlapped, kRecipe, 1e-3f, 1, true);
  EXPECT_EQ(overlapped.log, "down0@0 down4@1 wait@0 up0 down8@0 wait@1 up4 wait@0 up8 finish");
  FakeCopies in_turn(grads.data(), device_bits.data(), true);
  offload_step(plan, state, in_turn, kRecipe, 1e-3f, 2, false);
  EXPECT_EQ(in_turn.log, "down0@0 wait@0 up0 down4@0 wait@0 up4 down8@0 wait@0 up8 finish");
}

// The element-wise formula of optim/adamw.h written out once more, scalar, to hold the
// library's SIMD loop to it (x86-64's baseline has no FMA, so nothing here can contract).
void scalar_reference_step(const std::vector<ParamRange>& ranges, float lr, int64_t step, uint16_t* bits,
                           int16_t* rem, const float* grad, float* m, float* v) {
  const float bc1 = adamw_bias_correction(kRecipe.beta1, step),
              bc2 = adamw_bias_correction(kRecipe.beta2, step);
  for (const ParamRange& r : ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      float p = master_rebuild(bits[i], rem[i]);
      const float decay = r.decay ? kRecipe.weight_decay : 0.0f;
      m[i] = kRecipe.beta1 * m[i] + (1.0f - kRecipe.beta1) * grad[i];
      v[i] = kRecipe.beta2 * v[i] + (1.0f - kRecipe.beta2) * grad[i] * grad[i];
      const float denom = std::sqrt(v[i] / bc2) + kRecipe.eps;
      p = p - lr * ((m[i] / bc1) / denom + decay * p);
      master_split(p, &bits[i], &rem[i]);
    }
}

struct Problem {
  std::vector<ParamRange> ranges;
  int64_t n = 0;
  std::vector<float> master;
  std::vector<std::vector<float>> grads;  // per step
};

// A model-like table (a big matrix, a norm, an odd-sized matrix, a gap, a norm), masters
// with all 32 bits in use, and grads whose magnitudes span 1e-10 .. 1 (sqrt(v̂) near eps).
Problem make_problem(int steps) {
  Problem p;
  p.ranges = {{0, 40000, true}, {40000, 256, false}, {40256, 30011, true}, {70300, 129, false}};
  p.n = 70500;
  std::mt19937 rng(7);
  std::normal_distribution<float> w(0.0f, 0.05f);
  p.master.resize(static_cast<size_t>(p.n));
  for (float& x : p.master) x = w(rng);
  for (int64_t i = 0; i < p.n; i += 97)  // exact ties between two bf16 values
    p.master[i] = std::bit_cast<float>((std::bit_cast<uint32_t>(p.master[i]) & 0xffff0000u) | 0x8000u);
  std::uniform_real_distribution<float> exponent(-10.0f, 0.0f);
  std::bernoulli_distribution sign(0.5);
  for (int s = 0; s < steps; ++s) {
    std::vector<float> g(static_cast<size_t>(p.n));
    for (float& x : g) x = (sign(rng) ? -1.0f : 1.0f) * std::pow(10.0f, exponent(rng));
    p.grads.push_back(std::move(g));
  }
  return p;
}

template <typename T>
int64_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<int64_t>(i);
  return a.size() == b.size() ? -1 : static_cast<int64_t>(std::min(a.size(), b.size()));
}

// The split step with the device's grads multiplied by grad_scale as they are stepped (a GPU
// engine's pending clip factor: both shares, offload_step's and the GPU share's) against the
// reference and the scalar formula on grads that a pass x *= grad_scale stored first.
void expect_split_step_bitwise(float grad_scale) {
  constexpr int kSteps = 3;
  const Problem p = make_problem(kSteps);
  std::vector<std::vector<float>> scaled = p.grads;
  for (std::vector<float>& g : scaled)
    for (float& x : g) x *= grad_scale;
  std::vector<uint16_t> ref_bits(static_cast<size_t>(p.n)), scalar_bits;
  std::vector<int16_t> ref_rem(static_cast<size_t>(p.n)), scalar_rem;
  master_split_array(p.master.data(), p.n, ref_bits.data(), ref_rem.data());
  scalar_bits = ref_bits;
  scalar_rem = ref_rem;
  std::vector<float> ref_m(p.n, 0.0f), ref_v(p.n, 0.0f), scalar_m(ref_m), scalar_v(ref_v);
  std::vector<std::vector<uint16_t>> bits_after;
  std::vector<std::vector<int16_t>> rem_after;
  std::vector<std::vector<float>> m_after, v_after;
  for (int s = 0; s < kSteps; ++s) {
    const float lr = 1e-3f * static_cast<float>(s + 1);
    adamw_step_bf16_remainder(kRecipe, lr, s + 1, p.ranges, ref_bits.data(), ref_rem.data(), scaled[s].data(),
                              ref_m.data(), ref_v.data());
    scalar_reference_step(p.ranges, lr, s + 1, scalar_bits.data(), scalar_rem.data(), scaled[s].data(),
                          scalar_m.data(), scalar_v.data());
    ASSERT_EQ(first_difference(ref_bits, scalar_bits), -1)
        << "the SIMD loop's weights differ from the scalar formula";
    ASSERT_EQ(first_difference(ref_rem, scalar_rem), -1);
    ASSERT_EQ(first_difference(ref_m, scalar_m), -1);
    ASSERT_EQ(first_difference(ref_v, scalar_v), -1);
    bits_after.push_back(ref_bits);
    rem_after.push_back(ref_rem);
    m_after.push_back(ref_m);
    v_after.push_back(ref_v);
  }

  for (double fraction : {0.0, 0.5, 1.0})
    for (bool overlap : {true, false})
      for (bool eager : {true, false}) {
        const std::string what = "grad scale " + std::to_string(grad_scale) + ", fraction " +
                                 std::to_string(fraction) + (overlap ? ", overlapped" : ", in turn") +
                                 (eager ? ", eager copies" : ", lazy copies");
        const OffloadPlan plan = offload_plan(p.ranges, p.n, fraction, 4099);
        const int64_t c = plan.cpu_numel, g = plan.gpu_numel();
        // The device: all bf16 weights (what the model reads); the GPU share's remainders and moments.
        std::vector<uint16_t> device_bits(static_cast<size_t>(p.n));
        std::vector<int16_t> all_rem(static_cast<size_t>(p.n));
        master_split_array(p.master.data(), p.n, device_bits.data(), all_rem.data());
        std::vector<int16_t> gpu_rem(all_rem.begin() + c, all_rem.end());
        std::vector<float> gpu_m(g, 0.0f), gpu_v(g, 0.0f);
        // The host: the offloaded share's mirror, remainders, moments, staging.
        std::vector<uint16_t> mirror(device_bits.begin(), device_bits.begin() + c);
        std::vector<int16_t> cpu_rem(all_rem.begin(), all_rem.begin() + c);
        std::vector<float> cpu_m(c, 0.0f), cpu_v(c, 0.0f), stage0(plan.chunk_numel), stage1(plan.chunk_numel);
        const OffloadHostState state{
            mirror.data(), cpu_rem.data(), cpu_m.data(), cpu_v.data(), {stage0.data(), stage1.data()}};
        for (int s = 0; s < kSteps; ++s) {
          const std::vector<float>& device_grads = p.grads[s];
          FakeCopies copies(device_grads.data(), device_bits.data(), eager);
          const float lr = 1e-3f * static_cast<float>(s + 1);
          adamw_step_bf16_remainder(kRecipe, lr, s + 1, plan.gpu_ranges, device_bits.data() + c,
                                    gpu_rem.data(), device_grads.data() + c, gpu_m.data(), gpu_v.data(),
                                    grad_scale);
          offload_step(plan, state, copies, kRecipe, lr, s + 1, overlap, grad_scale);
          std::vector<int16_t> rem(cpu_rem);
          rem.insert(rem.end(), gpu_rem.begin(), gpu_rem.end());
          std::vector<float> m(cpu_m), v(cpu_v);
          m.insert(m.end(), gpu_m.begin(), gpu_m.end());
          v.insert(v.end(), gpu_v.begin(), gpu_v.end());
          const std::string at = what + ", step " + std::to_string(s + 1) + ", offloaded share [0, " +
                                 std::to_string(c) + "): first differing element ";
          EXPECT_EQ(first_difference(device_bits, bits_after[s]), -1) << at << "(bf16 weights on the device)";
          EXPECT_EQ(first_difference(rem, rem_after[s]), -1) << at << "(remainders)";
          EXPECT_EQ(first_difference(m, m_after[s]), -1) << at << "(m)";
          EXPECT_EQ(first_difference(v, v_after[s]), -1) << at << "(v)";
          EXPECT_EQ(
              first_difference(std::vector<uint16_t>(device_bits.begin(), device_bits.begin() + c), mirror),
              -1)
              << at << "(host mirror vs device weights)";
        }
      }
}

TEST(OffloadStep, SplitStepIsBitwiseTheReferenceAtFractionsZeroHalfOne) {
  expect_split_step_bitwise(1.0f);
}

TEST(OffloadStep, GradScaleInTheSplitStepIsBitwiseAScalePassFirst) {
  expect_split_step_bitwise(0.37f);
}

}  // namespace
}  // namespace loom
