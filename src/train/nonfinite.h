// A step whose loss or grad norm is not finite (NaN or ±inf): recipe field
// train.on_nonfinite says what happens.
//   stop       (default) the run ends with a RuntimeFailure (exit 3) that names the step, the
//              rank and each parameter whose grad holds a non-finite value;
//   skip_step  the step's optimizer update is skipped (the weights and Adam moments stay as
//              they were; the step's rows are consumed and the lr schedule moves on), the
//              report goes to stderr (world rank 0's, for every rank: the loss, grad norm and
//              counts are the world's) and metrics.jsonl marks the step "skipped": true; after
//              train.max_consecutive_skips skipped steps in a row, the next non-finite step
//              stops the run as above.
// The normal path costs two isfinite checks: the per-tensor count of non-finite grads runs
// only on a failing step, where the grads live (TrainEngine::nonfinite_grad_counts: a kernel
// on a GPU; on a parallel layout each rank counts its own slice and the counts are summed
// over the world), so no rank gathers or copies the grads.
//
// A skipped step is not an update, as in torch's Adam and Megatron: the optimizer's own step
// count (its bias corrections) is the run's step minus the steps skipped so far, which a
// checkpoint records (train/resume.h) with the run of consecutive skips.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/param_table.h"
#include "train/engine.h"

namespace loom {

struct NonfiniteTensor {
  std::string name;
  int64_t count = 0;  // values that are NaN or ±inf
  int64_t numel = 0;
};

// counts[r.param] += the values of x[r.offset, r.offset + r.numel) that are NaN or ±inf, for
// each range r: a rank's count of its own grads (TrainEngine::nonfinite_grad_counts).
void nonfinite_count(const float* x, const std::vector<TensorRange>& ranges, int64_t* counts);
// The parameters with a non-zero count (counts: one per entry of the table), in table order.
std::vector<NonfiniteTensor> nonfinite_tensors(const ParamTable& table, const std::vector<int64_t>& counts);
// The parameters whose grads (laid out by the table) hold a non-finite value, in table order.
std::vector<NonfiniteTensor> nonfinite_tensors(const ParamTable& table, const float* grads);

// "step 3, rank 0: loss nan, grad norm nan (not finite); non-finite grads in 2 of 20 tensors:
// embed (64 of 16384 values), layers.0.qkv (3 of 12288 values)". At most 8 tensors are
// named, then "and N more".
std::string nonfinite_report(int64_t step, int rank, double loss, double grad_norm,
                             const std::vector<NonfiniteTensor>& tensors);

class NonfiniteGuard {
 public:
  // policy: "stop" | "skip_step" (the recipe checked it); max_consecutive ≥ 1.
  NonfiniteGuard(std::string policy, int64_t max_consecutive, int rank);

  // After the grad norm of `step`: false when loss and grad norm are finite. Otherwise
  // throws RuntimeFailure with the report (policy stop, or max_consecutive steps before were
  // skipped in a row), or prints it to stderr and returns true: skip this step's optimizer update.
  bool skip_step(int64_t step, double loss, double grad_norm, TrainEngine& engine, const ParamTable& table);

  int64_t skipped() const { return skipped_; }  // steps skipped so far in the run
  int64_t consecutive() const { return consecutive_; }
  void restore(int64_t skipped, int64_t consecutive);  // from a checkpoint

 private:
  std::string policy_;
  int64_t max_consecutive_;
  int rank_;
  int64_t skipped_ = 0, consecutive_ = 0;
};

}  // namespace loom
