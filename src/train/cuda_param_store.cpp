// The CUDA parameter store (param_store.h): one GPU's bf16 weights with int16 remainders (the
// precision-aware master: master = bf16 high half + remainder low half, bit for bit), fp32
// main grads and Adam moments, activations in arenas of their own. The optimizer is CudaAdamW
// (optim/cuda_adamw.h): the remainders and moments of layout.offload's share of the slice
// live in pinned host memory and are stepped on the CPU, the same bits as on the GPU.
//
// The step's scale factors cost no pass of their own over the fp32 grads (8.1 GB at 1.7B):
// scale_grads(s) only records s, and the next pass applies it bit for bit as a pass
// x[i] *= s would have (the product rounded to fp32 before use). sum_squares scales and sums
// in one kernel (the 1/Σn: a read pass saved), optimizer_step multiplies inside the AdamW
// update on both shares (the clip: a read + write pass saved); any other reader or writer of
// the grads applies the pending factor first.
//
// Zeroing the grads runs on a stream of its own, beside the first micro-batch's forward,
// which reads no grad; the first backward, and anything else that touches the grads, waits
// for it first (grads_needed).
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "ops/cuda/activation_offload.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/stream.h"
#include "optim/cuda_adamw.h"
#include "parallel/comm_ep_collectives.h"
#include "parallel/comm_tp_collectives.h"
#include "parallel/overlapped_tp_collectives.h"
#include "train/cuda_device.h"
#include "train/param_store.h"

namespace loom {
namespace {

// The micro-batches of a step in slots of device memory: micro-batch mb's forward tensors in
// slot mb mod slots. 1F1B keeps at most min(pp − stage, M) micro-batches in flight on a stage
// (the warm-up forwards and one more), and the one a slot held before has finished its
// backward when the slot is reused; the input gradient that backward sends on is copied out
// first (sendable), since the next micro-batch's input may arrive into the same slot in the
// same exchange. With several slots every backward's tensors go into one arena of their own,
// so the gradient buffers exist once, not once per micro-batch in flight (as the plan counts
// them); with one slot (the last stage, one GPU) they follow the forward's in the slot.
// A slot's arena keeps its blocks from step to step.
class DeviceSlotArenas final : public MicroBatchArenas {
 public:
  DeviceSlotArenas(int slots, cudaStream_t stream) : stream_(stream) {
    for (int i = 0; i < slots; ++i) slots_.push_back(std::make_unique<DeviceArena>("activations"));
  }
  void begin_step(int64_t send_bytes) {
    owner_.assign(slots_.size(), -1);
    send_.release_all();
    send_buffer_ = send_bytes > 0 ? send_.allocate_bytes(send_bytes, "pipeline send buffer") : nullptr;
  }
  TensorAllocator& of(int mb) override {
    const size_t slot = static_cast<size_t>(mb) % slots_.size();
    if (owner_[slot] != mb) {
      slots_[slot]->release_all();
      owner_[slot] = mb;
    }
    return *slots_[slot];
  }
  void release(int) override {}
  TensorAllocator& backward_scratch(int mb) override {
    if (slots_.size() == 1) return of(mb);
    backward_.release_all();
    return backward_;
  }
  const void* sendable(int, Tensor d_input) override {
    cuda::copy_async(send_buffer_, d_input.data, d_input.nbytes(), stream_);
    return send_buffer_;
  }

