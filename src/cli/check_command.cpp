// `loom check convergence | optimizer | config`: the correctness checks (docs/checks.md).
// Each prints a table (or --json) on stdout and exits 0 on pass, 1 on fail.
#include <cstdio>
#include <memory>
#include <string>

#include "check/config_check.h"
#include "check/convergence.h"
#include "check/optimizer_check.h"
#include "cli/commands.h"
#include "recipe/recipe.h"

namespace loom {
namespace {

struct ConvergenceArgs {
  std::string candidate, reference;
  bool json = false;
  ConvergenceThresholds thresholds;
};

struct OptimizerArgs {
  std::string device = "cuda";
  bool offload = false;
  bool json = false;
  std::string recipe;
  OptimizerCheckOptions options;
};

struct ConfigArgs {
  std::string candidate, reference;
  bool json = false;
};

int exit_code(bool passed) {
  return passed ? 0 : 1;
}

void print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
}

void register_convergence(CLI::App& check, std::vector<Command>& commands) {
  auto args = std::make_shared<ConvergenceArgs>();
  ConvergenceThresholds& t = args->thresholds;
  CLI::App* app = check.add_subcommand(
      "convergence",
      "Compare a candidate run's loss curve with a reference run's (Megatron-Bridge validate_convergence)");
  app->add_option("--candidate", args->candidate, "candidate metrics.jsonl, or its run folder")->required();
  app->add_option("--reference", args->reference, "reference metrics.jsonl, or its run folder")->required();
  app->add_flag("--json", args->json, "print the report as JSON");
  app->add_option("--skip-first-percent", t.skip_first_percent,
                  "drop the first P percent of the points, P in [0, 100) (Bridge's fraction 0.20 is 20 here)")
      ->capture_default_str();
  app->add_option("--min-correlation", t.min_correlation, "Pearson correlation at least")
      ->capture_default_str();
  app->add_option("--high-loss-tolerance", t.high_loss_tolerance,
                  "point-wise tolerance where the reference > 2.0")
      ->capture_default_str();
  app->add_option("--medium-loss-tolerance", t.medium_loss_tolerance,
                  "point-wise tolerance where 0.5 < the reference <= 2.0")
      ->capture_default_str();
  app->add_option("--low-loss-tolerance", t.low_loss_tolerance,
                  "point-wise tolerance where the reference <= 0.5")
      ->capture_default_str();
  app->add_option("--final-loss-tolerance", t.final_loss_tolerance,
                  "relative difference of the last loss at most")
      ->capture_default_str();
  app->add_option("--max-outlier-ratio", t.max_outlier_ratio,
                  "share of points that may fail point-wise, and share that may be outliers")
      ->capture_default_str();
  app->add_option("--outlier-sigma", t.outlier_sigma,
                  "outlier: residual beyond this many standard deviations")
      ->capture_default_str();
  commands.push_back(
      {app, [args] {
         const ConvergenceReport report = convergence_check(
             loss_curve_read(args->candidate), loss_curve_read(args->reference), args->thresholds);
         print(args->json ? convergence_report_json(report, args->candidate, args->reference).dump(2) + "\n"
                          : convergence_report_text(report, args->candidate, args->reference));
         return exit_code(report.passed);
       }});
}

void register_optimizer(CLI::App& check, std::vector<Command>& commands) {
  auto args = std::make_shared<OptimizerArgs>();
  CLI::App* app = check.add_subcommand(
      "optimizer", "Test the precision-aware AdamW against an fp64 reference on one large layer's tensors");
  app->add_option("--device", args->device, "where the arms under test run")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app->add_flag("--offload", args->offload,
                "test the CPU optimizer offload (fraction 1.0, overlapped copies)");
  app->add_option(
         "--size", args->options.size,
         "large: one rank's shard of a 4096-hidden, 512-expert MoE layer (807M parameters, 24 GiB of host "
         "memory on the CPU; refused where less is available); small: for CI")
      ->check(CLI::IsMember({"small", "large"}))
      ->capture_default_str();
  app->add_option("--recipe", args->recipe,
                  "take lr, betas, eps and weight decay from this recipe's train.optimizer");
  app->add_option("--seed", args->options.seed, "seed of the masters and grads")
      ->capture_default_str()
      ->check(seed_validator());
  app->add_flag("--json", args->json, "print the report as JSON");
  commands.push_back(
      {app, [args] {
         OptimizerCheckOptions options = args->options;
         if (!args->recipe.empty()) {
           const OptimizerSpec spec = recipe_load(args->recipe, {}, RecipeUse::inspect).train.optimizer;
           options.lr = spec.lr;
           options.beta1 = spec.beta1;
           options.beta2 = spec.beta2;
           options.eps = spec.eps;
           options.weight_decay = spec.weight_decay;
         }
         const OptimizerArmSet arms = optimizer_arms_for(args->device, args->offload);
         const OptimizerCheckReport report = optimizer_check_run(options, arms);
         print(args->json ? optimizer_report_json(report).dump(2) + "\n" : optimizer_report_text(report));
         return exit_code(report.passed);
       }});
}

void register_config(CLI::App& check, std::vector<Command>& commands) {
  auto args = std::make_shared<ConfigArgs>();
  CLI::App* app = check.add_subcommand(
      "config", "Check that two recipes agree on every argument class that changes numerics");
  app->add_option("candidate", args->candidate, "candidate recipe YAML")->required();
  app->add_option("reference", args->reference, "reference recipe YAML")->required();
  app->add_flag("--json", args->json, "print the report as JSON");
  commands.push_back({app, [args] {
                        const ConfigCheckReport report = config_check_files(args->candidate, args->reference);
                        print(args->json ? config_report_json(report).dump(2) + "\n"
                                         : config_report_text(report));
                        return exit_code(report.passed);
                      }});
}

}  // namespace

void check_command_register(CLI::App& root, std::vector<Command>& commands) {
  CLI::App* check = root.add_subcommand("check", "Correctness checks: convergence, optimizer, config");
  check->require_subcommand(1);
  register_convergence(*check, commands);
  register_optimizer(*check, commands);
  register_config(*check, commands);
}

}  // namespace loom
