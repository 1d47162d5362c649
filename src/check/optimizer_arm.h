// The optimizer implementations that `loom check optimizer` compares against an fp64
// reference ("arms"), behind one small interface so that a device adds its own: a CUDA arm
// holds its state in device memory and copies grads in and masters out through these calls.
//
// An arm holds the AdamW state of one tensor of n elements (optim/adamw.h semantics). The
// check calls init once, then step for t = 1, 2, 3 with the same grads every arm gets, and
// read_master after each step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "optim/adamw.h"

namespace loom {

class OptimizerArm {
 public:
  virtual ~OptimizerArm() = default;
  // master[n]: the fp32 masters of a run under way (an arm storing bf16 + remainder splits
  // them, which is exact); m = v = 0.
  virtual void init(const float* master, int64_t n) = 0;
  // One AdamW step t ≥ 1 at lr; grad[n] in host memory; decay: weight decay applies.
  virtual void step(const AdamWConfig& cfg, float lr, int64_t t, bool decay, const float* grad) = 0;
  // The fp32 masters now, into host memory master[n] (rebuilt from bf16 + remainder by an arm
  // that stores them so).
  virtual void read_master(float* master) = 0;
};

using OptimizerArmFactory = std::function<std::unique_ptr<OptimizerArm>()>;

// The two arms a device contributes.
struct OptimizerArmSet {
  std::string device;  // in words, for the report: "CPU", "NVIDIA H200"
  bool is_cpu = true;  // the negative controls (CPU arms) compare bit for bit against this
                       // set's fp32-master arm only when it is the CPU's
  std::string precision_aware_name;
  OptimizerArmFactory precision_aware;  // under test: bf16 weight + int16 remainder masters
  std::string fp32_master_name;
  OptimizerArmFactory fp32_master;  // baseline: explicit fp32 masters, same device
  int64_t device_free_bytes = -1;   // a GPU set: the GPU's free memory when it was made
};

// adamw_step_bf16_remainder and adamw_step (src/optim), threaded.
OptimizerArmSet optimizer_arms_cpu();

// The GPU's arms (optimizer_arms_cuda.cpp, in CUDA builds). Under test: CudaAdamW
// (optim/cuda_adamw.h), the CUDA engine's optimizer, with no offload (ops/cuda/adam.cu's
// precision-aware kernel), or with `offload` at fraction 1.0 with overlapped copies (every
// element stepped on the CPU, its state in pinned host memory). Baseline: fp32-master AdamW on
// the GPU (adam.cu's fp32 kernel, the same update). The arms hold their state on the GPU and
// copy grads in and masters out. RuntimeFailure (exit 3) when no GPU is visible; a build
// without CUDA (optimizer_arms_no_cuda.cpp) raises InputError (exit 2) saying so.
OptimizerArmSet optimizer_arms_cuda(bool offload);

// The arms of `loom check optimizer --device DEVICE [--offload]`: "cpu" is the CPU set,
// "cuda" optimizer_arms_cuda(offload). --offload with "cpu" is InputError: the offload moves
// a GPU optimizer's state to the host, where the CPU's is already.
OptimizerArmSet optimizer_arms_for(const std::string& device, bool offload);

// What a negative control must fail.
enum class OptimizerCriterion { step1_bound, step3_bound, bitwise_masters };

// A fault the check must catch: a CPU arm with the fault built in.
struct NegativeControl {
  std::string name;   // "rne_split", "remainders_dropped", "wrong_beta2"
  std::string fault;  // in words
  OptimizerCriterion must_fail;
  OptimizerArmFactory make;
};

// round-to-nearest-even split, at init and after each step (TE's rebuild, so exact ties come
// back one bf16 ulp off; must fail bitwise masters), remainders dropped (masters = bf16 weights; must fail
// the step-1 bound), β2 0.999 instead of the configured one (0.98 if that is 0.999; invisible after one step,
// when the bias correction cancels β2; must fail the step-3 bound).
std::vector<NegativeControl> optimizer_negative_controls();

}  // namespace loom
