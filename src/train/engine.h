// TrainEngine: where the weights, main grads and optimizer state of a run live and how a
// step's pieces run on them. One class implements it (engine.cpp) for every device and
// layout: one rank of a TP × PP × DP layout (docs/parallel.md), the single rank being the
// 1 × 1 × 1 layout of the same code. What differs by device is its parameter store
// (param_store.h: fp32 on the CPU, the reference; bf16 + int16 remainders on a GPU, with
// optional optimizer offload); what differs by layout is the shard and the data-parallel
// state (rank_shard.h DataParallelState). The step (train_step.h) is written once against it:
//   zero_grads → micro_batches (forward + backward of this rank's micro-batches, the grads
//   reduced over the layout's groups, the step's Σ nll) → scale_grads(1/Σ n_r) →
//   grad_sum_squares → scale_grads(clip) → optimizer_step.
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
#include "model/linear.h"
#include "model/lora.h"
#include "model/param_table.h"
#include "model/recompute.h"
#include "model/routing.h"
#include "optim/adamw.h"
#include "parallel/context_split.h"
#include "parallel/groups.h"
#include "train/rows.h"

namespace loom {

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;
  virtual void zero_grads() = 0;
  // All of this rank's micro-batches of a step, in order, through the pipeline; then the
  // grads reduced over the layout's groups. Returns the Σ nll of the whole step (every
  // rank's micro-batches). The main grads that scale_grads / grad_sum_squares /
  // optimizer_step work on are complete after it.
  // The engine keeps `batches` until the step's grads are reduced (a GPU store uploads from them).
  virtual double micro_batches(std::vector<MicroBatchData> batches) = 0;
  // Held-out evaluation: this rank's micro-batches forward only through the pipeline, with
  // the current weights; no grads, no activations kept past each micro-batch. Returns the
  // Σ nll of every rank's micro-batches (collective over the world; DP ranks may hold
  // different counts, even none).
  virtual double eval_micro_batches(std::vector<MicroBatchData> batches) = 0;
  virtual void scale_grads(float scale) = 0;
  // Σ g² of the model's grads, each element counted once (collective over the world).
  virtual double grad_sum_squares() = 0;
  virtual void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) = 0;
  // The fp32 masters as a source of flat ranges laid out by the table, for final/ written
  // tensor by tensor; valid while the engine lives and is not stepped. World rank 0 only:
  // each range is asked of the ranks holding it while the others run state_serve (below).
  virtual std::unique_ptr<ParamSource> master_source() = 0;
  // The dtype final/ stores: what the run trains in.
  virtual DType export_dtype() const = 0;
  // The state a resume needs, in the checkpoint's layout-independent form (io/checkpoint.h):
  // full fp32 tensors laid out by the table, the masters (a bf16 store rebuilds them bit for
  // bit from weights + remainders) and the Adam moments. On a layout of several ranks,
  // state_to_host fills `out` on world rank 0 while the others serve (collective);
  // state_from_host takes each rank's slices of the full state it is given. Restoring what
  // state_to_host gave is bit for bit, on any layout.
  virtual void state_to_host(TrainState& out) = 0;
  virtual void state_from_host(const TrainState& in) = 0;
  // The same state a flat range at a time, for a checkpoint written or read tensor by tensor
  // when a host copy of it (12 B a parameter: 98 GB at 8B) does not fit beside the run;
  // neither holds a host copy of the whole state on any rank. state_source is world rank
  // 0's, valid while the engine lives and is not stepped; state_load reads only this rank's
  // slices of `in` (every rank calls it with the same state). Both give the bits of
  // state_to_host / state_from_host.
  virtual std::unique_ptr<StateSource> state_source() = 0;
  virtual void state_load(StateSource& in) = 0;
  // World ranks other than 0, while world rank 0 reads a state_source or master_source:
  // answers rank 0's reads with this rank's part of each and returns when rank 0 destroys
  // that source (one call per source).
  virtual void state_serve() = 0;
  // Whether the state lives on several ranks: its checkpoints always stream
  // (train/resume.h checkpoint_save).
  virtual bool state_gathers() const = 0;
  // Per entry of the table, how many values of its fp32 main grad (as scaled so far) are NaN
  // or ±inf: the failure path of a non-finite loss or grad norm (train/nonfinite.h), which
  // names the tensors; never run on a normal step. Counted where the grads live, each rank
  // its DP slice of its shard (each element of the model on one rank), summed over the world
  // (collective: every rank gets the whole table's counts).
  virtual std::vector<int64_t> nonfinite_grad_counts() = 0;
  // FP8 statistics (model/linear.h Fp8Stats) of the FP8 casts between the two calls, which
  // bracket a step's micro_batches: census_end's are every rank's (collective over the
  // world), each value counted once. Only with FP8 linear layers.
  virtual void fp8_census_begin() = 0;
  virtual Fp8Stats fp8_census_end() = 0;
  // A mixture of experts' routing in the last micro_batches call (model/routing.h
  // RoutingStats) of the micro-batches that took the census: every rank's, each layer's
  // counted once (collective over the world). Empty for a dense model.
  virtual RoutingStats routing_stats() = 0;
  // Peak bytes of weights, grads, optimizer state and activations so far.
  virtual int64_t peak_bytes() const = 0;
};

