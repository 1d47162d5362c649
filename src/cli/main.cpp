// loom: one binary, one subcommand per job. Exit codes (docs/interface.md): 0 success, 1 a
// check failed, 2 bad usage or input, 3 a runtime failure.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "core/version.h"

int main(int argc, char** argv) {
  CLI::App root{
      "loom: fine-tunes decoder LLMs (Qwen3 and its MoE, Qwen2, Llama 3, Mistral) from a recipe file",
      "loom"};
  root.require_subcommand(1);
  root.set_version_flag("--version", "loom " + loom::loom_version(),
                        "Print the version and the git commit loom was built from");
  std::vector<loom::Command> commands;
  loom::train_command_register(root, commands);
  loom::check_command_register(root, commands);
  loom::recipe_command_register(root, commands);
  loom::tokenize_command_register(root, commands);
  loom::data_command_register(root, commands);
  loom::plan_command_register(root, commands);
  try {
    root.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return root.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return root.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return root.exit(e);
  } catch (const CLI::ParseError& e) {
    root.exit(e);
    return static_cast<int>(loom::ExitCode::bad_input);
  }
  try {
    for (const loom::Command& command : commands)
      if (command.app->parsed()) return command.run();
  } catch (const loom::LoomError& e) {
    std::fprintf(stderr, "loom: %s\n", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: %s\n", e.what());
    return static_cast<int>(loom::ExitCode::runtime_failure);
  }
  return static_cast<int>(loom::ExitCode::bad_input);
}
