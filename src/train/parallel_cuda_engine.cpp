// The parallel CUDA engine: one GPU rank of a TP × PP × DP layout, the GPU counterpart of the
// parallel CPU engine (parallel_engine.cpp: the same shard, schedule and reductions) with the
// single-GPU engine's numerics (cuda_engine.cpp: bf16 weights with int16 remainders, fp32
// main grads and Adam moments, CudaAdamW with its optional CPU offload).
//
// What crosses ranks: TP collectives on bf16 activations (fp32 for the loss's statistics),
// as Megatron's; pipeline transfers of bf16 activations and their gradients; fp32 all-reduces
// of the partial grads of replicated tensors; the fp32 reduce-scatter of the grads over DP
// (Megatron's distributed optimizer) and the all-gather of the updated bf16 weights. Each
// goes through the device groups' Comm (NcclComm, or HostStagedComm for ranks sharing one
// GPU). Over NCCL the TP collectives are queued on the engine's stream in stream order
// (Comm::on_stream): the GPU runs a stage's forward or backward and its TP collectives back
// to back, and the host waits only where it must (the end of a stage's forward or backward
// before the pipeline transfer, a reduction read back), through the TP Comm's bounded wait,
// so a peer that never joins still ends the run within the timeout. In the backward, the
// column-parallel linears' re-gather and input-gradient reduction run on a communication
// stream beside the GEMMs they do not feed (overlapped_tp_collectives.h). The pipeline transfers
// and the grad and weight collectives wait for the stream first and run synchronously.
// Scalars, the gathers of full tensors and the streamed reads of checkpoints and final/ go
// through the host groups.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "model/qwen3.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/device_arena.h"
#include "ops/cuda/kernels.h"
#include "optim/cuda_adamw.h"
#include "parallel/comm_tp_collectives.h"
#include "parallel/overlapped_tp_collectives.h"
#include "train/device_micro_batch.h"
#include "train/engine.h"
#include "train/rank_shard.h"
#include "train/stage_pipeline.h"

