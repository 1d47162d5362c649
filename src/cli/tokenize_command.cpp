// loom tokenize --tokenizer DIR [--chat --loss-mask qwen3]: JSONL on stdin to JSONL on stdout
// (docs/interface.md; src/data/tokenize_stream.h).
#include <iostream>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "data/tokenize_stream.h"
#include "data/tokenizer.h"

namespace loom {
namespace {

struct TokenizeArgs {
  std::string tokenizer;
  bool chat = false;
  std::string loss_mask = "qwen3";
};

}  // namespace

void tokenize_command_register(CLI::App& root, std::vector<Command>& commands) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* app = root.add_subcommand(
      "tokenize",
      "Tokenize JSONL from stdin: {\"text\"} -> {\"ids\"}, or with --chat {\"messages\"} -> "
      "{\"tokens\", \"loss_mask\"}");
  app->add_option("--tokenizer", args->tokenizer,
                  "folder with tokenizer.json (an HF checkpoint folder works)")
      ->required();
  app->add_flag("--chat", args->chat, "read {\"messages\": [...]} and apply the chat template and loss mask");
  CLI::Option* mask = app->add_option("--loss-mask", args->loss_mask, "loss mask of --chat")
                          ->capture_default_str()
                          ->check(CLI::IsMember({"qwen3"}));
  mask->needs(app->get_option("--chat"));
  commands.push_back({app, [args] {
                        const Tokenizer tokenizer = Tokenizer::load(args->tokenizer);
                        std::ios::sync_with_stdio(false);
                        TokenizeStreamOptions options;
                        options.chat = args->chat;
                        options.loss_mask = args->loss_mask;
                        tokenize_stream(tokenizer, std::cin, std::cout, options);
                        return 0;
                      }});
}

}  // namespace loom
