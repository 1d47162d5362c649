// TrainEngine: where the weights, main grads and optimizer state of a run live and how a
// step's pieces run on them. The step loop (trainer.cpp) is written once against it:
//   zero_grads → micro_batch (forward + backward, Σ nll) for each micro-batch →
//   scale_grads(1/Σ n_r) → grad_sum_squares → scale_grads(clip) → optimizer_step.
//
//   CpuEngine   fp32 weights, grads and Adam state in host memory (the reference).
//   CudaEngine  bf16 weights + int16 remainders (the precision-aware master), fp32 main
//               grads and Adam state on the GPU (built when the CUDA backend is).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/param_table.h"
#include "model/recompute.h"
#include "optim/adamw.h"
#include "train/rows.h"

namespace loom {

class TrainEngine {
 public:
  virtual ~TrainEngine() = default;
  virtual void zero_grads() = 0;
  // Forward and backward of one micro-batch; main grads += ∂(Σ nll)/∂w. Returns Σ nll.
  virtual double micro_batch(const MicroBatchData& batch) = 0;
  virtual void scale_grads(float scale) = 0;
  virtual double grad_sum_squares() = 0;
  virtual void optimizer_step(const AdamWConfig& adam, float lr, int64_t step) = 0;
  // The fp32 masters, laid out by the table (for final/ and checkpoints).
  virtual std::vector<float> master_params() = 0;
  // The dtype final/ stores: what the run trains in.
  virtual DType export_dtype() const = 0;
  // The state a resume needs (weights or fp32 masters, Adam moments) written to / read
  // from one safetensors file, bit for bit. Reading checks every tensor's name and size
  // and throws InputError naming the file on a mismatch.
  virtual void state_save(const std::string& path) = 0;
  virtual void state_load(const std::string& path) = 0;
  // Peak bytes of weights, grads, optimizer state and activations so far.
  virtual int64_t peak_bytes() const = 0;
};

// How an engine runs the model beyond its weights, from the recipe's layout.
struct EngineOptions {
  RecomputePolicy recompute;
};

class SafetensorsFile;
// Copies tensor `name` of a state file into `out` (count values of dtype), checking both.
void state_read(const SafetensorsFile& file, const std::string& name, DType dtype, void* out, size_t count);

// `params` are the fp32 initial weights laid out by `table`.
std::unique_ptr<TrainEngine> cpu_engine_create(const Qwen3Config& config, const ParamTable& table,
                                               std::vector<float> params, const EngineOptions& options = {});
// nullptr when this build has no CUDA backend.
std::unique_ptr<TrainEngine> cuda_engine_create(const Qwen3Config& config, const ParamTable& table,
                                                const std::vector<float>& params,
                                                const EngineOptions& options = {});
// Whether cuda_engine_create can work here: the backend is built and a GPU is visible.
// `why` says what is missing.
bool cuda_engine_available(std::string* why);

}  // namespace loom
