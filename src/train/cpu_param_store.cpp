// The CPU parameter store: fp32 weights, main grads and Adam moments in host memory, the
// reference trainer's state (param_store.h).
#include <algorithm>
#include <memory>

#include "core/allocator.h"
#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "optim/grad_clip.h"
#include "parallel/comm_ep_collectives.h"
#include "parallel/comm_tp_collectives.h"
#include "train/param_store.h"

namespace loom {
namespace {

// Each micro-batch's activations in a host arena of its own, freed once its input gradient
// has been sent.
class HostMicroBatchArenas final : public MicroBatchArenas {
 public:
  void begin_step(int count) {
    arenas_.clear();
    arenas_.resize(static_cast<size_t>(count));
  }
  TensorAllocator& of(int mb) override {
    std::unique_ptr<HostArena>& a = arenas_[static_cast<size_t>(mb)];
    if (!a) a = std::make_unique<HostArena>();
    track_peak();
    return *a;
  }
  void release(int mb) override {
    track_peak();
    arenas_[static_cast<size_t>(mb)].reset();
  }
  // The most bytes the live arenas held together (each one's own peak counted with the
  // others' current use; an upper bound as good as the arenas report).
  int64_t peak() const { return peak_; }

 private:
  void track_peak() {
    int64_t in_use = 0;
    for (const auto& a : arenas_)
      if (a) in_use += a->bytes_in_use();
    for (const auto& a : arenas_)
      if (a) peak_ = std::max(peak_, in_use - a->bytes_in_use() + a->peak_bytes());
  }
  std::vector<std::unique_ptr<HostArena>> arenas_;
  int64_t peak_ = 0;
};

class CpuParamStore final : public ParamStore {
 public:
  explicit CpuParamStore(const ParamStoreShape& shape)
      : shape_(shape),
        params_(static_cast<size_t>(shape.padded)),
        grads_(params_.size()),
        adam_m_(static_cast<size_t>(shape.slice)),
        adam_v_(static_cast<size_t>(shape.slice)),
        frozen_(static_cast<size_t>(shape.frozen.total_numel)) {
    // A whole region's segment is the grads there (no reduce-scatter, no second copy); the
    // others' grads one buffer, end to end.
    int64_t own = 0;
    for (const ParamStoreShape::Segment& seg : shape.segments) own += seg.whole ? 0 : seg.count;
    slice_grads_.resize(static_cast<size_t>(own));
    own = 0;
    for (const ParamStoreShape::Segment& seg : shape.segments) {
      segment_grads_.push_back(seg.whole ? grads_.data() + seg.begin : slice_grads_.data() + own);
      own += seg.whole ? 0 : seg.count;
    }
  }

  Ops& ops() override { return ops_; }
  std::unique_ptr<ActivationOffload> activation_offload_create() override { return cpu_activation_offload(); }
  ModelTensors tensors() override {
    if (shape_.frozen.params.empty())
      return {param_views(shape_.table, params_.data()), param_views(shape_.table, grads_.data())};
    ModelTensors t(param_views(shape_.frozen, frozen_.data()), {});
    t.adapters = param_views(shape_.table, params_.data());
    t.adapter_grads = param_views(shape_.table, grads_.data());
    return t;
  }
  void load_frozen(const SliceFill& fill) override { fill(0, shape_.frozen.total_numel, frozen_.data()); }
  void* weights() override { return params_.data(); }
  DType weight_dtype() const override { return DType::f32; }
  float* grads() override { return grads_.data(); }
  float* segment_grads(size_t segment) override { return segment_grads_[segment]; }
  TpCollectives& tp_collectives(Comm& tp, CommTimeout timeout) override {
    if (!tp_collectives_) tp_collectives_ = std::make_unique<CommTpCollectives>(tp, timeout);
    return *tp_collectives_;
  }
  EpCollectives& ep_collectives(Comm& ep, Comm& host_ep, CommTimeout timeout) override {
    if (!ep_collectives_) ep_collectives_ = std::make_unique<CommEpCollectives>(ep, host_ep, timeout);
    return *ep_collectives_;
  }
  void wait() override {}

  MicroBatchArenas& step_arenas(int micro_batches, int64_t) override {
    arenas_.begin_step(micro_batches);
    return arenas_;
  }
  MicroBatch micro_batch(MicroBatchData& data, TensorAllocator&) override { return data.view(); }
  TensorAllocator& weight_cache() override { return weight_cache_; }