 private:
  cudaStream_t stream_;
  std::vector<std::unique_ptr<DeviceArena>> slots_;
  std::vector<int> owner_;
  DeviceArena backward_{"activations (backward)"};
  DeviceArena send_{"pipeline send buffer"};
  void* send_buffer_ = nullptr;
};

// The FP8 weight cache in one block (model/linear.h: W and Wᵀ in FP8 of each linear layer, and
// their scale and amax, or under block scaling the block scales of both; and the FP8
// statistics' two counters), so that its first cast is not hundreds of cudaMallocs.
int64_t fp8_weight_bytes(const ParamTable& table, Fp8Scaling scaling) {
  constexpr int64_t kAlignment = 256;  // DeviceArena's
  const auto aligned = [](int64_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; };
  static_assert(Fp8Stats::kKinds * 2 * sizeof(int64_t) <= kAlignment, "the FP8 statistics' counters");
  int64_t bytes = 2 * kAlignment;  // BlockLinears::census_begin's amax and counts
  for (const ParamSpec& p : table.params) {
    if (p.kind != ParamKind::qkv && p.kind != ParamKind::o_proj && p.kind != ParamKind::gate_up &&
        p.kind != ParamKind::down)
      continue;
    bytes += 2 * aligned(p.numel());
    if (scaling == Fp8Scaling::tensor) {
      bytes += 2 * kAlignment;
    } else {
      const int64_t n = p.shape[0], k = p.shape[1];
      bytes += aligned(4 * fp8_block_scales_shape(Fp8Blocks::block128x128, n, k).numel()) +
               aligned(4 * fp8_block_scales_shape(Fp8Blocks::block128x128, k, n).numel());
    }
  }
  return bytes;
}

class CudaParamStore final : public ParamStore {
 public:
  CudaParamStore(const ParamStoreShape& shape, const EngineOptions& options)
      : shape_(shape),
        timeout_(options.comm_timeout),
        weight_cache_("FP8 weights",
                      options.linear_precision.fp8
                          ? fp8_weight_bytes(shape.frozen.params.empty() ? shape.table : shape.frozen,
                                             options.linear_precision.scaling)
                          : 0),
        arenas_(shape.stage_slots, ops_.stream()) {
    ops_.set_attention_backward_by_row(options.attention_backward_by_row);
    param_bits_ = static_cast<uint16_t*>(weights_.allocate_bytes(shape.padded * 2, "bf16 weights"));
    if (shape.frozen.total_numel > 0)
      frozen_bits_ = static_cast<uint16_t*>(
          weights_.allocate_bytes(shape.frozen.total_numel * 2, "frozen bf16 weights"));
    grads_ = static_cast<float*>(grads_arena_.allocate_bytes(shape.padded * 4, "fp32 main grads"));
    // A whole region's segment is the grads there (no reduce-scatter, no second copy); the
    // others' grads one buffer, end to end.
    int64_t own = 0;
    for (const ParamStoreShape::Segment& seg : shape.segments) own += seg.whole ? 0 : seg.count;
    float* slice_grads =
        own == 0 ? nullptr : static_cast<float*>(grads_arena_.allocate_bytes(own * 4, "fp32 grad slice"));
    // The padding past the shard's tensors is never written by the model: zero it once.
    cuda::fill_async(param_bits_, 0, static_cast<size_t>(shape.padded) * 2, ops_.stream());
    CudaAdamWOptions adam;
    adam.offload_fraction = options.offload.fraction;
    adam.overlap = options.offload.overlap;
    // A CudaAdamW a segment, each over its own weights (the masters) and grads: the
    // elementwise update takes any split, so the bits are those of one over the slice, and
    // each offloads layout.offload's fraction of its segment.
    for (size_t s = 0; s < shape.segments.size(); ++s) {
      const ParamStoreShape::Segment& seg = shape.segments[s];
      segment_grads_.push_back(seg.whole ? grads_ + seg.begin
                                         : std::exchange(slice_grads, slice_grads + seg.count));
      optimizers_.push_back(std::make_unique<CudaAdamW>(segment_ranges(shape, s), seg.count,
                                                        param_bits_ + seg.begin, segment_grads_.back(),
                                                        ops_.stream(), adam));
    }
  }

  // A run ended by an error may leave TP collectives queued on the stream, which CudaOps'
  // destructor would wait for without a bound: the bounded wait gives up on them instead
  // (aborting the TP communicator ends its kernels). The error that ended the run is the one
  // to report, so this one is dropped.
  ~CudaParamStore() override {
    if (!stream_comm_) return;
    try {
      stream_comm_->synchronize(timeout_);
    } catch (const std::exception&) {
    }
  }
  CudaParamStore(const CudaParamStore&) = delete;
  CudaParamStore& operator=(const CudaParamStore&) = delete;

