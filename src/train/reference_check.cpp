#include "train/reference_check.h"

#include "check/correctness.h"
#include "check/optimizer_arm.h"
#include "check/optimizer_check.h"

namespace loom {

ReferenceCheck reference_check_run(const Recipe& recipe, const std::string& metrics_path) {
  const TrainSpec& spec = recipe.train;
  CorrectnessEvidence evidence =
      correctness_evidence(recipe, metrics_path, spec.reference_recipe, spec.reference_metrics);

  // The component test at CI size (seconds), at this recipe's optimizer hyperparameters, on
  // the arms of this run's device and offload: what this run's optimizer step computes with.
  OptimizerCheckOptions options;
  options.size = "small";
  options.lr = spec.optimizer.lr;
  options.beta1 = spec.optimizer.beta1;
  options.beta2 = spec.optimizer.beta2;
  options.eps = spec.optimizer.eps;
  options.weight_decay = spec.optimizer.weight_decay;
  // The CPU engine ignores layout.offload (its state is on the host already), so a CPU run's
  // step is the CPU arms' whatever the layout says.
  const bool offload = recipe.layout.offload.enabled && spec.device == "cuda";
  const OptimizerCheckReport report = optimizer_check_run(options, optimizer_arms_for(spec.device, offload));
  const std::string command = "loom check optimizer --device " + spec.device + (offload ? " --offload" : "") +
                              " --size small, run by loom train at the end of the run";
  evidence.component_tests.push_back(component_test_record(report, date_today_utc(), command));

  ReferenceCheck check;
  check.block = correctness_block(evidence);
  check.passed = check.block["result"].as<std::string>() != "fail";
  check.summary = check.block["summary"].as<std::string>();
  return check;
}

}  // namespace loom
