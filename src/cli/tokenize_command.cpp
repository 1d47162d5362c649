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
  std::string chat_format = "qwen3";
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
  CLI::Option* format =
      app->add_option("--chat-format", args->chat_format, "chat format of --chat: qwen3, llama3 or qwen2.5")
          ->capture_default_str()
          ->check(CLI::IsMember({"qwen3", "llama3", "qwen2.5"}));
  format->needs(app->get_option("--chat"));
  CLI::Option* mask = app->add_option("--loss-mask", args->loss_mask,
                                      "loss mask of --chat: qwen3 (qwen3 format) or assistant")
                          ->capture_default_str()
                          ->check(CLI::IsMember({"qwen3", "assistant"}));
  mask->needs(app->get_option("--chat"));
  commands.push_back({app, [args] {
                        const Tokenizer tokenizer = Tokenizer::load(args->tokenizer);
                        std::ios::sync_with_stdio(false);
                        TokenizeStreamOptions options;
                        options.chat = args->chat;
                        options.chat_format = args->chat_format;
                        options.loss_mask = args->loss_mask;
                        tokenize_stream(tokenizer, std::cin, std::cout, options);
                        return 0;
                      }});
}

}  // namespace loom