  Ops& ops() override { return ops_; }
  std::unique_ptr<ActivationOffload> activation_offload_create() override {
    return cuda_activation_offload(ops_.stream());
  }
  ModelTensors tensors() override {
    if (shape_.frozen.params.empty())
      return {param_views(shape_.table, param_bits_, DType::bf16, Device::cuda),
              param_views(shape_.table, grads_, DType::f32, Device::cuda)};
    ModelTensors t(param_views(shape_.frozen, frozen_bits_, DType::bf16, Device::cuda), {});
    t.adapters = param_views(shape_.table, param_bits_, DType::bf16, Device::cuda);
    t.adapter_grads = param_views(shape_.table, grads_, DType::f32, Device::cuda);
    return t;
  }
  // A piece at a time through host memory, rounded to bf16 there (the base never changes: no
  // remainders are kept).
  void load_frozen(const SliceFill& fill) override {
    constexpr int64_t kPiece = int64_t{1} << 24;
    std::vector<float> piece;
    std::vector<bf16> bits;
    for (int64_t at = 0; at < shape_.frozen.total_numel; at += kPiece) {
      const int64_t n = std::min(kPiece, shape_.frozen.total_numel - at);
      piece.resize(static_cast<size_t>(n));
      bits.resize(static_cast<size_t>(n));
      fill(at, n, piece.data());
      for (size_t i = 0; i < piece.size(); ++i) bits[i] = float_to_bf16(piece[i]);
      ops_.copy_from_host(Tensor{frozen_bits_ + at, {n}, DType::bf16, Device::cuda}, bits.data());
    }
  }
  void* weights() override { return param_bits_; }
  DType weight_dtype() const override { return DType::bf16; }
  float* grads() override { return grads_; }
  float* segment_grads(size_t segment) override { return segment_grads_[segment]; }

  // Over NCCL the collectives are queued on the stream, the backward's started ones on a
  // communication stream beside it (OverlappedTpCollectives); over a Comm that cannot be
  // stream-ordered (HostStagedComm, a world of one) each one after a wait for the stream.
  // The device's exchanges through the EP Comm (NCCL's grouped send/recv), the rank's own rows
  // copied on the stream; the host waits for their producers first.
  EpCollectives& ep_collectives(Comm& ep, Comm& host_ep, CommTimeout timeout) override {
    if (!ep_collectives_)
      ep_collectives_ = std::make_unique<CommEpCollectives>(
          ep, host_ep, timeout, [this] { wait(); },
          [this](void* dst, const void* src, size_t bytes) {
            cuda::copy_async(dst, src, bytes, ops_.stream());
          });
    return *ep_collectives_;
  }
  TpCollectives& tp_collectives(Comm& tp, CommTimeout timeout) override {
    if (tp_collectives_) return *tp_collectives_;
    std::unique_ptr<OverlappedTpCollectives> overlapped =
        overlapped_tp_collectives_create(tp, ops_.stream(), timeout);
    if (!overlapped) {
      tp_collectives_ = std::make_unique<CommTpCollectives>(tp, timeout, [this] { wait(); });
      return *tp_collectives_;
    }
    stream_comm_ = &overlapped->on_compute();
    ops_.set_stream_wait([this] { wait(); });
    tp_collectives_ = std::move(overlapped);
    return *tp_collectives_;
  }

  // With TP collectives queued on the stream, through the TP Comm's bounded wait: a peer
  // that never joins one makes it throw (exit 3) naming the collective, instead of hanging.
  void wait() override {
    if (stream_comm_)
      stream_comm_->synchronize(timeout_);
    else
      cuda::synchronize(ops_.stream());
  }

  MicroBatchArenas& step_arenas(int, int64_t send_bytes) override {
    arenas_.begin_step(send_bytes);
    return arenas_;
  }
  // `data` must stay alive until the stream has run the copies.
  TensorAllocator& weight_cache() override { return weight_cache_; }
  MicroBatch micro_batch(MicroBatchData& data, TensorAllocator& arena) override {
    MicroBatch b;
    b.ids = cuda::upload_i32(data.ids, arena, ops_.stream(), "token ids");
    b.targets = cuda::upload_i32(data.targets, arena, ops_.stream(), "targets");
    b.rows = data.rows;
    b.routing_census = data.routing_census;
    b.aux_loss_weight = data.aux_loss_weight;
    // Context parallelism: the spans stay on the host (the attention's tables are built from
    // them), the orders of the all-gathered qkv go to the device for gather_rows.
    b.context = data.context;
    if (!data.cp_row_order.empty()) {
      b.cp_row_order = cuda::upload_i32(data.cp_row_order, arena, ops_.stream(), "CP row order");
      b.cp_rank_order = cuda::upload_i32(data.cp_rank_order, arena, ops_.stream(), "CP rank order");
    }
    if (data.lora_dropout > 0) {
      const Tensor tokens =
          cuda::upload_i32(data.lora_dropout_tokens, arena, ops_.stream(), "LoRA dropout's token pairs");
      b.lora_dropout = {data.lora_dropout, data.lora_dropout_seed, data.lora_dropout_step,
                        tokens.reshaped({tokens.numel() / 2, 2})};
    }
    if (!data.loss_positions.empty()) {
      b.loss_positions = cuda::upload_i32(data.loss_positions, arena, ops_.stream(), "loss row positions");
      b.loss_targets = cuda::upload_i32(data.loss_targets, arena, ops_.stream(), "loss row targets");
      b.loss_rows = data.loss_rows;
    }
    return b;
  }

