// What differs by device in the one engine (engine.cpp): where a rank's weights, main grads
// and optimizer state live, and the step's passes over them. The engine owns what differs by
// layout (the shard, the DP slice, the reductions and gathers: rank_shard.h DataParallelState) and
// calls a store for everything that touches memory:
//
//   CPU    fp32 weights, grads and Adam moments in host memory (the reference).
//   CUDA   bf16 weights + int16 remainders (the precision-aware master), fp32 main grads and
//          Adam moments on the GPU, layout.offload's share of the optimizer state in pinned
//          host memory (optim/cuda_adamw.h); the grad scale deferred into the next pass over
//          the grads and the zeroing beside the first forward (cuda_param_store.cpp).
//
// A store holds the rank's shard as one flat buffer of `padded` elements laid out by the
// shard's table (weights and grads), and its DP slice of it: the segments (one per region of
// the shard, rank_shard.h: the dense tensors over DP, the experts over EDP) laid end to end,
// `slice` elements. The optimizer state is the slice's, and so are the grads each region's
// reduce-scatter sums there: a segment's own buffer, or, where the segment is its whole region
// (a group of one rank: dp = 1, or the experts with one EDP rank), the grads themselves, no
// reduce-scatter and no second copy. The masters are the weights of the segments.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "io/checkpoint.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "parallel/comm.h"
#include "train/engine.h"
#include "train/nonfinite.h"
#include "train/stage_pipeline.h"

namespace loom {

struct ParamStoreShape {
  ParamTable table;  // the shard's tensors (local shapes)
  int64_t padded = 0;
  struct Segment {
    int64_t begin = 0;  // in the flat buffer
    int64_t count = 0;
    bool whole = false;  // the whole region: its grads are the grads there
  };
  std::vector<Segment> segments;
  int64_t slice = 0;                     // Σ segments' counts
  std::vector<ParamRange> slice_ranges;  // the tensors of the slice, as slice offsets
  int stage_slots = 1;  // micro-batches a pipeline stage keeps in flight at most (pp − stage)
  // LoRA (engine.h FrozenBase): the frozen base's shard (local shapes), held in the weight
  // dtype with no grads or optimizer state; `table` is then the adapters'. Empty without LoRA.
  ParamTable frozen;
};

// Fills dst[0, count) with the elements [begin, begin + count) of one group of the slice.
using SliceFill = std::function<void(int64_t begin, int64_t count, float* dst)>;

class ParamStore {
 public:
  virtual ~ParamStore() = default;

  virtual Ops& ops() = 0;
  // The device's twin of layout.activation_offload (ops/activation_offload.h), for the model.
  virtual std::unique_ptr<ActivationOffload> activation_offload_create() = 0;
  // Views of the shard's weights and main grads, for the model. With a frozen base, its
  // weights (no grads) and the table's as the adapters (ModelTensors::adapters).
  virtual ModelTensors tensors() = 0;
  // The frozen base's weights from reads of its flat buffer (local elements), once.
  virtual void load_frozen(const SliceFill& fill) = 0;
  // The flat buffers the layout's collectives work on: the weights (of weight_dtype), the
  // grads, and each segment's grads of the slice (the grads there for a whole region).
  virtual void* weights() = 0;
  virtual DType weight_dtype() const = 0;
  virtual float* grads() = 0;
  virtual float* segment_grads(size_t segment) = 0;
  // The model's TP collectives over `tp`, in this device's memory: made by the first call,
  // owned by the store (the CUDA store's bounded wait goes through them until it is gone).
  virtual TpCollectives& tp_collectives(Comm& tp, CommTimeout timeout) = 0;
  // The model's EP collectives over `ep` (a sparse layer's token exchanges; its row counts
  // over `host_ep`, the same group's host Comm), likewise.
  virtual EpCollectives& ep_collectives(Comm& ep, Comm& host_ep, CommTimeout timeout) = 0;
  // The host waits for the device's work queued so far (nothing on the CPU).
  virtual void wait() = 0;

  // A step's memory for its micro-batches (stage_pipeline.h), and one micro-batch's tensors
  // in (or viewing) `arena`; `send_bytes`: the largest input gradient a stage sends back.
  virtual MicroBatchArenas& step_arenas(int micro_batches, int64_t send_bytes) = 0;
  virtual MicroBatch micro_batch(MicroBatchData& data, TensorAllocator& arena) = 0;
  // Memory kept from step to step for what the model derives from the weights (the FP8
  // linear layers' FP8 weights, model/linear.h).
  virtual TensorAllocator& weight_cache() = 0;

  // grads = 0, possibly beside the work queued next; grads_needed() orders everything after it.
  virtual void zero_grads() = 0;
  virtual void grads_needed() = 0;
  // The slice's grads ×= scale (each product rounded to fp32), possibly deferred into the next
  // pass over them.
  virtual void scale_grads(float scale) = 0;
  // Σ g² over `counted` (offset, count ranges of the slice); the rest of the slice scaled too.
  virtual double sum_squares(const std::vector<std::pair<int64_t, int64_t>>& counted) = 0;
  // AdamW on the slice: its weights from its masters, with the grads as scaled so far.
  virtual void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) = 0;
  // counts[r.param] += the NaN and ±inf values of the slice's grads in each range (of the slice).
  virtual std::vector<int64_t> count_nonfinite(const std::vector<TensorRange>& ranges, size_t tensors) = 0;
  // The slice's grads as scaled so far, on the host (tests compare engines by them).
  virtual std::vector<float> grad_slice_to_host() = 0;

  // The slice's state: dst[0, count) = the elements [begin, begin + count) of `group`
  // (masters rebuilt bit for bit where the store keeps them split).
  virtual void read_state(StateGroup group, int64_t begin, int64_t count, float* dst) = 0;
  // The slice's state from reads of each group, in pieces (no host copy of the whole slice);
  // a null m and v: zero moments. The weights outside the slice are the DP all-gather's.
  virtual void load_state(const SliceFill& master, const SliceFill& m, const SliceFill& v) = 0;

  virtual DType export_dtype() const = 0;
  virtual int64_t peak_bytes() const = 0;
};

// Calls piece(segment, offset in that segment, count) for the slice's elements
// [begin, begin + count), one piece per segment they touch, in order.
template <typename Piece>
void for_each_segment_piece(const std::vector<ParamStoreShape::Segment>& segments, int64_t begin,
                            int64_t count, Piece piece) {
  int64_t at = 0;  // the segment's first slice offset
  for (size_t s = 0; s < segments.size(); ++s) {
    const int64_t b = std::max(begin, at), e = std::min(begin + count, at + segments[s].count);
    if (b < e) piece(s, b - at, e - b);
    at += segments[s].count;
  }
}

// The tensors of segment s (its part of shape.slice_ranges), as offsets in that segment.
inline std::vector<ParamRange> segment_ranges(const ParamStoreShape& shape, size_t s) {
  int64_t at = 0;
  for (size_t i = 0; i < s; ++i) at += shape.segments[i].count;
  std::vector<ParamRange> ranges;
  for (const ParamRange& r : shape.slice_ranges)
    if (r.offset >= at && r.offset < at + shape.segments[s].count)
      ranges.push_back({r.offset - at, r.numel, r.decay});
  return ranges;
}

std::unique_ptr<ParamStore> cpu_param_store_create(const ParamStoreShape& shape);
// nullptr when this build has no CUDA backend.
std::unique_ptr<ParamStore> cuda_param_store_create(const ParamStoreShape& shape,
                                                    const EngineOptions& options);

}  // namespace loom