  void zero_grads() override { std::fill(grads_.begin(), grads_.end(), 0.0f); }
  void grads_needed() override {}
  void scale_grads(float scale) override {
    for (size_t s = 0; s < shape_.segments.size(); ++s)
      grad_scale(segment_grads_[s], shape_.segments[s].count, scale);
  }
  double sum_squares(const std::vector<std::pair<int64_t, int64_t>>& counted) override {
    double total = 0;
    for (const auto& [offset, count] : counted)
      for_each_segment_piece(shape_.segments, offset, count, [&](size_t s, int64_t at, int64_t n) {
        total += grad_sum_squares(segment_grads_[s] + at, n);
      });
    return total;
  }
  // Segment by segment: the masters of each are its weights (the elementwise update takes
  // any split).
  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    int64_t at = 0;
    for (size_t s = 0; s < shape_.segments.size(); ++s) {
      const ParamStoreShape::Segment& seg = shape_.segments[s];
      adamw_step(adam, lr, step, segment_ranges(shape_, s), params_.data() + seg.begin, segment_grads_[s],
                 adam_m_.data() + at, adam_v_.data() + at);
      at += seg.count;
    }
  }
  std::vector<int64_t> count_nonfinite(const std::vector<TensorRange>& ranges, size_t tensors) override {
    std::vector<int64_t> counts(tensors);
    for (const TensorRange& r : ranges)
      for_each_segment_piece(shape_.segments, r.offset, r.numel, [&](size_t s, int64_t at, int64_t n) {
        nonfinite_count(segment_grads_[s], {{at, n, r.param}}, counts.data());
      });
    return counts;
  }
  std::vector<float> grad_slice_to_host() override {
    std::vector<float> slice;
    for (size_t s = 0; s < shape_.segments.size(); ++s)
      slice.insert(slice.end(), segment_grads_[s], segment_grads_[s] + shape_.segments[s].count);
    return slice;
  }

  void read_state(StateGroup group, int64_t begin, int64_t count, float* dst) override {
    LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= shape_.slice, "state range past the slice");
    if (group != StateGroup::master) {
      std::copy_n((group == StateGroup::adam_m ? adam_m_ : adam_v_).data() + begin, count, dst);
      return;
    }
    int64_t at = 0;
    for_each_segment_piece(shape_.segments, begin, count, [&](size_t s, int64_t in, int64_t n) {
      std::copy_n(params_.data() + shape_.segments[s].begin + in, n, dst + at);
      at += n;
    });
  }
  void load_state(const SliceFill& master, const SliceFill& m, const SliceFill& v) override {
    int64_t at = 0;
    for_each_segment_piece(shape_.segments, 0, shape_.slice, [&](size_t s, int64_t in, int64_t n) {
      master(at, n, params_.data() + shape_.segments[s].begin + in);
      at += n;
    });
    for (auto [data, fill] : {std::pair{adam_m_.data(), &m}, std::pair{adam_v_.data(), &v}}) {
      if (*fill)
        (*fill)(0, shape_.slice, data);
      else
        std::fill_n(data, shape_.slice, 0.0f);
    }
  }

  DType export_dtype() const override { return DType::f32; }
  int64_t peak_bytes() const override {
    const size_t floats = params_.size() + grads_.size() + slice_grads_.size() + adam_m_.size() +
                          adam_v_.size() + frozen_.size();
    return static_cast<int64_t>(floats * sizeof(float)) + arenas_.peak() + weight_cache_.peak_bytes();
  }

 private:
  ParamStoreShape shape_;
  std::vector<float> params_, grads_, slice_grads_, adam_m_, adam_v_, frozen_;
  std::vector<float*> segment_grads_;  // per segment: into grads_ or slice_grads_
  CpuOps ops_;
  HostMicroBatchArenas arenas_;
  HostArena weight_cache_;
  std::unique_ptr<TpCollectives> tp_collectives_;
  std::unique_ptr<EpCollectives> ep_collectives_;
};

}  // namespace

std::unique_ptr<ParamStore> cpu_param_store_create(const ParamStoreShape& shape) {
  return std::make_unique<CpuParamStore>(shape);
}

}  // namespace loom