  void zero_grads() override {
    if (++steps_begun_ == 2) ops_.profile_discard();
    pending_scale_ = 1.0f;
    // After the stream's work so far: the last step's update and copies down (offload_step
    // waited for every one of those before it returned) are the last readers of the grads.
    zeroing_stream_.start_after(ops_.stream());
    cuda::fill_async(grads_, 0, static_cast<size_t>(shape_.padded) * 4, zeroing_stream_.get());
    zeroing_ = true;
  }
  void grads_needed() override {
    if (zeroing_) zeroing_stream_.join_into(ops_.stream());
    zeroing_ = false;
  }
  // Two factors are two roundings: a pending one is applied before the next is recorded.
  void scale_grads(float scale) override {
    grads_needed();
    apply_pending_scale();
    pending_scale_ = scale;
  }
  // The pending factor applies to the whole slice: the counted ranges scale and sum in one
  // pass, the rest (replicas counted on another rank) scale alone.
  double sum_squares(const std::vector<std::pair<int64_t, int64_t>>& counted) override {
    grads_needed();
    const float scale = std::exchange(pending_scale_, 1.0f);
    double total = 0;
    int64_t at = 0;
    const auto scale_alone = [&](int64_t begin, int64_t end) {
      if (scale == 1.0f || begin >= end) return;
      for_each_segment_piece(shape_.segments, begin, end - begin, [&](size_t s, int64_t in, int64_t n) {
        cuda::scale_inplace(segment_grads_[s] + in, n, scale, ops_.stream());
      });
    };
    for (const auto& [offset, count] : counted) {
      scale_alone(at, offset);
      for_each_segment_piece(shape_.segments, offset, count, [&](size_t s, int64_t in, int64_t n) {
        float* g = segment_grads_[s] + in;
        total += scale == 1.0f ? ops_.sum_squares(g, n) : ops_.scale_sum_squares(g, n, scale);
      });
      at = offset + count;
    }
    scale_alone(at, shape_.slice);
    return total;
  }
  // The update reads grad · pending_scale_; the grads in memory stay as they are, so the
  // factor stays pending for a later reader (grad_slice_to_host, count_nonfinite) until
  // zero_grads.
  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    grads_needed();
    for (const std::unique_ptr<CudaAdamW>& optimizer : optimizers_)
      optimizer->step(adam, lr, step, pending_scale_);
  }
  // On the GPU: the grads are not copied (8.1 GB at 1.7B). A segment at a time, each range's
  // piece in it at that segment's offsets.
  std::vector<int64_t> count_nonfinite(const std::vector<TensorRange>& ranges, size_t tensors) override {
    grads_needed();
    apply_pending_scale();
    std::vector<std::vector<cuda::CountRange>> on_device(shape_.segments.size());
    for (const TensorRange& r : ranges)
      for_each_segment_piece(shape_.segments, r.offset, r.numel, [&](size_t s, int64_t in, int64_t n) {
        on_device[s].push_back({in, n, r.param});
      });
    std::vector<int64_t> counts(tensors);
    for (size_t s = 0; s < on_device.size(); ++s) {
      if (on_device[s].empty()) continue;
      const std::vector<int64_t> mine =
          ops_.count_nonfinite(segment_grads_[s], on_device[s], static_cast<int>(tensors));
      for (size_t t = 0; t < tensors; ++t) counts[t] += mine[t];
    }
    return counts;
  }
  std::vector<float> grad_slice_to_host() override {
    grads_needed();
    apply_pending_scale();
    std::vector<float> slice(static_cast<size_t>(shape_.slice));
    int64_t at = 0;
    for (size_t s = 0; s < shape_.segments.size(); ++s) {
      cuda::copy_async(slice.data() + at, segment_grads_[s],
                       static_cast<size_t>(shape_.segments[s].count) * 4, ops_.stream());
      at += shape_.segments[s].count;
    }
    wait();
    return slice;
  }