namespace loom {
namespace {

// The micro-batches of a step in slots of device memory: micro-batch mb's forward tensors in
// slot mb mod slots, every backward's in one arena of its own. 1F1B keeps at most min(pp − stage, M)
// micro-batches in flight on a stage (the warm-up forwards and one more), and the one a slot held before has
// finished its backward when the slot is reused; the input gradient that backward sends on is copied out
// first (sendable), since the next micro-batch's input may arrive into the same slot in the same exchange. A
// slot's arena keeps its blocks from step to step.
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
  // One arena for every backward: a slot then holds its micro-batch's forward activations
  // only, and the gradient buffers exist once, not once per micro-batch in flight (as the
  // plan counts them).
  TensorAllocator& backward_scratch(int) override {
    backward_.release_all();
    return backward_;
  }
  const void* sendable(int, Tensor d_input) override {
    LOOM_CUDA_CHECK(
        cudaMemcpyAsync(send_buffer_, d_input.data, d_input.nbytes(), cudaMemcpyDeviceToDevice, stream_));
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

class ParallelCudaEngine final : public TrainEngine {
 public:
  ParallelCudaEngine(const Qwen3Config& config, const ParamTable& table, ParamSource& params,
                     const EngineOptions& options, Groups& host, Groups& device)
      : config_(config),
        timeout_(options.comm_timeout),
        host_(host),
        device_(device),
        sharded_(config, table, options, host, device),
        tp_collectives_(make_tp_collectives(*device.tp)),
        model_(config, sharded_.shard().table, ops_, options.recompute, sharded_.shard().model,
               tp_collectives_.get()) {
    ops_.set_attention_backward_by_row(options.attention_backward_by_row);
    if (stream_comm_) ops_.set_stream_wait([this] { wait(); });
    const RankShard& shard = sharded_.shard();
    const int64_t padded = sharded_.padded(), slice = sharded_.slice(), lo = sharded_.slice_begin();
    param_bits_ = static_cast<uint16_t*>(weights_.allocate_bytes(padded * 2, "bf16 weights"));
    grads_ = static_cast<float*>(grads_arena_.allocate_bytes(padded * 4, "fp32 main grads"));
    // With one DP rank the slice is the whole buffer: no reduce-scatter, no second copy.
    grad_slice_ = host.layout.dp == 1
                      ? grads_
                      : static_cast<float*>(grads_arena_.allocate_bytes(slice * 4, "fp32 grad slice"));
    // The padding past the shard's tensors is never written by the model: zero it once.
    LOOM_CUDA_CHECK(cudaMemsetAsync(param_bits_, 0, static_cast<size_t>(padded) * 2, ops_.stream()));
    CudaAdamWOptions adam;
    adam.offload_fraction = options.offload.fraction;
    adam.overlap = options.offload.overlap;
    optimizer_ = std::make_unique<CudaAdamW>(sharded_.slice_ranges(), slice, param_bits_ + lo, grad_slice_,
                                             ops_.stream(), adam);
    optimizer_->load_masters([&](int64_t begin, int64_t count, float* dst) {
      std::fill(dst, dst + count, 0.0f);
      shard_read(shard, table, params, lo + begin, count, dst);
    });
    gather_weights();
    tensors_ = {param_views(shard.table, param_bits_, DType::bf16, Device::cuda),
                param_views(shard.table, grads_, DType::f32, Device::cuda)};
    const int stage_slots = host.layout.pp - host.coords.pp;
    arenas_ = std::make_unique<DeviceSlotArenas>(stage_slots, ops_.stream());
  }

  // A run ended by an error may leave TP collectives queued on the stream, which CudaOps'
  // destructor would wait for without a bound: the bounded wait gives up on them instead
  // (aborting the TP communicator ends its kernels). The error that ended the run is the one
  // to report, so this one is dropped.
  ~ParallelCudaEngine() override {
    if (!stream_comm_) return;
    try {
      stream_comm_->synchronize(timeout_);
    } catch (const std::exception&) {
    }
  }

  void zero_grads() override {
    if (++steps_begun_ == 2) ops_.profile_discard();
    LOOM_CUDA_CHECK(cudaMemsetAsync(grads_, 0, static_cast<size_t>(sharded_.padded()) * 4, ops_.stream()));
  }

  double micro_batch(const MicroBatchData&) override {
    LOOM_ASSERT(false, "the parallel engine runs a step's micro-batches together (micro_batches)");
    return 0;
  }

  double micro_batches(const std::vector<MicroBatchData>& batches) override {
    StagePipelineRun run;
    run.model = &model_;
    run.tensors = &tensors_;
    int64_t most = 0;
    for (const MicroBatchData& d : batches) {
      run.tokens.push_back(static_cast<int64_t>(d.ids.size()));
      most = std::max(most, model_.stream_tokens(run.tokens.back()));
    }
    run.batch = [&](int mb, TensorAllocator& arena) {
      return micro_batch_to_device(batches[static_cast<size_t>(mb)], arena, ops_.stream());
    };
    const bool sends_back = !host_.is_first_stage();
    arenas_->begin_step(sends_back ? most * config_.hidden_size * 2 : 0);
    run.arenas = arenas_.get();
    run.activation_dtype = DType::bf16;
    run.hidden = config_.hidden_size;
    // The pipeline transfers stay synchronous, after a wait for the stream: the send copy and
    // the arena slots they read and write are reused as soon as the host moves on, which is
    // right only once a transfer has run; they are one exchange a micro-batch against a
    // layer's ten TP collectives.
    run.before_send = [this] { wait(); };
    const double nll = stage_pipeline_run(run, *device_.pp, timeout_);
    reduce_grads();
    // Σ nll of the step: the last stages hold it, the same on each TP rank.
    double total = host_.is_last_stage() && host_.coords.tp == 0 ? nll : 0.0;
    host_.world->all_reduce_sum(&total, 1, DType::f64, timeout_);
    return total;
  }

  void scale_grads(float scale) override {
    cuda::scale_inplace(grad_slice_, sharded_.slice(), scale, ops_.stream());
  }

  double grad_sum_squares() override {
    return sharded_.counted_sum(
        [&](int64_t offset, int64_t count) { return ops_.sum_squares(grad_slice_ + offset, count); });
  }

  void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) override {
    optimizer_->step(adam, lr, step);
    gather_weights();
  }

  std::vector<float> master_params() override {
    std::vector<float> slice(static_cast<size_t>(sharded_.slice()));
    optimizer_->save(slice.data(), nullptr, nullptr);
    return sharded_.gather_full(sharded_.gather_slices(slice.data()));
  }
  DType export_dtype() const override { return DType::bf16; }

  void state_to_host(TrainState& out) override {
    const size_t n = static_cast<size_t>(sharded_.slice());
    std::vector<float> master(n), m(n), v(n);
    optimizer_->save(master.data(), m.data(), v.data());
    out.master = sharded_.gather_full(sharded_.gather_slices(master.data()));
    out.adam_m = sharded_.gather_full(sharded_.gather_slices(m.data()));
    out.adam_v = sharded_.gather_full(sharded_.gather_slices(v.data()));
  }

  // Checkpoints and final/ stream from every rank's slice to world rank 0 (rank_shard.h
  // ShardedModel::state_source), each rank's part read from its CudaAdamW a range at a time:
  // no rank holds the full state, nor its own slice's copy on the host.
  std::unique_ptr<StateSource> state_source() override { return sharded_.state_source(slice_read()); }
  std::unique_ptr<ParamSource> master_source() override { return sharded_.master_source(slice_read()); }
  void state_serve() override { sharded_.state_serve(slice_read()); }
  bool state_gathers() const override { return true; }

  // Bit for bit what state_to_host gave (CudaAdamW's split round-trips).
  void state_from_host(const TrainState& in) override {
    TrainStateView view(in);
    state_load(view);
  }

  // A resume reads this rank's slice of each group from the checkpoint, never the full
  // tensors (12 B a parameter on every rank); the rest of the weights come from the DP ranks.
  void state_load(StateSource& in) override {
    LOOM_ASSERT(in.numel() == sharded_.full().total_numel, "state of another model");
    const size_t n = static_cast<size_t>(sharded_.slice());
    std::vector<float> master(n), m(n), v(n);
    sharded_.read_state(in, StateGroup::master, sharded_.slice_begin(), sharded_.slice(), master.data());
    sharded_.read_state(in, StateGroup::adam_m, sharded_.slice_begin(), sharded_.slice(), m.data());
    sharded_.read_state(in, StateGroup::adam_v, sharded_.slice_begin(), sharded_.slice(), v.data());
    optimizer_->load(master.data(), m.data(), v.data());
    gather_weights();
  }

  // Each rank counts its own slice on its GPU (after the reduce-scatter: the step's sums),
  // then the counts are summed over the host world; the grads are not copied anywhere.
  std::vector<int64_t> nonfinite_grad_counts() override {
    std::vector<cuda::CountRange> ranges;
    for (const TensorRange& r : sharded_.counted_tensor_ranges())
      ranges.push_back({r.offset, r.numel, r.param});
    std::vector<int64_t> counts =
        ops_.count_nonfinite(grad_slice_, ranges, static_cast<int>(sharded_.full().params.size()));
    sharded_.sum_over_world(counts);
    return counts;
  }

  std::vector<float> grads_to_host() override {
    std::vector<float> slice(static_cast<size_t>(sharded_.slice()));
    wait();
    LOOM_CUDA_CHECK(cudaMemcpy(slice.data(), grad_slice_, slice.size() * 4, cudaMemcpyDeviceToHost));
    return sharded_.gather_full(sharded_.gather_slices(slice.data()));
  }

  // The process's GPU memory (every rank of a process sharing one GPU counts the others' too).
  int64_t peak_bytes() const override { return device_arenas_peak_reserved_bytes(); }

 private:
  // The host waits for the engine's stream. With TP collectives queued on it, through the TP
  // Comm's bounded wait: a peer that never joins one makes it throw (exit 3) naming the
  // collective, instead of hanging.
  void wait() {
    if (stream_comm_)
      stream_comm_->synchronize(timeout_);
    else
      LOOM_CUDA_CHECK(cudaStreamSynchronize(ops_.stream()));
  }

  // The model's TP hook: over NCCL the collectives queued on the stream, the backward's
  // started ones on a communication stream beside it (OverlappedTpCollectives); over
  // HostStagedComm each one after a wait for the stream.
  std::unique_ptr<TpCollectives> make_tp_collectives(Comm& tp) {
    std::unique_ptr<OverlappedTpCollectives> overlapped =
        overlapped_tp_collectives_create(tp, ops_.stream(), timeout_);
    if (!overlapped) return std::make_unique<CommTpCollectives>(tp, timeout_, [this] { wait(); });
    stream_comm_ = &overlapped->on_compute();
    return overlapped;
  }

  // Ranges of this DP rank's slice of the state, from its optimizer: the masters rebuilt from
  // the weights and remainders (bit for bit save()'s), the moments from the GPU or the pinned
  // offloaded share.
  SliceRead slice_read() {
    return [this](StateGroup group, int64_t offset, int64_t count, float* dst) {
      if (group == StateGroup::master)
        optimizer_->save_masters(offset, count, dst);
      else
        optimizer_->save_moments(offset, count, group == StateGroup::adam_m ? dst : nullptr,
                                 group == StateGroup::adam_v ? dst : nullptr);
    };
  }

  // The partial sums of replicated tensors, then the DP reduce-scatter into this rank's slice.
  // These stay synchronous (after a wait, on the device groups' own Comms): once a step, a
  // small part of its communication, and followed at once by the grad norm's read-back.
  void reduce_grads() {
    wait();
    for (const PartialGrad& p : sharded_.shard().partials)
      sharded_.partial_comm(p.group).all_reduce_sum(grads_ + p.offset, static_cast<size_t>(p.numel),
                                                    DType::f32, timeout_);
    if (host_.layout.dp > 1)
      device_.dp->reduce_scatter_sum(grads_, grad_slice_, static_cast<size_t>(sharded_.slice()), DType::f32,
                                     timeout_);
  }

  // Every DP rank's slice of the bf16 weights into the whole shard, in place.
  void gather_weights() {
    wait();
    if (host_.layout.dp == 1) return;
    device_.dp->all_gather(param_bits_ + sharded_.slice_begin(), param_bits_,
                           static_cast<size_t>(sharded_.slice()), DType::bf16, timeout_);
  }

  Qwen3Config config_;
  CommTimeout timeout_;
  Groups& host_;
  Groups& device_;
  ShardedModel sharded_;
  CudaOps ops_;
  DeviceArena weights_{"weights"}, grads_arena_{"main grads"};
  uint16_t* param_bits_ = nullptr;
  float* grads_ = nullptr;
  float* grad_slice_ = nullptr;
  int64_t steps_begun_ = 0;
  std::unique_ptr<CudaAdamW> optimizer_;  // after the arenas: it holds pointers into them
  // The TP group's Comm queued on ops_'s stream (NcclComm), whose synchronize is the host's
  // bounded wait; null where the device Comm cannot be stream-ordered (HostStagedComm).
  // Set by make_tp_collectives.
  Comm* stream_comm_ = nullptr;
  std::unique_ptr<TpCollectives> tp_collectives_;
  Qwen3Model model_;
  ModelTensors tensors_;
  std::unique_ptr<DeviceSlotArenas> arenas_;
};

}  // namespace

std::unique_ptr<TrainEngine> parallel_cuda_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                         ParamSource& params, const EngineOptions& options,
                                                         Groups& host, Groups& device) {
  return std::make_unique<ParallelCudaEngine>(config, table, params, options, host, device);
}

}  // namespace loom
