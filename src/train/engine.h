// TrainEngine: where the weights, main grads and optimizer state of a run live and how a
// step's pieces run on them. The step loop (trainer.cpp) is written once against it:
//   zero_grads → micro_batches (forward + backward of this rank's micro-batches, Σ nll) →
//   scale_grads(1/Σ n_r) → grad_sum_squares → scale_grads(clip) → optimizer_step.
//
//   CpuEngine   fp32 weights, grads and Adam state in host memory (the reference).
//   parallel    one rank of a TP/PP/DP layout, fp32 on the CPU (parallel_engine.cpp).
//   CudaEngine  bf16 weights + int16 remainders (the precision-aware master), fp32 main
//               grads and Adam state on the GPU (built when the CUDA backend is); with
//               offload, a share of the remainders and Adam state in host memory, stepped
//               on the CPU (optim/cuda_adamw.h), the same bits.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/param_source.h"
#include "model/config.h"
#include "model/param_table.h"
#include "model/recompute.h"
#include "optim/adamw.h"
#include "parallel/groups.h"
#include "train/rows.h"

namespace loom {

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;
  virtual void zero_grads() = 0;
  // Forward and backward of one micro-batch; main grads += ∂(Σ nll)/∂w. Returns Σ nll.
  virtual double micro_batch(const MicroBatchData& batch) = 0;
  // All of this rank's micro-batches of a step, in order; returns Σ nll. A parallel engine
  // runs them through its pipeline, then reduces the grads over its groups, and returns the
  // Σ nll of the whole step (every rank's micro-batches): the main grads a step's
  // scale_grads / grad_sum_squares / optimizer_step work on are only complete after it.
  virtual double micro_batches(const std::vector<MicroBatchData>& batches) {
    double nll = 0;
    for (const MicroBatchData& b : batches) nll += micro_batch(b);
    return nll;
  }
  virtual void scale_grads(float scale) = 0;
  virtual double grad_sum_squares() = 0;
  virtual void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) = 0;
  // The fp32 masters, laid out by the table (for final/ and checkpoints).
  virtual std::vector<float> master_params() = 0;
  // The same as a source of flat ranges, for final/ written tensor by tensor; valid while the
  // engine lives and not stepped. This default holds master_params()'s full copy; the CUDA
  // engine reads each range from the GPU and the pinned offloaded state instead, so the host
  // never holds all the masters at once; a parallel engine's, on world rank 0 only, asks each
  // range of the ranks holding it while the others run state_serve (below).
  virtual std::unique_ptr<ParamSource> master_source() {
    return std::make_unique<OwnedParamSource>(master_params());
  }
  // The dtype final/ stores: what the run trains in.
  virtual DType export_dtype() const = 0;
  // The state a resume needs, in the checkpoint's layout-independent form (io/checkpoint.h):
  // full fp32 tensors laid out by the table, the masters (a bf16 engine rebuilds them bit
  // for bit from weights + remainders) and the Adam moments. A parallel engine gathers its
  // shards into these full tensors on save and takes its slices of them on load, so a
  // checkpoint resumes on any layout. Restoring what state_to_host gave is bit for bit.
  virtual void state_to_host(TrainState& out) = 0;
  virtual void state_from_host(const TrainState& in) = 0;
  // The same state a flat range at a time, for a checkpoint written or read tensor by tensor
  // when a host copy of it (12 B a parameter: 98 GB at 8B) does not fit beside the run;
  // neither holds a host copy of the whole state on any rank. state_source is valid while
  // the engine lives and is not stepped; state_load reads every range of `in` once
  // (in.numel() is the table's total_numel). Both give the bits of state_to_host /
  // state_from_host. A parallel engine's state_source is world rank 0's, each range asked of
  // the ranks that hold it (train/rank_shard.h ShardedModel::state_source), and its
  // state_load reads only the rank's own slices of `in` (every rank calls it with the same
  // state).
  virtual std::unique_ptr<StateSource> state_source() = 0;
  virtual void state_load(StateSource& in) = 0;
  // A parallel engine's world ranks other than 0, while world rank 0 reads a state_source or
  // master_source of it: answers rank 0's reads with this rank's part of each and returns
  // when rank 0 destroys that source (one call per source). The single-rank engines have no
  // other rank to serve: nothing.
  virtual void state_serve() {}
  // Whether state_to_host gathers every rank's shard into full tensors on world rank 0 (a
  // parallel engine): its checkpoints always stream (train/resume.h checkpoint_save).
  virtual bool state_gathers() const { return false; }
  // Per entry of the table, how many values of its fp32 main grad (as scaled so far) are NaN
  // or ±inf: the failure path of a non-finite loss or grad norm (train/nonfinite.h), which
  // names the tensors; never run on a normal step. Counted where the grads live, with no copy
  // of them: a GPU engine on the GPU; a parallel engine's ranks each count their DP slice of
  // their shard, each element of the model on one rank, and sum the counts over the world
  // (collective: every rank calls it, and every rank gets the whole table's counts).
  virtual std::vector<int64_t> nonfinite_grad_counts() = 0;
  // The fp32 main grads laid out by the table (tests compare engines by them).
  virtual std::vector<float> grads_to_host() = 0;
  // Peak bytes of weights, grads, optimizer state and activations so far.
  virtual int64_t peak_bytes() const = 0;
};

