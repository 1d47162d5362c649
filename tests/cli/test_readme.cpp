// README.md as a user follows it: its recipe and the commands that run it (made tiny by
// --set overrides, on the CPU), the output it shows beside them, and its command list
// against the binary's --help. A README edit that breaks any of them fails here.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/hf_checkpoint.h"
#include "io/init.h"
#include "model/config.h"
#include "model/param_table.h"
#include "support/run_binary.h"
#include "support/temp_dir.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A fenced block of README.md: its info string (```yaml → "yaml"), the heading above it and
// its lines.
struct Block {
  std::string info, heading;
  std::vector<std::string> lines;
};

std::vector<Block> readme_blocks() {
  std::vector<Block> blocks;
  std::string heading;
  bool inside = false;
  for (const std::string& line : lines_of(read_text(fs::path(LOOM_SOURCE_DIR) / "README.md"))) {
    if (line.rfind("```", 0) == 0) {
      if (!inside) blocks.push_back({line.substr(3), heading, {}});
      inside = !inside;
    } else if (inside) {
      blocks.back().lines.push_back(line);
    } else if (line.rfind("## ", 0) == 0) {
      heading = line.substr(3);
    }
  }
  return blocks;
}

// The one block with this info string.
Block block_with_info(const std::string& info) {
  std::vector<Block> found;
  for (const Block& b : readme_blocks())
    if (b.info == info) found.push_back(b);
  if (found.size() != 1)
    ADD_FAILURE() << "README.md has " << found.size() << " ```" << info << " blocks, expected 1";
  return found.empty() ? Block{} : found[0];
}

// Shell lines joined where they end in a backslash, comments and blank lines dropped.
std::vector<std::string> shell_commands(const std::vector<std::string>& lines) {
  std::vector<std::string> commands;
  std::string pending;
  for (std::string line : lines) {
    if (const size_t hash = line.find(" #"); hash != std::string::npos) line.resize(hash);
    if (line.rfind('#', 0) == 0) line.clear();
    const bool continues = !line.empty() && line.back() == '\\';
    if (continues) line.pop_back();
    pending += line + " ";
    if (!continues) {
      if (pending.find_first_not_of(' ') != std::string::npos) commands.push_back(pending);
      pending.clear();
    }
  }
  return commands;
}

std::vector<std::string> words_of(const std::string& command) {
  std::vector<std::string> words;
  std::istringstream in(command);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// The word after `flag` in `words`, "" when there is none.
std::string value_of(const std::vector<std::string>& words, const std::string& flag) {
  for (size_t i = 0; i + 1 < words.size(); ++i)
    if (words[i] == flag) return words[i + 1];
  return "";
}

std::string joined(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& w : words) text += (text.empty() ? "" : " ") + w;
  return text;
}

// `loom ARGS` run in `cwd`, its streams through files in `scratch`.
test::BinaryRun loom_in(const std::string& cwd, const std::string& args, const test::TempDir& scratch) {
  return test::run_binary("cd '" + cwd + "' && " + std::string(LOOM_BINARY), args, scratch);
}

// A line of output with its numbers and the model's name blurred, so that the README's
// excerpts and the tiny run's lines can be compared.
std::string shape_of(std::string line, const std::vector<std::string>& model_names) {
  for (const std::string& name : model_names)
    for (size_t at = line.find(name); at != std::string::npos; at = line.find(name, at))
      line.replace(at, name.size(), "MODEL");
  line = std::regex_replace(line, std::regex(R"([-+]?[0-9][0-9.,e+-]*)"), "#");
  return std::regex_replace(line, std::regex(R"(\s+)"), " ");
}

// What the Hub gives for `hf download Qwen/Qwen3-0.6B`, at a size a test trains in seconds:
// config.json and model.safetensors (bf16) of a two-layer Qwen3 with the full vocabulary,
// and the Qwen3 tokenizer's files.
void write_tiny_hub_checkpoint(const fs::path& dir) {
  const ModelConfig config = model_config_load(std::string(LOOM_SOURCE_DIR) + "/recipes/chat/config.json");
  const ParamTable table = param_table_build(config);
  RandomInitSource init(config, table, 1234);
  hf_checkpoint_save(dir.string(), config, table, init, DType::bf16, 0);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(fs::path(LOOM_SOURCE_DIR) / "tests/data/qwen3-tokenizer" / file, dir / file);
}

