// The data commands as a user runs them (the loom binary: exit codes, stdout, stderr) and
// the trainer's side of the row store (rows_load_store, a run trained from a store).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <span>

#include "core/error.h"
#include "data/row_store.h"
#include "fixtures.h"
#include "recipe/recipe.h"
#include "support/run_binary.h"
#include "train/metrics.h"
#include "train/rows.h"
#include "train/trainer.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// Runs `loom ARGS` in tests/ with `input` on stdin.
test::BinaryRun loom(const test::TempDir& tmp, const std::string& args, const std::string& input = "") {
  return test::run_binary(LOOM_EXE, args, tmp, input);
}

TEST(LoomTokenize, WritesIdsPerLine) {
  const test::TempDir tmp("cli-tokenize");
  const test::BinaryRun r = loom(tmp, "tokenize --tokenizer data/qwen3-tokenizer",
                                 "{\"text\": \"Hello world<|im_end|>\"}\n\n{\"text\": \"Hi\"}\n");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "{\"ids\":[9707,1879,151645]}\n{\"ids\":[13048]}\n");
}

TEST(LoomTokenize, StopsAtABadLineWithExit2) {
  const test::TempDir tmp("cli-tokenize-bad");
  const test::BinaryRun r =
      loom(tmp, "tokenize --tokenizer data/qwen3-tokenizer", "{\"text\": \"Hi\"}\n{\"txt\": \"Hi\"}\n");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "{\"ids\":[13048]}\n");
  EXPECT_NE(r.err.find("stdin:2: field text is missing"), std::string::npos) << r.err;
}

// The first case of chat_cases.jsonl, whose tokens and mask come from transformers + slime.
TEST(LoomTokenize, ChatGivesTokensAndLossMask) {
  const test::TempDir tmp("cli-tokenize-chat");
  const ojson c = ojson::parse(test::read_lines_gz("data/chat_cases.jsonl")[0]);
  const test::BinaryRun r = loom(tmp, "tokenize --tokenizer data/qwen3-tokenizer --chat --loss-mask qwen3",
                                 c["conversation"].dump() + "\n");
  EXPECT_EQ(r.code, 0) << r.err;
  const ojson got = ojson::parse(r.out);
  EXPECT_EQ(got["tokens"], c["tokens"]);
  EXPECT_EQ(got["loss_mask"], c["loss_mask"]);
}

TEST(LoomTokenize, RefusesBadUsage) {
  const test::TempDir tmp("cli-tokenize-usage");
  EXPECT_EQ(loom(tmp, "tokenize").code, 2);
  EXPECT_EQ(loom(tmp, "tokenize --tokenizer data/qwen3-tokenizer --loss-mask qwen3").code,
            2);  // needs --chat
  const test::BinaryRun r = loom(tmp, "tokenize --tokenizer data/qwen3-tokenizer --chat --loss-mask llama");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--loss-mask: llama not in {qwen3,assistant}"), std::string::npos) << r.err;
  EXPECT_EQ(loom(tmp, "tokenize --tokenizer data/no-such-folder").code, 2);
  // A chat format takes its own loss mask.
  const test::BinaryRun pairing =
      loom(tmp, "tokenize --tokenizer data/qwen3-tokenizer --chat --chat-format qwen2.5 --loss-mask qwen3");
  EXPECT_EQ(pairing.code, 2);
  EXPECT_NE(pairing.err.find("--loss-mask: \"qwen3\", expected assistant for the qwen2.5 chat format"),
            std::string::npos)
      << pairing.err;
}

