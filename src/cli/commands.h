// The CLI's subcommands: each file registers one (its options and a function to run it)
// and calls into the library; main() parses, runs and maps errors to exit codes.
#pragma once

#include <functional>
#include <vector>

#include <CLI/CLI.hpp>

namespace loom {

struct Command {
  CLI::App* app;
  std::function<int()> run;  // returns the exit code
};

void train_command_register(CLI::App& root, std::vector<Command>& commands);
void check_command_register(CLI::App& root, std::vector<Command>& commands);
void recipe_command_register(CLI::App& root, std::vector<Command>& commands);
void tokenize_command_register(CLI::App& root, std::vector<Command>& commands);
void data_command_register(CLI::App& root, std::vector<Command>& commands);
void plan_command_register(CLI::App& root, std::vector<Command>& commands);

}  // namespace loom
