#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "plan/plan.h"
#include "recipe/recipe.h"
#include "train/rank_setup.h"
#include "train/trainer.h"

namespace loom {
namespace {

// The test hooks of trainer.h TrainFaults, read once here: each rank of --nproc N is a process
// started with the parent's environment, so every rank reads the same values.
TrainFaults train_faults_from_env() {
  TrainFaults faults;
  if (const char* kill = std::getenv("LOOM_TEST_KILL_RANK")) faults.kill_rank = std::atoi(kill);
  if (const char* hang = std::getenv("LOOM_TEST_HANG_RANK")) faults.hang_rank = std::atoi(hang);
  if (const char* delay = std::getenv("LOOM_TEST_CHECKPOINT_DELAY_MS"))
    faults.checkpoint_delay_ms = std::atoll(delay);
  return faults;
}

struct TrainArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  int64_t stop_at_step = 0;
  int nproc = 1;
  bool force = false;
};

}  // namespace

void train_command_register(CLI::App& root, std::vector<Command>& commands) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* app =
      root.add_subcommand("train", "Train a model from a recipe (docs/interface.md: train block)");
  app->add_option("recipe", args->recipe, "recipe YAML file")->required();
  app->add_option("--set", args->overrides, "override a recipe field: --set layout.tp=8 (repeatable)");
  app->add_option("--stop-at-step", args->stop_at_step, "end this invocation after step K")
      ->check(CLI::PositiveNumber);
  app->add_option("--nproc", args->nproc, "start N local ranks")->check(CLI::PositiveNumber);
  app->add_flag("--force", args->force,
                "train even when `loom plan` predicts the layout does not fit the GPU");
  commands.push_back({app, [args] {
                        Recipe recipe = recipe_load(args->recipe, args->overrides);
                        // Refuse a layout the plan says will not fit (exit 2) before any GPU work;
                        // the plan also says how the engine runs the attention backward.
                        bool attention_backward_by_row = false;
                        if (recipe.train.device == "cuda")
                          attention_backward_by_row =
                              plan_for_training(recipe, !args->force).input.attention_backward_by_row;
                        if (args->nproc > 1) {
                          // The parent checks once what every rank would refuse, then only waits.
                          world_check(recipe, args->nproc, "--nproc " + std::to_string(args->nproc));
                          train_check_supported(recipe);
                          gpu_ranks_check(recipe, args->nproc, args->nproc);
                          return train_spawn_ranks(args->nproc);
                        }
                        const CommTimeout timeout = recipe_comm_timeout(recipe);
                        TrainOptions options;
                        options.faults = train_faults_from_env();
                        RankSetup ranks =
                            rank_setup(recipe, world_from_process_env(), timeout, options.faults.kill_rank);
                        options.stop_at_step = args->stop_at_step;
                        options.attention_backward_by_row = attention_backward_by_row;
                        options.groups = &ranks.groups;
                        if (ranks.device_world_comm) options.device_groups = &ranks.device_groups;
                        TrainSummary summary;
                        try {
                          summary = train_run(recipe, options);
                          if (ranks.rendezvous) ranks.rendezvous->finish(timeout);
                        } catch (const std::exception& e) {
                          // The other ranks end at once, naming this one, instead of timing out.
                          if (ranks.rendezvous) ranks.rendezvous->report_failure(e.what());
                          throw;
                        }
                        if (ranks.writes_outputs())
                          std::fprintf(stderr, "loom: trained %lld steps, final loss %.6f; outputs in %s\n",
                                       static_cast<long long>(summary.steps_run), summary.final_loss,
                                       summary.output_dir.c_str());
                        return summary.correctness_failed ? 1 : 0;
                      }});
}

}  // namespace loom