TEST(LoomDataBuild, BuildsTheReferenceRows) {
  const test::TempDir tmp("cli-build");
  const test::BinaryRun r =
      loom(tmp,
           "data build --input data/conversations_small.jsonl --tokenizer data/qwen3-tokenizer "
           "--row-tokens 64 --seed 1234 --loss-mask qwen3 --out " +
               (tmp.file("rows")));
  EXPECT_EQ(r.code, 0) << r.err;
  const ojson m = ojson::parse(test::read_file(tmp.file("rows/manifest.json")));
  // The digest test_data_build.cpp pins (data_build_reference.py's).
  EXPECT_EQ(m["rows_sha256"], "83b68bc177cbd208b2d64441c97efb598bbe7eb07dd0db151e902a6770b8fcd8");
  EXPECT_NE(r.err.find("23 rows of 64 tokens from 30 conversations"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("skipped 7 lines: invalid_utf8 1 (first line 9), malformed_json 2 (first line 3)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("loom: tokenizing done: "), std::string::npos) << r.err;  // the plain progress lines
}

// The qwen2.5 chat format with the assistant mask: the conversations with tools rendered as
// Qwen2.5's template does (none skipped for them), the format recorded in the manifest.
TEST(LoomDataBuild, BuildsQwen25RowsWithTools) {
  const test::TempDir tmp("cli-build-qwen25");
  const test::BinaryRun r =
      loom(tmp,
           "data build --input data/conversations_small.jsonl --tokenizer data/qwen3-tokenizer "
           "--row-tokens 64 --seed 1234 --chat-format qwen2.5 --loss-mask assistant --out " +
               (tmp.file("rows")));
  EXPECT_EQ(r.code, 0) << r.err;
  const ojson m = ojson::parse(test::read_file(tmp.file("rows/manifest.json")));
  EXPECT_EQ(m["chat_format"], "qwen2.5");
  EXPECT_EQ(m["loss_mask"], "assistant");
  EXPECT_EQ(m["conversations"], 30);
  EXPECT_FALSE(m["skipped"].contains("tools_not_in_format")) << m["skipped"].dump();
}

// --format: auto says what it chose per file; an unknown format, a first record of no
// format and an unreadable Parquet file are exit 2 naming what was wrong.
TEST(LoomDataBuild, ChoosesTheFormatPerFileAndRefusesWhatMatchesNone) {
  const test::TempDir tmp("cli-build-format");
  const std::string common =
      " --tokenizer data/qwen3-tokenizer --row-tokens 16 --seed 7 --out " + tmp.file("rows");
  test::BinaryRun r =
      loom(tmp, "data build --input data/formats/sharegpt.jsonl --input data/formats/alpaca.jsonl" + common +
                    "-ok");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("data build: data/formats/sharegpt.jsonl: format sharegpt (line 1's keys)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("data build: data/formats/alpaca.jsonl: format alpaca (line 1's keys)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("from 9 conversations"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(tmp.file("rows-ok/manifest.json")));
  r = loom(tmp, "data build --input data/formats/sharegpt.jsonl --format csv" + common);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--format: csv not in {auto,messages,sharegpt,alpaca,prompt_completion}"),
            std::string::npos)
      << r.err;
  test::write_file(tmp.file("qa.jsonl"), "\n{\"question\": \"q\", \"answer\": \"a\"}\n");
  r = loom(tmp, "data build --input " + tmp.file("qa.jsonl") + common);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("qa.jsonl:2: the first record's keys (\"question\", \"answer\") match no format"),
            std::string::npos)
      << r.err;
  test::write_file(tmp.file("bad.parquet"), "not parquet at all");
  r = loom(tmp, "data build --input " + tmp.file("bad.parquet") + common);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("bad.parquet: "), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("rows")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.scratch")));
}

TEST(LoomDataBuild, StrictExitsWith2NamingTheLine) {
  const test::TempDir tmp("cli-build-strict");
  const test::BinaryRun r =
      loom(tmp,
           "data build --input data/conversations_small.jsonl --tokenizer data/qwen3-tokenizer "
           "--row-tokens 64 --seed 1 --strict --out " +
               (tmp.file("rows")));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("data/conversations_small.jsonl:3: malformed_json"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("rows")));
}

TEST(LoomDataBuild, RefusesBadUsage) {
  const test::TempDir tmp("cli-build-usage");
  EXPECT_EQ(loom(tmp, "data").code, 2);
  EXPECT_EQ(loom(tmp, "data build --tokenizer data/qwen3-tokenizer --row-tokens 64 --seed 1 --out x").code,
            2);
  EXPECT_EQ(loom(tmp,
                 "data build --input data/conversations_small.jsonl --tokenizer data/qwen3-tokenizer "
                 "--row-tokens 1 --seed 1 --out x")
                .code,
            2);
  // Rows past 2^24 tokens once ended in a bare std::bad_alloc.
  const test::BinaryRun huge = loom(tmp,
                                    "data build --input data/conversations_small.jsonl --tokenizer "
                                    "data/qwen3-tokenizer --row-tokens 2147483647 --seed 1 --out x");
  EXPECT_EQ(huge.code, 2);
  EXPECT_NE(huge.err.find("--row-tokens: Value 2147483647 not in range 2 to 16777216"), std::string::npos)
      << huge.err;
  const test::BinaryRun r =
      loom(tmp,
           "data build --input data/conversations_small.jsonl --tokenizer data/qwen3-tokenizer "
           "--row-tokens 64 --seed 1 --loss-mask llama --out x");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--loss-mask: llama not in {qwen3,assistant}"), std::string::npos) << r.err;
}

// --threads outside 1 to 1,024 is refused before any work; threads the machine cannot start
// (here: a stack limit of 4 TiB, which the thread stacks cannot get) are a clean exit 3 that
// leaves neither OUT.tmp nor OUT.scratch behind.
TEST(LoomDataBuild, RefusesThreadsOutOfRangeAndCleansUpWhenThreadsCannotStart) {
  const test::TempDir tmp("cli-build-threads");
  const std::string build =
      "data build --input data/conversations_small.jsonl --tokenizer data/qwen3-tokenizer "
      "--row-tokens 64 --seed 1 --out " +
      tmp.file("rows");
  for (const char* threads : {"0", "1025", "-1"}) {
    const test::BinaryRun r = loom(tmp, build + " --threads " + threads);
    EXPECT_EQ(r.code, 2) << threads;
    EXPECT_NE(r.err.find("--threads"), std::string::npos) << r.err;
  }
  const test::BinaryRun r =
      test::run_binary(std::string("ulimit -s 4294967296 && ") + LOOM_EXE, build + " --threads 1024", tmp);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_NE(r.err.find("cannot start tokenizing thread"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp.file("rows")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.tmp")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.scratch")));
}

// A seed past 64 bits or below 0 is refused by name, not wrapped to 2^64 - 1.
TEST(LoomDataBuild, RefusesASeedOutside64Bits) {
  const test::TempDir tmp("cli-build-seed");
  for (const char* seed : {"-1", "18446744073709551616"}) {
    const test::BinaryRun r = loom(tmp,
                                   "data build --input data/conversations_small.jsonl --tokenizer "
                                   "data/qwen3-tokenizer --row-tokens 64 --out x --seed " +
                                       std::string(seed));
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find("--seed: \"" + std::string(seed) + "\", expected a decimal integer"),
              std::string::npos)
        << r.err;
  }
  const test::BinaryRun top = loom(tmp,
                                   "data build --input data/conversations_small.jsonl --tokenizer "
                                   "data/qwen3-tokenizer --row-tokens 64 --seed 18446744073709551615 --out " +
                                       tmp.file("rows"));
  EXPECT_EQ(top.code, 0) << top.err;
  EXPECT_EQ(ojson::parse(test::read_file(tmp.file("rows/manifest.json")))["seed"].get<uint64_t>(),
            UINT64_MAX);
}

