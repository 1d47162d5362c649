#include "optim/offload.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace loom {
namespace {

// The parts of `ranges` inside [begin, end), offsets from `begin`.
std::vector<ParamRange> ranges_within(const std::vector<ParamRange>& ranges, int64_t begin, int64_t end) {
  std::vector<ParamRange> out;
  for (const ParamRange& r : ranges) {
    const int64_t lo = std::max(r.offset, begin), hi = std::min(r.offset + r.numel, end);
    if (lo < hi) out.push_back({lo - begin, hi - lo, r.decay});
  }
  return out;
}

void step_chunk(const OffloadChunk& chunk, const OffloadHostState& state, const float* grads,
                const AdamWConfig& cfg, float lr, int64_t step, float grad_scale) {
  const int64_t o = chunk.offset;
  adamw_step_bf16_remainder(cfg, lr, step, chunk.ranges, state.param_bits + o, state.remainder + o, grads,
                            state.m + o, state.v + o, grad_scale);
}

}  // namespace

OffloadPlan offload_plan(const std::vector<ParamRange>& ranges, int64_t numel, double fraction,
                         int64_t chunk_numel) {
  if (!(fraction >= 0.0 && fraction <= 1.0))
    throw_input_error("layout.offload.optimizer_fraction",
                      "found " + std::to_string(fraction) + ", expected a number in [0, 1]");
  LOOM_ASSERT(numel >= 0 && chunk_numel >= 1, "offload_plan needs numel >= 0 and chunk_numel >= 1");
  int64_t end = 0;
  for (const ParamRange& r : ranges) {
    LOOM_ASSERT(r.offset >= end && r.numel >= 0 && r.offset + r.numel <= numel,
                "offload_plan needs sorted, disjoint ranges inside the buffer");
    end = r.offset + r.numel;
  }
  OffloadPlan plan;
  plan.numel = numel;
  plan.chunk_numel = chunk_numel;
  plan.cpu_numel = std::clamp<int64_t>(std::llround(fraction * static_cast<double>(numel)), 0, numel);
  plan.gpu_ranges = ranges_within(ranges, plan.cpu_numel, numel);
  for (int64_t begin = 0; begin < plan.cpu_numel; begin += chunk_numel) {
    const int64_t stop = std::min(begin + chunk_numel, plan.cpu_numel);
    plan.chunks.push_back({begin, stop - begin, ranges_within(ranges, begin, stop)});
  }
  return plan;
}

void offload_step(const OffloadPlan& plan, const OffloadHostState& state, OffloadCopies& copies,
                  const AdamWConfig& cfg, float lr, int64_t step, bool overlap, float grad_scale) {
  const size_t count = plan.chunks.size();
  if (count == 0) return;
  if (!overlap) {
    for (const OffloadChunk& chunk : plan.chunks) {
      copies.start_grads_down(chunk, state.grad_staging[0], 0);
      copies.wait_grads_down(0);
      step_chunk(chunk, state, state.grad_staging[0], cfg, lr, step, grad_scale);
      copies.start_weights_up(chunk, state.param_bits + chunk.offset);
      copies.wait_weights_up();
    }
    copies.finish();
    return;
  }
  copies.start_grads_down(plan.chunks[0], state.grad_staging[0], 0);
  for (size_t k = 0; k < count; ++k) {
    const int slot = static_cast<int>(k % 2);
    // Slot 1 − slot last held chunk k − 1, which the CPU finished in the previous iteration.
    if (k + 1 < count) copies.start_grads_down(plan.chunks[k + 1], state.grad_staging[1 - slot], 1 - slot);
    copies.wait_grads_down(slot);
    step_chunk(plan.chunks[k], state, state.grad_staging[slot], cfg, lr, step, grad_scale);
    copies.start_weights_up(plan.chunks[k], state.param_bits + plan.chunks[k].offset);
  }
  copies.finish();
}

}  // namespace loom
