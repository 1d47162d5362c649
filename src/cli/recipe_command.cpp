// `loom recipe validate FILE` and `loom recipe render FILE --format md|html [--out F] [--run DIR]`.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "cli/commands.h"
#include "core/error.h"
#include "io/file_output.h"
#include "recipe/recipe.h"
#include "recipe/render.h"
#include "train/metrics.h"

namespace loom {
namespace {

struct RecipeArgs {
  std::string file;
  std::string format = "md";
  std::string out;
  std::string run;
};

// Prints every violation, one per line, on stderr; the exit code of bad input.
int report(const std::vector<Violation>& violations) {
  for (const Violation& v : violations) std::fprintf(stderr, "%s\n", v.to_string().c_str());
  return static_cast<int>(ExitCode::bad_input);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input_error(path, "cannot open");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A run folder's metrics.jsonl (or that file itself) as chart series.
RunSeries run_series(const std::string& run) {
  namespace fs = std::filesystem;
  const std::string metrics = fs::is_directory(run) ? (fs::path(run) / "metrics.jsonl").string() : run;
  if (!fs::exists(metrics))
    throw_input_error("--run " + run, "found no metrics.jsonl, expected a run folder of loom train");
  RunSeries series;
  series.source = fs::is_directory(run) ? run : fs::path(run).parent_path().string();
  for (const StepMetrics& m : metrics_read_jsonl(metrics)) {
    series.steps.push_back(m.step);
    series.loss.push_back(m.loss);
    series.step_time_s.push_back(m.step_time_s);
  }
  for (const EvalMetrics& m : eval_metrics_read_jsonl(metrics)) {
    series.eval_steps.push_back(m.step);
    series.eval_loss.push_back(m.eval_loss);
  }
  return series;
}

int render(const RecipeArgs& args) {
  std::vector<Violation> violations = recipe_validate(args.file);
  if (!violations.empty()) return report(violations);
  const std::string text = read_text(args.file);
  const YAML::Node document = YAML::Load(text);
  std::optional<RunSeries> series;
  if (!args.run.empty()) series = run_series(args.run);
  const std::string page =
      recipe_render(document, text, args.format == "html" ? RenderFormat::html : RenderFormat::markdown,
                    series ? &*series : nullptr);
  if (args.out.empty())
    std::fwrite(page.data(), 1, page.size(), stdout);
  else
    file_write_atomic(args.out, page);
  return 0;
}

}  // namespace

void recipe_command_register(CLI::App& root, std::vector<Command>& commands) {
  auto args = std::make_shared<RecipeArgs>();
  CLI::App* recipe = root.add_subcommand("recipe", "Validate a recipe file or render its page");
  recipe->require_subcommand(1);

  CLI::App* validate = recipe->add_subcommand(
      "validate",
      "Check a recipe against schema/recipe.schema.yaml and the recipe's rules (src/recipe/rules.h); every "
      "violation is printed, one per line (exit 0 valid, 2 not)");
  validate->add_option("file", args->file, "recipe YAML file")->required();
  commands.push_back({validate, [args] {
                        std::vector<Violation> violations = recipe_validate(args->file);
                        if (!violations.empty()) return report(violations);
                        std::printf("%s: valid\n", args->file.c_str());
                        return 0;
                      }});

  CLI::App* page =
      recipe->add_subcommand("render", "Render a recipe's page (Markdown, or HTML with SVG charts)");
  page->add_option("file", args->file, "recipe YAML file (a run's result.yaml works)")->required();
  page->add_option("--format", args->format, "md or html")
      ->check(CLI::IsMember({"md", "html"}))
      ->capture_default_str();
  page->add_option("--out", args->out, "write the page here (atomically) instead of stdout");
  page->add_option("--run", args->run, "a run folder (its metrics.jsonl): adds charts of loss and step time");
  commands.push_back({page, [args] { return render(*args); }});
}

}  // namespace loom