// An output that is, holds or lies in another input or output of the command is refused
// before anything is written: --eval-out equal to --out once replaced the earlier store, and
// inside it (rows/ev) left a manifest naming a folder that was gone.
TEST(LoomDataBuild, RefusesAnOutputThatOverlapsAnotherPath) {
  const test::TempDir tmp("cli-build-overlap");
  const std::string build =
      "data build --input data/conversations_small.jsonl --tokenizer data/qwen3-tokenizer --row-tokens 64 "
      "--seed 1 ";
  ASSERT_EQ(loom(tmp, build + "--out " + tmp.file("rows")).code, 0);
  const std::string before = test::read_file(tmp.file("rows/manifest.json"));
  const struct {
    std::string args, message;
  } cases[] = {
      {"--out " + tmp.file("rows") + " --eval-fraction 0.2 --eval-out " + tmp.file("rows") + "/",
       "--out " + tmp.file("rows") + ": is --eval-out " + tmp.file("rows") + "/"},
      {"--out " + tmp.file("rows") + " --eval-fraction 0.2 --eval-out " + tmp.file("rows/ev"),
       "--out " + tmp.file("rows") + ": contains --eval-out " + tmp.file("rows/ev")},
      {"--out " + tmp.file("rows/inner") + " --eval-fraction 0.2 --eval-out " + tmp.file("rows"),
       "--out " + tmp.file("rows/inner") + ": lies inside --eval-out " + tmp.file("rows")},
      {"--out data/qwen3-tokenizer/rows", "--out data/qwen3-tokenizer/rows: lies inside --tokenizer"},
      {"--out data/conversations_small.jsonl", "--out data/conversations_small.jsonl: is --input"},
  };
  for (const auto& c : cases) {
    const test::BinaryRun r = loom(tmp, build + c.args);
    EXPECT_EQ(r.code, 2) << c.args << ": " << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
  EXPECT_EQ(test::read_file(tmp.file("rows/manifest.json")), before);
  EXPECT_FALSE(fs::exists(tmp.file("rows/ev")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.tmp")));
  EXPECT_FALSE(fs::exists("data/qwen3-tokenizer/rows"));
}

// A store of the golden case's rows (tests/golden/tiny_tied/rows.jsonl).
RowSet golden_rows() {
  return rows_load_jsonl("golden/tiny_tied/rows.jsonl", 20, 96);
}

void write_golden_store(const std::string& dir, const ojson& tokenizer_sha) {
  const RowSet rows = golden_rows();
  RowStoreWriter writer(dir, rows.row_tokens);
  for (int64_t r = 0; r < rows.rows; ++r) writer.append(rows.row_tokens_ptr(r), rows.row_mask_ptr(r));
  writer.commit({{"tokenizer_sha256", tokenizer_sha}});
}

std::string load_refusal(const std::string& dir, int64_t row_tokens, int64_t vocab,
                         const std::string& tokenizer) {
  try {
    rows_load(dir, row_tokens, vocab, tokenizer);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(RowsLoadStore, FillsTheRowSetAndChecksTheRunsTokenizer) {
  const test::TempDir tmp("rows-load-store");
  // Only the files' digests matter to the check.
  fs::create_directories(tmp.file("tok"));
  test::write_file(tmp.file("tok/tokenizer.json"), "{}");
  test::write_file(tmp.file("tok/tokenizer_config.json"), "{\"eos_token\": \"x\"}");
  write_golden_store(tmp.file("rows"), tokenizer_files_sha256(tmp.file("tok")));
  const RowSet expected = golden_rows();
  const RowSet got = rows_load(tmp.file("rows"), 20, 96, tmp.file("tok"));
  EXPECT_EQ(got.rows, expected.rows);
  EXPECT_EQ(got.row_tokens, 20);
  EXPECT_EQ(got.tokens, expected.tokens);
  EXPECT_EQ(got.loss_mask, expected.loss_mask);
  // A run whose checkpoint has no tokenizer checks none.
  EXPECT_EQ(load_refusal(tmp.file("rows"), 20, 96, "golden/tiny_tied/model"), "");
  EXPECT_NE(load_refusal(tmp.file("rows"), 32, 96, "").find("row_tokens check failed"), std::string::npos);
  EXPECT_NE(load_refusal(tmp.file("rows"), 20, 50, "").find("token check failed"), std::string::npos);
  test::write_file(tmp.file("tok/tokenizer_config.json"), "{\"eos_token\": \"y\"}");
  EXPECT_NE(load_refusal(tmp.file("rows"), 20, 96, tmp.file("tok"))
                .find("tokenizer check failed: tokenizer_config.json"),
            std::string::npos);
  std::string tokens = test::read_file(tmp.file("rows/tokens.bin"));
  tokens[4] ^= 1;  // row 0, token 1: 84 → 85, still in the vocabulary
  test::write_file(tmp.file("rows/tokens.bin"), tokens);
  EXPECT_NE(load_refusal(tmp.file("rows"), 20, 96, "").find("rows_sha256 check failed"), std::string::npos);
}

// `loom train` with train.data.path a row store trains what the rows .jsonl trains: the
// golden case's losses (transformers' trace).
TEST(RowsLoadStore, TrainsLikeTheRowsFile) {
  const test::TempDir tmp("rows-train");
  write_golden_store(tmp.file("rows"), ojson::object());
  const ojson r = ojson::parse(test::read_file("golden/tiny_tied/recipe.json"));
  std::ofstream(tmp.file("recipe.yaml"))
      << "schema_version: 1\nmodel: golden-tiny\nstatus: draft\n"
      << "workload: {row_tokens: 20, global_batch: " << r["global_batch"] << ", precision: fp32}\n"
      << "layout: {tp: 1, pp: 1, cp: 1, dp: 1, sequence_parallel: false, "
         "max_tokens_per_gpu: 40}\n"
      << "train:\n  device: cpu\n  seed: 1\n  init: {hf_checkpoint: "
      << fs::absolute("golden/tiny_tied/model").string() << "}\n  data: {path: " << (tmp.file("rows"))
      << "}\n  steps: " << r["steps"] << "\n  optimizer: {lr: " << r["lr"] << ", min_lr: " << r["min_lr"]
      << ", decay: cosine, warmup_fraction: " << r["warmup_fraction"]
      << ", weight_decay: " << r["weight_decay"] << ", beta1: " << r["beta1"] << ", beta2: " << r["beta2"]
      << ", eps: " << r["eps"] << ", clip_grad: " << r["clip_grad"]
      << "}\n  output_dir: " << (tmp.file("run")) << "\n";
  TrainOptions options;
  options.progress = false;
  train_run(recipe_load(tmp.file("recipe.yaml"), {}), options);
  const std::vector<StepMetrics> steps = metrics_read_jsonl(tmp.file("run/metrics.jsonl"));
  const ojson trace = ojson::parse(test::read_file("golden/tiny_tied/trace.json"));
  ASSERT_EQ(steps.size(), trace["steps"].size());
  for (size_t i = 0; i < steps.size(); ++i) {
    const double want = trace["steps"][i]["loss"].get<double>();
    EXPECT_NEAR(steps[i].loss, want, 1e-5 * want) << "step " << i + 1;
  }
}

// Isolated rows: a store of the isolated golden rows (their padded tails) reads back with
// the same boundaries, and rows_sha256 covers them.
TEST(RowsLoadStore, IsolatedRowsKeepTheirBoundaries) {
  const test::TempDir tmp("rows-isolated-store");
  const RowSet rows = rows_load_jsonl("golden/isolated/tiny_tied/rows.jsonl", 20, 96);
  const ojson reference = ojson::parse(test::read_file("golden/isolated/tiny_tied/reference.json"));
  RowStoreWriter writer(tmp.file("rows"), 20, RowPacking::isolated);
  for (int64_t r = 0; r < rows.rows; ++r)
    writer.append(rows.row_tokens_ptr(r), rows.row_mask_ptr(r),
                  reference["bounds"][static_cast<size_t>(r)].get<std::vector<int32_t>>());
  writer.commit(ojson::object());
  const RowSet got = rows_load(tmp.file("rows"), 20, 96, "");
  ASSERT_TRUE(got.isolated());
  for (int64_t r = 0; r < got.rows; ++r) {
    const std::span<const int32_t> b = got.row_bounds(r);
    EXPECT_EQ(std::vector<int32_t>(b.begin(), b.end()),
              reference["bounds"][static_cast<size_t>(r)].get<std::vector<int32_t>>());
  }
  EXPECT_EQ(got.tokens, rows.tokens);
}

std::string jsonl_refusal(const test::TempDir& tmp, const std::string& rows) {
  test::write_file(tmp.file("rows.jsonl"), rows);
  try {
    rows_load_jsonl(tmp.file("rows.jsonl"), 4, 100);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(RowsJsonl, ReadsPositionIdsAsSampleBoundaries) {
  const test::TempDir tmp("rows-position-ids");
  const std::string ok =
      "{\"tokens\": [1, 2, 3, 4], \"loss_mask\": [1, 1, 1, 1], \"position_ids\": [0, 1, 0, 1]}\n"
      "{\"tokens\": [1, 2, 3, 4], \"loss_mask\": [1, 1, 1, 1]}\n";
  EXPECT_EQ(jsonl_refusal(tmp, ok), "");
  const RowSet rows = rows_load_jsonl(tmp.file("rows.jsonl"), 4, 100);
  ASSERT_TRUE(rows.isolated());
  EXPECT_EQ(rows.sample_bounds, (std::vector<int32_t>{0, 2, 4, 0, 4}));
  // Position 1 predicts nothing: token 2 starts the next sample. The second row is one sample.
  std::vector<int32_t> targets(4);
  rows.row_targets(0, targets.data());
  EXPECT_EQ(targets, (std::vector<int32_t>{2, -1, 4, -1}));
  EXPECT_EQ(rows.row_denominator(0), 2);
  EXPECT_EQ(rows.row_denominator(1), 3);
}

TEST(RowsJsonl, RefusesPositionIdsThatDoNotRestartAtZero) {
  const test::TempDir tmp("rows-position-ids-bad");
  const std::string row = "{\"tokens\": [1, 2, 3, 4], \"loss_mask\": [1, 1, 1, 1], \"position_ids\": ";
  std::string why = jsonl_refusal(tmp, row + "[1, 2, 3, 4]}\n");
  EXPECT_NE(why.find("rows.jsonl:1: position_ids[0] = 1, expected 0"), std::string::npos) << why;
  why = jsonl_refusal(tmp, row + "[0, 1, 3, 4]}\n");
  EXPECT_NE(why.find("rows.jsonl:1: position_ids[2] = 3, expected 0 (a new sample) or 2"), std::string::npos)
      << why;
  why = jsonl_refusal(tmp, row + "[0, 1, 2]}\n");
  EXPECT_NE(why.find("position_ids has 3 entries, tokens 4"), std::string::npos) << why;
  why = jsonl_refusal(tmp, row + "\"0 1 2 3\"}\n");
  EXPECT_NE(why.find("field 'position_ids' is not an array"), std::string::npos) << why;
  // A sample longer than the row: the row is longer than row_tokens.
  why = jsonl_refusal(tmp,
                      "{\"tokens\": [1, 2, 3, 4, 5], \"loss_mask\": [1, 1, 1, 1, 1], "
                      "\"position_ids\": [0, 1, 2, 3, 4]}\n");
  EXPECT_NE(why.find("row has 5 tokens, expected row_tokens = 4"), std::string::npos) << why;
}

// `loom train` refuses bad isolated rows and a missing eval path with exit 2, naming them.
TEST(LoomTrain, RefusesBadRowsAndAMissingEvalPathWithExit2) {
  const test::TempDir tmp("train-eval-missing");
  test::write_file(
      tmp.file("rows.jsonl"),
      "{\"tokens\": [1, 2, 3, 4], \"loss_mask\": [1, 1, 1, 1], \"position_ids\": [0, 1, 0, 2]}\n");
  auto recipe = [&](const std::string& eval_path) {
    std::ofstream(tmp.file("recipe.yaml"))
        << "schema_version: 1\nmodel: golden-tiny\nstatus: draft\n"
        << "workload: {row_tokens: 4, global_batch: 1, precision: fp32}\n"
        << "layout: {tp: 1, pp: 1, cp: 1, dp: 1, sequence_parallel: false, max_tokens_per_gpu: 4}\n"
        << "train:\n  device: cpu\n  seed: 1\n  init: {hf_checkpoint: "
        << fs::absolute("golden/tiny_tied/model").string() << "}\n  data: {path: " << tmp.file("rows.jsonl")
        << "}\n  steps: 1\n  optimizer: {lr: 0.001}\n  eval: {data: {path: " << eval_path
        << "}, every: 1}\n  output_dir: " << tmp.file("run") << "\n";
    return tmp.file("recipe.yaml");
  };
  test::BinaryRun r = loom(tmp, "train " + recipe(tmp.file("rows.jsonl")));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("rows.jsonl:1: position_ids[3] = 2"), std::string::npos) << r.err;
  test::write_file(
      tmp.file("rows.jsonl"),
      "{\"tokens\": [1, 2, 3, 4], \"loss_mask\": [1, 1, 1, 1], \"position_ids\": [0, 1, 0, 1]}\n");
  r = loom(tmp, "train " + recipe(tmp.file("nowhere.jsonl")));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("train.eval.data.path"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace loom