  // The state of the slice [begin, begin + count) from each segment's CudaAdamW in turn.
  void read_state(StateGroup group, int64_t begin, int64_t count, float* dst) override {
    LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= shape_.slice, "state range past the slice");
    for_each_segment_piece(shape_.segments, begin, count, [&](size_t s, int64_t in, int64_t n) {
      float* to = dst + (slice_offset(s) + in - begin);
      if (group == StateGroup::master)
        optimizers_[s]->save_masters(in, n, to);
      else
        optimizers_[s]->save_moments(in, n, group == StateGroup::adam_m ? to : nullptr,
                                     group == StateGroup::adam_v ? to : nullptr);
    });
  }
  // The split of a rebuilt master gives back the weight and remainder it came from for all
  // 2³² bit patterns (optim/precision_master.h), so a save and load round-trips bit for bit.
  // Each segment's CudaAdamW reads its part of the slice (its offsets shifted by the segment's).
  void load_state(const SliceFill& master, const SliceFill& m, const SliceFill& v) override {
    for (size_t s = 0; s < optimizers_.size(); ++s) {
      const int64_t at = slice_offset(s);
      const auto shifted = [at](const SliceFill& fill) -> CudaRangeRead {
        if (!fill) return {};
        return [at, &fill](int64_t begin, int64_t count, float* dst) { fill(at + begin, count, dst); };
      };
      if (!m && !v)
        optimizers_[s]->load_masters(shifted(master));
      else
        optimizers_[s]->load_pieces(shifted(master), shifted(m), shifted(v));
    }
  }

  DType export_dtype() const override { return DType::bf16; }
  // The process's GPU memory (every rank of a process sharing one GPU counts the others' too).
  int64_t peak_bytes() const override { return device_arenas_peak_reserved_bytes(); }

 private:
  // The pass scale_grads deferred, for a reader or writer that needs the grads as they are.
  // x · 1 is x for every value, so no factor needs no pass.
  void apply_pending_scale() {
    if (pending_scale_ != 1.0f)
      for (size_t s = 0; s < shape_.segments.size(); ++s)
        cuda::scale_inplace(segment_grads_[s], shape_.segments[s].count, pending_scale_, ops_.stream());
    pending_scale_ = 1.0f;
  }
  // The slice offset of segment s's first element.
  int64_t slice_offset(size_t s) const {
    int64_t at = 0;
    for (size_t i = 0; i < s; ++i) at += shape_.segments[i].count;
    return at;
  }

  ParamStoreShape shape_;
  CommTimeout timeout_;
  CudaOps ops_;
  DeviceArena weights_{"weights"}, grads_arena_{"main grads"};
  DeviceArena weight_cache_;
  uint16_t* param_bits_ = nullptr;
  uint16_t* frozen_bits_ = nullptr;  // LoRA's frozen base
  float* grads_ = nullptr;
  std::vector<float*> segment_grads_;  // per segment: into grads_ or the grad slice's buffer
  // The slice's grads are its segments' grads · pending_scale_, each product rounded to fp32.
  float pending_scale_ = 1.0f;
  cuda::SideStream zeroing_stream_;
  bool zeroing_ = false;  // zero_grads' fill is not joined yet
  int64_t steps_begun_ = 0;
  // One a segment, after the arenas: they hold pointers into them.
  std::vector<std::unique_ptr<CudaAdamW>> optimizers_;
  DeviceSlotArenas arenas_;
  // The TP group's Comm queued on ops_'s stream (NcclComm), whose synchronize is the host's
  // bounded wait; null where the TP Comm cannot be stream-ordered. Set by tp_collectives, and
  // owned by them: they go after the destructor's last wait.
  Comm* stream_comm_ = nullptr;
  std::unique_ptr<TpCollectives> tp_collectives_;
  std::unique_ptr<EpCollectives> ep_collectives_;
};

}  // namespace

std::unique_ptr<ParamStore> cuda_param_store_create(const ParamStoreShape& shape,
                                                    const EngineOptions& options) {
  return std::make_unique<CudaParamStore>(shape, options);
}

int cuda_visible_devices() {
  return cuda_device_count();
}

void cuda_select_device(int local_rank) {
  const int count = cuda_device_count();
  if (count == 0) throw_runtime_failure("cuda_select_device", "no CUDA device is visible");
  cuda::set_device(local_rank % count);
}

bool cuda_engine_available(std::string* why) {
  if (cuda_device_count() > 0) return true;
  if (why) *why = "no CUDA device is visible";
  return false;
}

}  // namespace loom