// layout.offload: the share of the parameters whose optimizer state a GPU store keeps and
// steps on the CPU. The CPU store's state is in host memory already: it ignores this.
struct OffloadOptions {
  double fraction = 0.0;  // layout.offload.optimizer_fraction; 0 without layout.offload
  bool overlap = true;    // layout.offload.overlap: copies overlapped with the optimizer's compute
};

// How an engine runs the model beyond its weights, from the recipe's layout.
struct EngineOptions {
  RecomputePolicy recompute;
  OffloadOptions offload;
  // layout.activation_offload: full recompute's chunk inputs in host memory between a chunk's
  // forward and its recompute (ops/activation_offload.h; the device's twin).
  bool activation_offload = false;
  // layout.sequence_parallel, layout.layer_split (layers per PP stage; empty: an even
  // split) and the bound on each collective (train.comm_timeout_s).
  bool sequence_parallel = false;
  std::vector<int64_t> layer_split;
  CommTimeout comm_timeout{std::chrono::minutes(5)};
  // The decoder block's linear layers: bf16 (fp32 on the CPU) or FP8 (model/linear.h).
  LinearPrecision linear_precision;
  // The CUDA store's: TrainOptions::attention_backward_by_row.
  bool attention_backward_by_row = false;
  // workload.moe.aux_loss (a mixture of experts only).
  MoeAuxLoss moe_aux_loss;
  // layout.cp_comm: context parallelism's form (cp > 1 only).
  ContextComm context_comm = ContextComm::all_gather;
};

enum class EngineDevice : uint8_t { cpu, cuda };

// LoRA (model/lora.h): the engine trains the adapters over a frozen base. Its `table` is then
// lora_table_build's and `initial` the adapters' initial values, so that everything the
// engine keeps and reports (the optimizer state, the grad norm, checkpoints, master_source)
// is the adapters'; the base is read once from `weights` (laid out by `table`) into the
// device's weight dtype, each rank its shard, and gets no grads.
struct FrozenBase {
  const ParamTable* table = nullptr;
  ParamSource* weights = nullptr;  // read during engine_create only
  LoraConfig lora;
};

// The engine of one rank, every rank of the layout calling it together. `initial`: the whole
// model's initial weights laid out by `table`, read a row piece at a time (no rank holds all
// of them in fp32). `host` groups carry host memory (scalars, the streamed reads of the state
// on world rank 0); `data` groups the store's tensors (the same groups on CPU ranks; device
// Comms on GPU ranks: NcclComm, HostStagedComm where ranks share a GPU). Both null: one
// rank, whose world of one the engine makes itself; `data` null: the `host` groups. The
// groups must outlive the engine. Throws InputError when the layout does not split the model,
// RuntimeFailure when the device cannot hold it; with EngineDevice::cuda, call only where
// cuda_engine_available. `frozen`: LoRA's base (above), null for full fine-tuning.
std::unique_ptr<TrainEngine> engine_create(const ModelConfig& config, const ParamTable& table,
                                           ParamSource& initial, EngineDevice device,
                                           const EngineOptions& options = {}, Groups* host = nullptr,
                                           Groups* data = nullptr, const FrozenBase* frozen = nullptr);

}  // namespace loom
