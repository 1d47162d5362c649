// `loom data build`: chat conversations (JSONL or Parquet files, in any of the formats of
// input_formats.h) → a row store (row_store.h), as docs/numerics.md "Data" packs them.
// docs/data.md is the description for other implementations.
//
// Two passes over the input, memory bounded by a few chunks per thread plus 16 bytes per
// conversation (its offset and its place in the permutation):
//   1. tokenize: the input files are read once, one after the other, in chunks of whole lines
//      (a Parquet file's rows written as JSON lines), hashed (input_sha256) and tokenized by
//      `threads` threads (the chat format's loss mask, chat_formats.h); the results are
//      appended in input order to scratch files next to the output (OUT.scratch, removed
//      after). Conversation k is the k-th usable record of the inputs.
//   2. pack: the conversations are read back from the scratch files and packed in the order
//      data_permutation(conversations, seed) gives (packer.h): rows packing with EOS between
//      them into rows of row_tokens, isolated packing binned whole into padded rows; the
//      rows go to the row store with their rows_sha256 (and an eval fraction's to a second).
// The rows depend only on the input's bytes, the tokenizer, row_tokens, seed and the EOS
// token: not on the thread count, the chunking or the machine.
//
// A line that is not a usable conversation (invalid UTF-8, malformed JSON, an empty
// conversation, an unknown role, non-string content, a bad tool call; chat.h ChatProblem)
// is skipped and counted in the manifest with the first line numbers of its kind, or with
// `strict` stops the build with an InputError naming the line. Blank lines are ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/packer.h"
#include "data/progress.h"
#include "data/row_store.h"
#include "data/tokenizer.h"

namespace loom {

struct DataBuildOptions {
  // JSONL or Parquet files (*.parquet) of conversations, or folders of them (their *.jsonl and
  // *.parquet files, sorted by name), read one after the other.
  std::vector<std::string> inputs;
  std::string format = "auto";  // auto, messages, sharegpt, alpaca, prompt_completion (input_formats.h)
  std::string tokenizer;        // a folder with tokenizer.json and tokenizer_config.json
  std::string out;              // the row store folder (replaced if it holds a row store)
  int64_t row_tokens = 0;
  uint64_t seed = 0;
  std::string chat_format = "qwen3";      // qwen3, llama3 or qwen2.5 (chat_formats.h)
  std::string loss_mask = "qwen3";        // qwen3 with the qwen3 format, assistant with the others
  RowPacking packing = RowPacking::rows;  // --packing (packer.h)
  TooLong too_long = TooLong::drop;       // --too-long: isolated packing's conversations over a row
  // --eval-fraction: this share of the conversations (the first of the seeded permutation,
  // rounded) goes to a second row store, eval_out (default OUT-eval), packed the same way.
  double eval_fraction = 0;
  std::string eval_out;
  std::string eos;  // the EOS token's content; empty: tokenizer_config's eos_token
  bool strict = false;
  int threads = 0;  // tokenizing threads, 1 to kDataBuildMaxThreads; 0: one per core (capped)
  ProgressStyle progress = ProgressStyle::none;
  size_t chunk_bytes = size_t{1} << 20;  // input handed to a thread at a time (whole lines)
};

// More tokenizing threads than this buy nothing and only risk the machine's thread limit.
inline constexpr int kDataBuildMaxThreads = 1024;

// At most this many first line numbers are kept per kind of skipped line.
inline constexpr size_t kSkippedFirstLines = 10;

// Builds the store and returns its manifest. InputError for bad options or input, a
// problem line under `strict`, or an input with no row's worth of supervised conversation.
nlohmann::ordered_json data_build(const DataBuildOptions& options);
// The same with the tokenizer already loaded from options.tokenizer (which still names the
// files the manifest hashes and the tokenizer_config.json that gives the EOS).
nlohmann::ordered_json data_build(const DataBuildOptions& options, const Tokenizer& tokenizer);

// The input files --input names, in the order they are read: each file, each folder's *.jsonl
// and *.parquet files sorted by name. InputError for a path that is neither, or a folder with none.
std::vector<std::string> data_input_files(const std::vector<std::string>& inputs);

// The eval store's folder: eval_out, or OUT-eval.
std::string data_eval_out(const DataBuildOptions& options);

struct EosToken {
  std::string content;
  int32_t id = 0;
};

// `override_content` when not empty, else tokenizer_config.json's eos_token (a string or
// {"content": ...}) in `tokenizer_dir`; InputError when there is none or the tokenizer
// does not know it.
EosToken data_eos_token(const Tokenizer& tokenizer, const std::string& tokenizer_dir,
                        const std::string& override_content);

}  // namespace loom