// The README's recipe and its commands, as written but for the size: data build's rows of 64
// tokens, and --set on plan and train for a CPU run of 3 steps of 2 rows with an eval after
// each step. Every command exits 0; the run trains, evaluates on the held-out store and
// writes its checkpoint; the output excerpts the README shows are lines the commands print.
TEST(Readme, RecipeAndItsCommandsRunAsWritten) {
  const Block recipe = block_with_info("yaml");
  const Block run = block_with_info("sh");
  const Block shown = block_with_info("text");
  ASSERT_FALSE(recipe.lines.empty());
  ASSERT_FALSE(run.lines.empty());
  EXPECT_LE(recipe.lines.size(), 15u) << "the README's recipe is to be read at a glance";

  const test::TempDir work("readme"), scratch("readme-streams");
  const fs::path dir = work.path();
  // The commands' file names as the README gives them.
  std::string recipe_file, checkpoint_dir, input_file;
  for (const std::string& command : shell_commands(run.lines)) {
    const std::vector<std::string> words = words_of(command);
    if (words.size() >= 2 && words[0] == "hf" && words[1] == "download")
      checkpoint_dir = value_of(words, "--local-dir");
    if (words.size() >= 3 && words[0] == "loom" && words[1] == "data")
      input_file = value_of(words, "--input");
    if (words.size() >= 2 && words[0] == "loom" && words[1] == "train") recipe_file = words[2];
  }
  ASSERT_FALSE(checkpoint_dir.empty()) << "no `hf download ... --local-dir DIR` in the README's commands";
  ASSERT_FALSE(input_file.empty()) << "no `loom data build --input FILE` in the README's commands";
  ASSERT_FALSE(recipe_file.empty()) << "no `loom train RECIPE` in the README's commands";

  std::string recipe_text;
  for (const std::string& line : recipe.lines) recipe_text += line + "\n";
  EXPECT_NE(recipe_text.find("hf_checkpoint: " + checkpoint_dir + "}"), std::string::npos)
      << "the recipe does not start from the folder `hf download` wrote (" << checkpoint_dir << ")";
  std::ofstream(dir / recipe_file) << recipe_text;
  write_tiny_hub_checkpoint(dir / checkpoint_dir);
  {  // 60 of the main job's conversations stand in for the user's.
    std::ifstream in(fs::path(LOOM_SOURCE_DIR) / "recipes/chat/conversations.jsonl");
    std::ofstream out(dir / input_file);
    std::string line;
    for (int i = 0; i < 60 && std::getline(in, line); ++i) out << line << "\n";
  }

  const std::string tiny_model = "qwen3-readme-tiny";
  const std::string tiny =
      " --set model=" + tiny_model +
      " --set train.device=cpu --set workload.precision=fp32"
      " --set workload.row_tokens=64 --set workload.global_batch=2 --set layout.max_tokens_per_gpu=128"
      " --set train.steps=3 --set train.eval.every=1 --set train.checkpoint.every=2 --set "
      "result.window=[2,3]";
  std::string printed;
  int loom_commands = 0;
  for (const std::string& command : shell_commands(run.lines)) {
    std::vector<std::string> words = words_of(command);
    if (words.empty() || words[0] != "loom") continue;
    ++loom_commands;
    words.erase(words.begin());
    for (size_t i = 0; i + 1 < words.size(); ++i)
      if (words[i] == "--row-tokens") words[i + 1] = "64";
    const bool recipe_command = words[0] == "plan" || words[0] == "train";
    const std::string args = joined(words) + (recipe_command ? tiny : "");
    const test::BinaryRun r = loom_in(dir.string(), args, scratch);
    EXPECT_EQ(r.code, 0) << "loom " << args << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err;
    printed += r.out + r.err;
  }
  EXPECT_EQ(loom_commands, 3) << "data build, plan and train";

  // The run: every step's loss finite, evaluations on the held-out store, a checkpoint.
  const std::string output_dir = "runs/sft";
  EXPECT_NE(recipe_text.find("output_dir: " + output_dir), std::string::npos);
  int steps = 0, evals = 0;
  for (const std::string& line : lines_of(read_text(dir / output_dir / "metrics.jsonl"))) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) {
      ++steps;
      EXPECT_TRUE(std::isfinite(record["loss"].get<double>())) << line;
    }
    if (record.contains("eval_loss")) {
      ++evals;
      EXPECT_GT(record["eval_tokens"].get<int64_t>(), 0) << line;
    }
  }
  EXPECT_EQ(steps, 3);
  EXPECT_EQ(evals, 4) << "step 0 and after each of the 3 steps";
  EXPECT_TRUE(fs::exists(dir / output_dir / "final/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir / output_dir / "result.yaml"));

  // The README's excerpts of what the commands print (its ```text block, "$ " lines being the
  // commands): each is the shape of a line printed here.
  std::smatch model;
  ASSERT_TRUE(std::regex_search(recipe_text, model, std::regex(R"((^|\n)model: (\S+))")));
  const std::vector<std::string> model_names = {model[2].str(), tiny_model};
  std::vector<std::string> printed_shapes;
  for (const std::string& line : lines_of(printed)) printed_shapes.push_back(shape_of(line, model_names));
  int excerpt_lines = 0;
  for (const std::string& line : shown.lines) {
    if (line.rfind("$ ", 0) == 0 || line.find_first_not_of(' ') == std::string::npos || line == "...")
      continue;
    ++excerpt_lines;
    const std::string shape = shape_of(line, model_names);
    bool found = false;
    for (const std::string& p : printed_shapes) found = found || p.find(shape) != std::string::npos;
    EXPECT_TRUE(found) << "the README shows a line no command printed: " << line << "\nprinted:\n" << printed;
  }
  EXPECT_GT(excerpt_lines, 0);
}

// The README's first block: the scripts a new user runs first, each an executable file.
TEST(Readme, OpensWithTheTwoScripts) {
  const std::vector<Block> blocks = readme_blocks();
  ASSERT_FALSE(blocks.empty());
  std::vector<std::string> scripts;
  for (const std::string& command : shell_commands(blocks[0].lines)) scripts.push_back(words_of(command)[0]);
  EXPECT_EQ(scripts, (std::vector<std::string>{"scripts/main_job.sh", "scripts/test.sh"}));
  for (const std::string& script : scripts) {
    const fs::path path = fs::path(LOOM_SOURCE_DIR) / script;
    ASSERT_TRUE(fs::is_regular_file(path)) << script;
    const fs::perms perms = fs::status(path).permissions();
    EXPECT_NE(perms & fs::perms::owner_exec, fs::perms::none) << script << " is not an executable file";
  }
}

// Each line of the README's command list names a command the binary has (its --help exits
// 0) and only options that command's --help lists.
TEST(Readme, CommandListMatchesTheBinary) {
  std::vector<Block> lists;
  for (const Block& b : readme_blocks())
    if (b.heading == "Commands") lists.push_back(b);
  ASSERT_EQ(lists.size(), 1u) << "one fenced block under ## Commands";
  const test::TempDir scratch("readme-help");
  // A command's options may go on in indented lines below it.
  std::vector<std::string> listed;
  for (const std::string& line : lists[0].lines) {
    if (!listed.empty() && !line.empty() && line[0] == ' ')
      listed.back() += line;
    else
      listed.push_back(line);
  }
  int commands = 0;
  for (const std::string& command : listed) {
    const std::vector<std::string> words = words_of(command);
    ASSERT_TRUE(!words.empty() && words[0] == "loom") << "not a loom command: " << command;
    ++commands;
    // The subcommand: the words up to the first argument (FILE, --flag, [optional]).
    std::string path;
    for (size_t i = 1; i < words.size() && std::regex_match(words[i], std::regex("[a-z]+")); ++i)
      path += " " + words[i];
    const test::BinaryRun help = loom_in(".", path + " --help", scratch);
    EXPECT_EQ(help.code, 0) << "loom" << path << " --help: " << help.err;
    std::smatch match;
    for (auto it = command.cbegin();
         std::regex_search(it, command.cend(), match, std::regex("--[a-z][a-z0-9-]*"));
         it = match.suffix().first)
      EXPECT_NE(help.out.find(match.str()), std::string::npos)
          << "loom" << path << ": the README names " << match.str() << ", its --help does not";
  }
  EXPECT_GE(commands, 10);
}

}  // namespace
}  // namespace loom
