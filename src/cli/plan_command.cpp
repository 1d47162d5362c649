// `loom plan RECIPE [--set k=v]... [--json] [--search [--top N] [--gpus N]]`: the per-GPU
// memory and step time of the recipe's layout (exit 0 when it fits its GPU, 1 when not),
// or the best layouts of its model (exit 0 when one fits, 1 when none does).
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "plan/plan.h"
#include "plan/search.h"
#include "recipe/recipe.h"

namespace loom {
namespace {

struct PlanArgs {
  std::string recipe;
  std::vector<std::string> overrides;
  bool json = false;
  bool search = false;
  int64_t top = 10;
  int64_t gpus = 0;
};

int plan_run(const PlanArgs& args) {
  const Recipe recipe = recipe_load(args.recipe, args.overrides, RecipeUse::inspect);
  if (args.search) {
    const SearchResult result = plan_search(recipe, args.gpus);
    const size_t top = static_cast<size_t>(args.top);
    const std::string text =
        args.json ? search_to_json(result, top).dump(2) + "\n" : search_to_text(result, top);
    std::fputs(text.c_str(), stdout);
    return result.fitting.empty() ? 1 : 0;
  }
  const Plan plan = plan_layout(plan_input_from_recipe(recipe));
  const std::string text = args.json ? plan_to_json(plan).dump(2) + "\n" : plan_to_text(plan);
  std::fputs(text.c_str(), stdout);
  return plan.fits ? 0 : 1;
}

}  // namespace

void plan_command_register(CLI::App& root, std::vector<Command>& commands) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* app = root.add_subcommand(
      "plan", "Predict a layout's per-GPU memory and step time (exit 0 fits, 1 does not fit; docs/plan.md)");
  app->add_option("recipe", args->recipe, "recipe YAML file (no checkpoint needed for a built-in model)")
      ->required();
  app->add_option("--set", args->overrides, "override a recipe field: --set layout.tp=8 (repeatable)");
  app->add_flag("--json", args->json, "print the whole breakdown as JSON");
  app->add_flag("--search", args->search,
                "rank the layouts of the recipe's model for its GPUs by predicted tokens/s");
  app->add_option("--top", args->top, "with --search: how many layouts to print")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--gpus", args->gpus, "with --search: GPUs to lay out (default: the recipe's)")
      ->check(CLI::PositiveNumber);
  commands.push_back({app, [args] { return plan_run(*args); }});
}

}  // namespace loom