// layout.offload: the share of the parameters whose optimizer state a GPU engine keeps and
// steps on the CPU. The CPU engine's state is in host memory already: it ignores this.
struct OffloadOptions {
  double fraction = 0.0;  // layout.offload.optimizer_fraction; 0 without layout.offload
  bool overlap = true;    // layout.offload.overlap: copies overlapped with the optimizer's compute
};

// How an engine runs the model beyond its weights, from the recipe's layout.
struct EngineOptions {
  RecomputePolicy recompute;
  OffloadOptions offload;
  // The parallel engine's: layout.sequence_parallel, layout.layer_split (layers per PP
  // stage; empty: an even split) and the bound on each collective (train.comm_timeout_s).
  bool sequence_parallel = false;
  std::vector<int64_t> layer_split;
  CommTimeout comm_timeout{std::chrono::minutes(5)};
  // The CUDA engine's: TrainOptions::attention_backward_by_row.
  bool attention_backward_by_row = false;
};

// `params` are the fp32 initial weights laid out by `table`.
std::unique_ptr<TrainEngine> cpu_engine_create(const Qwen3Config& config, const ParamTable& table,
                                               std::vector<float> params, const EngineOptions& options = {});
// The fp32 CPU engine of one rank of a parallel layout (tp with or without sequence
// parallel, pp with the 1F1B schedule, dp with the distributed optimizer; cp = 1), every
// rank of groups.world calling it together. `params` are the whole model's initial weights
// laid out by `table` (the same on every rank); each rank keeps its shard of them. Its
// state_to_host, grads_to_host and master_params gather full tensors laid out by `table` on
// world rank 0 (collective: every rank calls them together; the others get empty vectors);
// state_source and master_source, on world rank 0 while the others run state_serve, stream
// them instead (no full tensor held); state_from_host and state_load take this rank's slices
// of the full state they are given; nonfinite_grad_counts counts each rank's slice of the
// grads and sums the counts over the world (collective; every rank gets them).
// `groups` must outlive the engine. docs/parallel.md.
std::unique_ptr<TrainEngine> parallel_cpu_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                        const std::vector<float>& params,
                                                        const EngineOptions& options, Groups& groups);

// nullptr when this build has no CUDA backend. The initial weights are read from `params`
// piece by piece (CudaAdamW::load_masters): the host never holds all of them in fp32.
std::unique_ptr<TrainEngine> cuda_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                ParamSource& params, const EngineOptions& options = {});
// One GPU rank of a parallel layout (tp with or without sequence parallel, pp with the 1F1B
// schedule, dp with the distributed optimizer; cp = 1): the parallel CPU engine's shard and
// schedule with the CUDA engine's numerics (bf16 weights + remainders, fp32 grads and Adam
// state, layout.offload). `host` groups carry host memory (scalars, the gathers and streamed
// reads of full tensors on world rank 0, as the parallel CPU engine's), `device` groups the same layout's GPU
// tensors (NcclComm; HostStagedComm where ranks share a GPU). The initial weights are read from `params` a
// row piece at a time. nullptr when this build has no CUDA backend. Both groups must outlive the engine.
std::unique_ptr<TrainEngine> parallel_cuda_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                         ParamSource& params, const EngineOptions& options,
                                                         Groups& host, Groups& device);
// Makes `local_rank`'s GPU (of those visible, round robin) this process's current device: a
// GPU rank's first CUDA call. No-op without the CUDA backend.
void cuda_select_device(int local_rank);
// CUDA devices visible to this process (0 without the CUDA backend).
int cuda_visible_devices();
// Whether cuda_engine_create can work here: the backend is built and a GPU is visible.
// `why` says what is missing.
bool cuda_engine_available(std::string* why);

}  // namespace loom
