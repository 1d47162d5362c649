// loom data build: conversations (JSONL or Parquet, several formats) to a row store (docs/interface.md;
// src/data/data_build.h).
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "data/data_build.h"

namespace loom {
namespace {

// One stderr line on what was skipped, pointing at the manifest for the rest.
void print_summary(const nlohmann::ordered_json& m, const std::string& out) {
  std::fprintf(stderr, "loom: %s: %lld rows of %lld tokens from %lld conversations, supervised ratio %.4f\n",
               out.c_str(), static_cast<long long>(m["rows"].get<int64_t>()),
               static_cast<long long>(m["row_tokens"].get<int64_t>()),
               static_cast<long long>(m["conversations"].get<int64_t>()),
               m["supervised_token_ratio"].get<double>());
  if (m.contains("too_long_dropped"))
    std::fprintf(stderr,
                 "loom: isolated packing: %lld padding tokens; conversations longer than a row: %lld "
                 "dropped, %lld truncated\n",
                 static_cast<long long>(m["padding_tokens"].get<int64_t>()),
                 static_cast<long long>(m["too_long_dropped"].get<int64_t>()),
                 static_cast<long long>(m["too_long_truncated"].get<int64_t>()));
  if (m.contains("eval_store"))
    std::fprintf(stderr, "loom: held-out rows: %s (%lld rows)\n",
                 m["eval_store"]["path"].get<std::string>().c_str(),
                 static_cast<long long>(m["eval_store"]["rows"].get<int64_t>()));
  const int64_t skipped = m["skipped_conversations"].get<int64_t>();
  if (skipped == 0) return;
  std::string kinds;
  for (const auto& [kind, value] : m["skipped"].items()) {
    if (value["count"].get<int64_t>() == 0) continue;
    const nlohmann::ordered_json& first =
        value["first_lines"][0];  // a number, or "FILE:LINE" for several inputs
    kinds += (kinds.empty() ? "" : ", ") + kind + " " + std::to_string(value["count"].get<int64_t>()) +
             " (first line " +
             (first.is_string() ? first.get<std::string>() : std::to_string(first.get<int64_t>())) + ")";
  }
  std::fprintf(stderr, "loom: skipped %lld lines: %s; see %s/manifest.json (--strict stops at the first)\n",
               static_cast<long long>(skipped), kinds.c_str(), out.c_str());
}

}  // namespace

void data_command_register(CLI::App& root, std::vector<Command>& commands) {
  CLI::App* data = root.add_subcommand("data", "Build training data");
  data->require_subcommand(1);
  auto o = std::make_shared<DataBuildOptions>();
  CLI::App* app = data->add_subcommand(
      "build",
      "Pack conversations (JSONL or Parquet, in docs/data.md's formats) into a row store with manifest.json");
  app->add_option(
         "--input", o->inputs,
         "JSONL or Parquet file of conversations, or a folder of them (*.jsonl, *.parquet, read in name "
         "order); repeat for several")
      ->required();
  app->add_option("--format", o->format,
                  "the records' format: auto (per file, from the first record's keys), "
                  "messages, sharegpt, alpaca or prompt_completion")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "messages", "sharegpt", "alpaca", "prompt_completion"}));
  app->add_option("--tokenizer", o->tokenizer, "folder with tokenizer.json and tokenizer_config.json")
      ->required();
  app->add_option("--row-tokens", o->row_tokens, "tokens per row")
      ->required()
      ->check(CLI::Range(int64_t{2}, kMaxRowTokens));
  app->add_option("--seed", o->seed, "seed of the conversation permutation")
      ->required()
      ->check(seed_validator());
  app->add_option("--chat-format", o->chat_format, "chat format: qwen3, llama3 or qwen2.5")
      ->capture_default_str()
      ->check(CLI::IsMember({"qwen3", "llama3", "qwen2.5"}));
  app->add_option("--loss-mask", o->loss_mask, "loss mask: qwen3 (qwen3 format) or assistant")
      ->capture_default_str()
      ->check(CLI::IsMember({"qwen3", "assistant"}));
  app->add_option("--out", o->out, "the row store folder to write")->required();
  app->add_flag("--strict", o->strict, "exit 2 at the first line that is not a usable conversation");
  app->add_option("--eos", o->eos,
                  "the token between conversations (default: tokenizer_config.json's eos_token)");
  app->add_option("--threads", o->threads, "tokenizing threads (default: one per core)")
      ->check(CLI::Range(1, kDataBuildMaxThreads));
  app->add_option("--packing", o->packing,
                  "rows: conversations joined with EOS and cut into rows (attention across them); "
                  "isolated: whole conversations binned into padded rows, each its own sample")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, RowPacking>{{"rows", RowPacking::rows}, {"isolated", RowPacking::isolated}}))
      ->default_str("rows");
  app->add_option("--too-long", o->too_long,
                  "isolated packing: a conversation longer than a row is dropped or truncated")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, TooLong>{{"drop", TooLong::drop}, {"truncate", TooLong::truncate}}))
      ->default_str("drop");
  app->add_option("--eval-fraction", o->eval_fraction,
                  "share of the conversations (seeded, whole) set aside as a held-out row store")
      ->check(CLI::Range(0.0, 1.0));
  app->add_option("--eval-out", o->eval_out, "the held-out row store folder (default: OUT-eval)");
  commands.push_back({app, [o] {
                        DataBuildOptions options = *o;
                        options.progress = progress_style_for_stderr();
                        const nlohmann::ordered_json manifest = data_build(options);
                        print_summary(manifest, options.out);
                        return 0;
                      }});
}

}  // namespace loom
