// `loom check optimizer`: the seed recipe's component test of the precision-aware AdamW
// (bf16 weight + int16 remainder masters, optim/precision_master.h) against an fp64 reference,
// on the tensors of one large layer.
//
// Per tensor, from fp32 masters m0 of a run under way (N(mean, std²) draws with all 32 bits
// in use, and one in 4,096 an exact tie between two bf16 values, where the split's rounding
// matters) and, at step t, the same grads for every arm (N(0, grad_std²) draws hashed from the
// seed, the tensor and t):
//   reference  the same AdamW in fp64 (hyperparameters as doubles, grads widened);
//   baseline   the device's fp32-master AdamW;
//   under test the device's precision-aware AdamW, its masters rebuilt from bf16 + remainder.
// Error of an arm after step s on a tensor: the relative L2 error of its update,
//   e_s = ‖(a_s − m0) − (r_s − m0)‖₂ / ‖r_s − m0‖₂,   a the arm's masters, r the reference's.
// Two runs per tensor, each arm starting from m0:
//   one step at one_step_lr (1e-3): the worst tensor's e_1 ≤ 1e-3, for both arms. At the
//     recipe's lr (1e-5) an update is ~10⁻³ of a norm weight near 1, about 100 fp32 ulps, so
//     rounding the master alone costs any fp32 master ~1e-3: 1e-3 tests the update's
//     arithmetic only at a larger step;
//   three steps at the recipe's lr: on every tensor, e_3 under test ≤ 2 · the baseline's e_3
//     on that tensor + 1e-3.
// In both runs the rebuilt masters must equal the baseline's bit for bit after every step.
// The negative controls (optimizer_arm.h) run the same way and must each fail their
// criterion; one that passes means the check cannot see that fault, and fails the check.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "check/optimizer_arm.h"

namespace loom {

struct OptimizerTestTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool decay = true;  // false for 1-D (norm) tensors, as Megatron groups them
  float init_mean = 0, init_std = 0.02f;
  int64_t numel() const;
};

struct OptimizerTestShape {
  std::string size;         // "small" | "large"
  std::string description;  // in words, for the report and result.yaml
  std::vector<OptimizerTestTensor> tensors;
  int64_t numel() const;
};

// large: one rank's optimizer shard of the MoE layer of the seed's test (hidden 4096, 512
//   experts, expert FFN 1024, EP 8 so 64 experts on the rank): experts' fused gate/up
//   [64, 2048, 4096], down [64, 4096, 1024], router [512, 4096], norm [4096]: 807,407,616
//   parameters. The CPU arms need 48 bytes per element of the largest tensor (24 GiB, below).
// small: the same four roles at hidden 128, 2 of 16 experts, FFN 64 (51,328 parameters), for
//   CI: seconds under a sanitizer.
// InputError for another size.
OptimizerTestShape optimizer_test_shape(const std::string& size);

struct OptimizerCheckOptions {
  std::string size = "large";
  // AdamW in double, as the recipe gives them (the seed's; train.optimizer): the fp64
  // reference uses them as they are, the fp32 arms as floats (TE receives floats).
  double lr = 1e-5, beta1 = 0.9, beta2 = 0.98, eps = 1e-8, weight_decay = 0.1;
  double one_step_lr = 1e-3;  // the one-step run's lr (see above)
  double grad_std = 1e-3;
  uint64_t seed = 1234;

  // InputError naming the option: lr and one_step_lr > 0, betas in [0, 1), eps > 0,
  // weight_decay ≥ 0, grad_std > 0.
  void validate() const;
};

struct TensorErrors {
  std::string tensor;
  double step1 = 0, step3 = 0;  // e_1 of the one-step run, e_3 of the three-step run
};

struct ArmOutcome {
  std::string name;
  std::string fault;                 // negative controls only
  std::vector<TensorErrors> errors;  // per tensor, in the shape's order
  double step1 = 0;                  // the worst tensor's e_1
  std::string step1_tensor;
  // The tensor nearest its step-3 bound (largest e_3 / bound), its e_3 and its bound.
  double step3 = 0, step3_bound = 0;
  std::string step3_tensor;
  // Elements whose fp32 master bits differ from the fp32-master arm's, summed over every step
  // of both runs (not measured for the baseline itself).
  int64_t master_mismatches = 0;
  bool step1_ok = false, step3_ok = false, bitwise_ok = false;
  bool passed = false;  // arms: every criterion holds; controls: the one they must fail fails
};

struct OptimizerCheckReport {
  OptimizerCheckOptions options;
  OptimizerTestShape shape;
  std::string device;
  double step1_bound = 1e-3;
  ArmOutcome baseline, under_test;
  std::vector<ArmOutcome> controls;
  std::vector<OptimizerCriterion> control_criteria;  // what each control must fail
  bool passed = false;
  double seconds = 0;
};

// The check's peak memory: what it holds at once while it runs the shape's largest tensor
// (n elements). Host, per element: the initial masters (4 B), the fp64 reference's masters
// (8), the baseline's masters after each of three steps (12), a step's grads and read-back
// masters (8) and the largest arm's state (16: a control's bf16 weights, int16 remainders,
// m, v and scratch masters), 48 B in all (the large shape on the CPU: 24.0 GiB; 24.3 GB
// resident measured); a GPU set adds the CPU baseline's three steps for the controls (12).
// Device, a GPU set's arm: masters or bf16 + remainders, grads, m and v (16 B).
struct OptimizerCheckMemory {
  int64_t host_bytes = 0;
  int64_t device_bytes = 0;  // 0 for the CPU set
};
OptimizerCheckMemory optimizer_check_memory(const OptimizerTestShape& shape, bool cpu_arms);

// Looks before it leaps: InputError (exit 2) naming both sizes and `--size small` when the
// check's memory exceeds host_available (MemAvailable) or the GPU set's free memory, rather
// than being killed mid-run. A figure < 0 (unknown) is not compared.
void optimizer_check_require_memory(const OptimizerTestShape& shape, const OptimizerArmSet& arms,
                                    int64_t host_available);

// Runs the check on `arms`, the controls on the CPU. Validates the options first, then
// requires the memory (host_memory_available_bytes(), core/host_memory.h).
OptimizerCheckReport optimizer_check_run(const OptimizerCheckOptions& options, const OptimizerArmSet& arms);

std::string optimizer_criterion_name(OptimizerCriterion criterion);
std::string optimizer_report_text(const OptimizerCheckReport& report);
nlohmann::ordered_json optimizer_report_json(const OptimizerCheckReport& report);

}  // namespace loom
