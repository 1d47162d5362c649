// The CLI's subcommands: each file registers one (its options and a function to run it)
// and calls into the library; main() parses, runs and maps errors to exit codes.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdint>
#include <functional>
#include <string>
#include <system_error>
#include <vector>

namespace loom {

struct Command {
  CLI::App* app;
  std::function<int()> run;  // returns the exit code
};

// A --seed: a decimal integer of 0 to 2^64 - 1. CLI11 reads an unsigned option with strtoull,
// which takes "-1" for 2^64 - 1 and saturates past 64 bits; this refuses both, by name.
inline CLI::Validator seed_validator() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [stop, error] = std::from_chars(text.data(), end, value);
        if (error == std::errc() && stop == end) return "";
        return "\"" + text + "\", expected a decimal integer from 0 to 18446744073709551615 (2^64 - 1)";
      },
      "SEED");
}

void train_command_register(CLI::App& root, std::vector<Command>& commands);
void check_command_register(CLI::App& root, std::vector<Command>& commands);
void recipe_command_register(CLI::App& root, std::vector<Command>& commands);
void tokenize_command_register(CLI::App& root, std::vector<Command>& commands);
void data_command_register(CLI::App& root, std::vector<Command>& commands);
void plan_command_register(CLI::App& root, std::vector<Command>& commands);

}  // namespace loom
