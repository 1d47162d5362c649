#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "data/chat.h"
#include "data/data_build.h"
#include "data/parquet_records.h"
#include "data/row_store.h"
#include "data/sha256.h"
#include "fixtures.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// conversations_small.jsonl: 38 lines, 30 usable conversations, one blank line (6) and a bad
// line of each kind: malformed JSON (3, 13), an unknown role (5), non-string content (7), an
// empty conversation (8), invalid UTF-8 (9), a tool call without a name (12).
constexpr const char* kFixture = "data/conversations_small.jsonl";
constexpr const char* kTokenizer = "data/qwen3-tokenizer";

// From tests/data/data_build_reference.py (transformers' template, slime's loss mask, the
// permutation and packing of docs/data.md, in Python): rows_sha256 per (row_tokens, seed).
constexpr const char* kSha64Seed1234 = "83b68bc177cbd208b2d64441c97efb598bbe7eb07dd0db151e902a6770b8fcd8";
constexpr const char* kSha64Seed1235 = "3275edd9521ae73557b21429297aa75637e780bfc3255beb2d60d1653827e492";
constexpr const char* kSha37Seed0 = "c750ec7545dca2827373e13a4d0cbe55cb2bf411afbb4e469ac63bb7330a73ec";

DataBuildOptions options(const std::string& out, int64_t row_tokens = 64, uint64_t seed = 1234) {
  DataBuildOptions o;
  o.inputs = {kFixture};
  o.tokenizer = kTokenizer;
  o.out = out;
  o.row_tokens = row_tokens;
  o.seed = seed;
  o.threads = 2;
  return o;
}

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load(kTokenizer);
  return t;
}

ojson build(const DataBuildOptions& o) {
  return data_build(o, qwen3());
}

std::string refusal(const DataBuildOptions& o) {
  try {
    build(o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// The reference's digests, whatever the thread count and chunking: the rows depend on
// the input, tokenizer, row_tokens, seed and EOS only.
TEST(DataBuild, MatchesTheReferenceRows) {
  const test::TempDir tmp("build-reference");
  DataBuildOptions o = options(tmp.file("a"));
  const ojson a = build(o);
  EXPECT_EQ(a["rows_sha256"], kSha64Seed1234);
  EXPECT_EQ(a["rows"], 23);
  EXPECT_DOUBLE_EQ(a["supervised_token_ratio"].get<double>(), 614.0 / (23 * 64));
  o.out = tmp.file("b");
  o.threads = 3;
  o.chunk_bytes = 97;  // a chunk per line or two, lines longer than a chunk
  EXPECT_EQ(build(o)["rows_sha256"], kSha64Seed1234);
  o.threads = 1;
  o.seed = 1235;
  EXPECT_EQ(build(o)["rows_sha256"], kSha64Seed1235);
  o.row_tokens = 37;
  o.seed = 0;
  const ojson c = build(o);
  EXPECT_EQ(c["rows_sha256"], kSha37Seed0);
  EXPECT_EQ(c["rows"], 41);
  // What was written is what the manifest says.
  RowStoreExpect expect;
  expect.row_tokens = 37;
  expect.tokenizer_sha256 = tokenizer_files_sha256(kTokenizer);
  const RowStore store = RowStore::open(o.out, expect);
  EXPECT_EQ(store.rows(), 41);
}

TEST(DataBuild, ManifestHasEveryField) {
  const test::TempDir tmp("build-manifest");
  const ojson m = build(options(tmp.file("rows")));
  EXPECT_EQ(ojson::parse(test::read_file(tmp.file("rows/manifest.json"))), m);
  for (const char* key : {"format",
                          "rows",
                          "row_tokens",
                          "padding_tokens",
                          "supervised_token_ratio",
                          "rows_sha256",
                          "files",
                          "seed",
                          "permutation",
                          "loss_mask",
                          "eos_token",
                          "input",
                          "input_sha256",
                          "input_bytes",
                          "input_lines",
                          "tokenizer",
                          "tokenizer_sha256",
                          "conversations",
                          "conversation_tokens",
                          "rows_without_target",
                          "tail_tokens_dropped",
                          "skipped_conversations",
                          "skipped"})
    EXPECT_TRUE(m.contains(key)) << key;
  EXPECT_EQ(m["row_tokens"], 64);
  EXPECT_EQ(m["padding_tokens"], 0);
  EXPECT_EQ(m["seed"], 1234);
  EXPECT_EQ(m["loss_mask"], "qwen3");
  EXPECT_EQ(m["eos_token"], (ojson{{"content", "<|im_end|>"}, {"id", 151645}}));
  EXPECT_EQ(m["input_sha256"], sha256_file(kFixture));
  EXPECT_EQ(m["input_bytes"], fs::file_size(kFixture));
  EXPECT_EQ(m["input_lines"], 38);
  EXPECT_EQ(m["tokenizer_sha256"], tokenizer_files_sha256(kTokenizer));
  EXPECT_EQ(m["tokenizer_sha256"]["tokenizer.json"],
            "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4");
  EXPECT_EQ(m["conversations"], 30);
  EXPECT_EQ(m["conversation_tokens"], 1564);
  // 1564 tokens + 29 EOS = 1593 = 24 rows of 64 + 57; 23 kept, so one had no target.
  EXPECT_EQ(m["rows_without_target"], 1);
  EXPECT_EQ(m["tail_tokens_dropped"], 57);
  EXPECT_EQ(m["skipped_conversations"], 7);
  const ojson& s = m["skipped"];
  EXPECT_EQ(s["malformed_json"]["count"], 2);
  EXPECT_EQ(s["malformed_json"]["first_lines"], (ojson{3, 13}));
  EXPECT_EQ(s["unknown_role"]["first_lines"], (ojson{5}));
  EXPECT_NE(s["unknown_role"]["first_detail"].get<std::string>().find("\"bot\""), std::string::npos);
  EXPECT_EQ(s["non_string_content"]["first_lines"], (ojson{7}));
  EXPECT_EQ(s["empty_conversation"]["first_lines"], (ojson{8}));
  EXPECT_EQ(s["invalid_utf8"]["first_lines"], (ojson{9}));
  EXPECT_EQ(s["bad_tool_call"]["first_lines"], (ojson{12}));
  EXPECT_FALSE(fs::exists(tmp.file("rows.scratch")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.tmp")));
}

// Bad input that needs the tokenizer to find: a bad line under --strict, no usable
// conversation, not a row's worth of supervised tokens.
TEST(DataBuild, RefusesInputsThatMakeNoRows) {
  const test::TempDir tmp("build-strict");
  DataBuildOptions o = options(tmp.file("rows"));
  o.strict = true;
  o.chunk_bytes = 64;  // the bad line's chunk may finish after later ones
  const std::string why = refusal(o);
  EXPECT_NE(why.find("data/conversations_small.jsonl:3: malformed_json"), std::string::npos) << why;
  EXPECT_FALSE(fs::exists(tmp.file("rows")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.tmp")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.scratch")));
  // A key written twice in one object (once read as its last value) is malformed_json too.
  test::write_file(tmp.file("twice.jsonl"),
                   "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}\n"
                   "{\"messages\": [{\"role\": \"user\", \"role\": \"user\", "
                   "\"content\": \"b\"}]}\n");
  o.inputs = {tmp.file("twice.jsonl")};
  const std::string twice = refusal(o);
  EXPECT_NE(twice.find("twice.jsonl:2: malformed_json: found the key 'role' a second time"),
            std::string::npos)
      << twice;
  EXPECT_FALSE(fs::exists(tmp.file("rows.tmp")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.scratch")));
  o = options(tmp.file("rows"), 100000);
  EXPECT_NE(refusal(o).find("fill no row of 100000 tokens"), std::string::npos) << refusal(o);
  test::write_file(tmp.file("bad.jsonl"), "{\"messages\": []}\nnot json\n\n");
  o = options(tmp.file("rows"));
  o.inputs = {tmp.file("bad.jsonl")};
  EXPECT_NE(refusal(o).find("no usable conversation in 3 lines (2 skipped)"), std::string::npos)
      << refusal(o);
  EXPECT_FALSE(fs::exists(tmp.file("rows")));
}

TEST(DataBuild, NamesAnotherEos) {
  const test::TempDir tmp("build-eos");
  DataBuildOptions o = options(tmp.file("rows"));
  o.eos = "<|endoftext|>";
  const ojson m = build(o);
  EXPECT_EQ(m["eos_token"]["id"], 151643);
  EXPECT_NE(m["rows_sha256"], kSha64Seed1234);
  const RowStore store = RowStore::open(tmp.file("rows"));
  EXPECT_NE(std::find(store.tokens(), store.tokens() + store.rows() * 64, 151643),
            store.tokens() + store.rows() * 64);
  o.eos = "<|no-such-token|>";
  EXPECT_NE(refusal(o).find("--eos: \"<|no-such-token|>\" is not a token"), std::string::npos) << refusal(o);
}

// What is refused before the tokenizer is read (data_build loads it after these checks).
TEST(DataBuild, RefusesBadOptionsFirst) {
  const test::TempDir tmp("build-refusals");
  auto refused = [](const DataBuildOptions& o) {
    try {
      data_build(o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  DataBuildOptions o = options(tmp.file("rows"));
  o.tokenizer = tmp.file("no-tokenizer-here");
  o.loss_mask = "llama";
  EXPECT_NE(refused(o).find("--loss-mask: \"llama\", expected qwen3"), std::string::npos);
  o.loss_mask = "qwen3";
  o.row_tokens = 1;
  EXPECT_NE(refused(o).find("--row-tokens: 1"), std::string::npos);
  o.row_tokens = 64;
  o.inputs = {tmp.file("missing.jsonl")};
  EXPECT_NE(refused(o).find("missing.jsonl: not a file"), std::string::npos);
  o.inputs = {kFixture};
  fs::create_directories(tmp.file("taken"));
  test::write_file(tmp.file("taken/notes.txt"), "keep");
  o.out = tmp.file("taken");
  EXPECT_NE(refused(o).find("taken: exists and is not a row store"), std::string::npos) << refused(o);
  EXPECT_TRUE(fs::exists(tmp.file("taken/notes.txt")));
  o.out = tmp.file("rows");
  EXPECT_NE(refused(o).find("no-tokenizer-here"), std::string::npos)
      << refused(o);  // now it reads the tokenizer
}

TEST(Progress, WritesPlainLinesWithRateAndEta) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  Progress progress("tokenizing", 2e6, "MB", ProgressStyle::lines, out, /*line_interval_s=*/0);
  progress.update(1e6);
  progress.finish(2e6);
  std::rewind(out);
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, out);
  std::fclose(out);
  const std::string text(buf, n);
  EXPECT_NE(text.find("loom: tokenizing 50% (1.0 of 2.0 MB), "), std::string::npos) << text;
  EXPECT_NE(text.find(" MB/s, ETA 0:"), std::string::npos) << text;
  EXPECT_NE(text.find("\nloom: tokenizing done: 2.0 MB in "), std::string::npos) << text;
  EXPECT_EQ(text.find('\r'), std::string::npos);
}

TEST(Progress, DrawsABarInPlace) {
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  Progress progress("packing", 10, "conversations", ProgressStyle::bar, out);
  progress.update(5);
  std::rewind(out);
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof buf - 1, out);
  std::fclose(out);
  const std::string text(buf, n);
  EXPECT_EQ(text.rfind("\rpacking [###############...............] 50% (5 of 10 conversations)", 0), 0u)
      << text;
}

// The usable conversations of the fixture, tokenized one by one.
std::vector<TokenizedConversation> fixture_conversations() {
  const Qwen3LossMask masker(qwen3());
  std::vector<TokenizedConversation> out;
  std::istringstream in(test::read_file(kFixture));
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ParsedConversation parsed = chat_parse_line(line);
    if (parsed.problem == ChatProblem::none) out.push_back(masker.tokenize(parsed.conversation));
  }
  return out;
}

// Every sample of an isolated store is one whole conversation (never split, never joined
// with another), each conversation at most once, and the boundaries come back from the store.
TEST(DataBuild, IsolatedPackingNeverSplitsAConversation) {
  const test::TempDir tmp("build-isolated");
  DataBuildOptions o = options(tmp.file("rows"), 128);
  o.packing = RowPacking::isolated;
  const ojson m = build(o);
  EXPECT_EQ(m["format"], "loom-rows-2");
  EXPECT_EQ(m["packing"], "isolated");
  const std::vector<TokenizedConversation> conversations = fixture_conversations();
  ASSERT_EQ(conversations.size(), 30u);
  int64_t longer = 0;
  for (const TokenizedConversation& c : conversations) longer += c.tokens.size() > 128 ? 1 : 0;
  EXPECT_EQ(m["too_long_dropped"], longer);
  EXPECT_EQ(m["too_long_truncated"], 0);
  const RowStore store = RowStore::open(tmp.file("rows"));
  ASSERT_TRUE(store.isolated());
  std::vector<bool> seen(conversations.size(), false);
  int64_t samples = 0, padding = 0;
  for (int64_t r = 0; r < store.rows(); ++r) {
    const std::span<const int32_t> b = store.row_bounds(r);
    for (size_t k = 0; k + 1 < b.size(); ++k) {
      const std::vector<int32_t> tokens(store.row_tokens_ptr(r) + b[k], store.row_tokens_ptr(r) + b[k + 1]);
      const std::vector<uint8_t> mask(store.row_mask_ptr(r) + b[k], store.row_mask_ptr(r) + b[k + 1]);
      bool found = false;
      for (size_t c = 0; c < conversations.size() && !found; ++c)
        if (!seen[c] && conversations[c].tokens == tokens && conversations[c].loss_mask == mask)
          seen[c] = found = true;
      EXPECT_TRUE(found) << "row " << r << " sample " << k << " is not a whole conversation";
      ++samples;
    }
    for (int64_t t = b.back(); t < 128; ++t) {
      EXPECT_EQ(store.row_mask_ptr(r)[t], 0);
      EXPECT_EQ(store.row_tokens_ptr(r)[t], 151645);  // padded with the EOS
      ++padding;
    }
  }
  EXPECT_EQ(samples + longer, 30);  // every conversation that fits has a row
  EXPECT_EQ(m["padding_tokens"], padding);
  // Reproducible: the same options give the same rows.
  o.out = tmp.file("again");
  o.threads = 1;
  EXPECT_EQ(build(o)["rows_sha256"], m["rows_sha256"]);
  // --too-long truncate keeps the long ones, cut to a row.
  o.out = tmp.file("truncated");
  o.too_long = TooLong::truncate;
  const ojson t = build(o);
  EXPECT_EQ(t["too_long_dropped"], 0);
  EXPECT_EQ(t["too_long_truncated"], longer);
}

TEST(DataBuild, EvalFractionSetsAsideWholeConversations) {
  const test::TempDir tmp("build-eval");
  for (RowPacking packing : {RowPacking::rows, RowPacking::isolated}) {
    DataBuildOptions o = options(tmp.file("rows"), 64);
    o.packing = packing;
    o.too_long = TooLong::truncate;
    o.eval_fraction = 0.2;
    const ojson m = build(o);
    const RowStore eval = RowStore::open(tmp.file("rows-eval"));
    EXPECT_EQ(m["eval_store"]["path"], tmp.file("rows-eval"));
    EXPECT_EQ(m["eval_store"]["rows"], eval.rows());
    EXPECT_EQ(m["conversations"].get<int64_t>() + eval.manifest()["conversations"].get<int64_t>(), 30);
    EXPECT_EQ(eval.manifest()["conversations"], 6);  // round(0.2 · 30)
    EXPECT_EQ(eval.manifest()["part"], "eval");
    EXPECT_EQ(m["part"], "train");
    EXPECT_EQ(m["conversation_tokens"].get<int64_t>() + eval.manifest()["conversation_tokens"].get<int64_t>(),
              1564);
  }
  DataBuildOptions o = options(tmp.file("bad"));
  o.eval_fraction = 1.0;
  EXPECT_NE(refusal(o).find("--eval-fraction"), std::string::npos) << refusal(o);
}

// Each input format, as JSONL and as Parquet, gives the rows of the same conversations in the
// messages format, mapped independently by make_format_fixtures.py; auto detects it.
TEST(DataBuild, EachFormatInJsonlAndParquetGivesTheRowsOfItsMessages) {
  const test::TempDir tmp("build-formats");
  const bool parquet = parquet_input_supported();
  for (const std::string name :
       {"sharegpt", "alpaca", "prompt_completion", "prompt_completion_conversational", "messages"}) {
    const std::string format = name.starts_with("prompt_completion") ? "prompt_completion" : name;
    for (const std::string chat : {"qwen3", "qwen2.5"}) {
      SCOPED_TRACE(name + " " + chat);
      auto built = [&](const std::string& file, const std::string& given) {
        DataBuildOptions o = options(tmp.file(name + "-" + chat + "-" + given), 16, 7);
        o.inputs = {"data/formats/" + file};
        o.format = given;
        o.chat_format = chat;
        o.loss_mask = chat == "qwen3" ? "qwen3" : "assistant";
        o.strict = true;
        return build(o);
      };
      const ojson expected = built(name + ".messages.jsonl", "messages");
      const ojson jsonl = built(name + ".jsonl", "auto");
      EXPECT_EQ(jsonl["inputs"][0]["format"], format);
      EXPECT_EQ(jsonl["rows_sha256"], expected["rows_sha256"]);
      EXPECT_EQ(jsonl["conversations"], expected["conversations"]);
      EXPECT_EQ(jsonl["skipped_conversations"], 0);
      EXPECT_EQ(built(name + ".jsonl", format)["rows_sha256"], expected["rows_sha256"]);
      if (!parquet) continue;
      const ojson pq = built(name + ".parquet", "auto");
      EXPECT_EQ(pq["inputs"][0]["format"], format);
      EXPECT_EQ(pq["inputs"][0]["rows"], expected["input_lines"]);
      EXPECT_EQ(pq["rows_sha256"], expected["rows_sha256"]);
      EXPECT_EQ(pq["input_sha256"], sha256_file("data/formats/" + name + ".parquet"));
    }
  }
  if (!parquet)
    std::printf("DataBuild: Parquet not checked: this build has no Apache Arrow (scripts/setup.sh)\n");
}

// A record that is not of its file's format is skipped as malformed_json (or stops --strict),
// naming the format; one whose fields are of the wrong kind under the kind it would have in
// the messages format.
TEST(DataBuild, CountsRecordsNotOfTheFormat) {
  const test::TempDir tmp("build-format-mismatch");
  test::write_file(
      tmp.file("mixed.jsonl"),
      "not json\n"
      "{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, {\"from\": \"gpt\", \"value\": "
      "\"hello there, how are you\"}]}\n"
      "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n"
      "{\"conversations\": [{\"from\": \"robot\", \"value\": \"beep\"}]}\n"
      "{\"conversations\": [{\"from\": \"gpt\", \"value\": 5}]}\n"
      "{\"conversations\": [{\"from\": \"function_call\", \"value\": \"{oops\"}]}\n"
      "{\"conversations\": []}\n");
  DataBuildOptions o = options(tmp.file("rows"), 8, 1);
  o.inputs = {tmp.file("mixed.jsonl")};
  const ojson m = build(o);
  EXPECT_EQ(m["inputs"][0]["format"], "sharegpt");
  EXPECT_EQ(m["conversations"], 1);
  const ojson& skipped = m["skipped"];
  EXPECT_EQ(skipped["malformed_json"]["first_lines"], (ojson{1, 3}));
  EXPECT_NE(skipped["malformed_json"]["count"], 0);
  EXPECT_EQ(skipped["unknown_role"]["first_lines"], (ojson{4}));
  EXPECT_NE(
      skipped["unknown_role"]["first_detail"].get<std::string>().find("conversations[0].from is \"robot\""),
      std::string::npos);
  EXPECT_EQ(skipped["non_string_content"]["first_lines"], (ojson{5}));
  EXPECT_EQ(skipped["bad_tool_call"]["first_lines"], (ojson{6}));
  EXPECT_EQ(skipped["empty_conversation"]["first_lines"], (ojson{7}));
  o.strict = true;
  const std::string why = refusal(o);
  EXPECT_NE(why.find("mixed.jsonl:1: malformed_json"), std::string::npos) << why;
  test::write_file(tmp.file("first.jsonl"), "\n{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n");
  o.inputs = {tmp.file("first.jsonl")};
  o.format = "sharegpt";
  EXPECT_NE(refusal(o).find("first.jsonl:2: malformed_json: expected an object with a \"conversations\""),
            std::string::npos)
      << refusal(o);
}

// Every format's lines are parsed as the messages format's are: a key written twice or a
// number too large for a double is a malformed line (once an escaped exception, exit 3).
TEST(DataBuild, AnyFormatsLineWithAKeyTwiceOrAnOverflowingNumberIsMalformed) {
  const test::TempDir tmp("build-format-strict");
  test::write_file(tmp.file("share.jsonl"),
                   "{\"conversations\": [{\"from\": \"human\", \"value\": \"hi\"}, "
                   "{\"from\": \"gpt\", \"value\": \"yo\"}]}\n"
                   "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\", \"value\": \"b\"}]}\n"
                   "{\"conversations\": [{\"from\": \"human\", \"value\": \"a\"}], \"n\": 1e999}\n");
  DataBuildOptions o = options(tmp.file("rows"), 8, 1);
  o.inputs = {tmp.file("share.jsonl")};
  const ojson m = build(o);
  EXPECT_EQ(m["inputs"][0]["format"], "sharegpt");
  EXPECT_EQ(m["conversations"], 1);
  EXPECT_EQ(m["skipped"]["malformed_json"]["first_lines"], (ojson{2, 3}));
}

// What stops the build before any work: an unknown --format, a file whose first record
// matches no format (file and line), a Parquet file Arrow cannot read (the file).
TEST(DataBuild, RefusesAnUnknownFormatAndUndetectableOrCorruptInput) {
  const test::TempDir tmp("build-format-refusals");
  DataBuildOptions o = options(tmp.file("rows"));
  o.format = "csv";
  EXPECT_NE(refusal(o).find("--format: \"csv\", expected auto, messages, sharegpt"), std::string::npos)
      << refusal(o);
  o.format = "auto";
  test::write_file(tmp.file("odd.jsonl"), "\nnot json\n{\"question\": \"q\", \"answer\": \"a\"}\n");
  o.inputs = {tmp.file("odd.jsonl")};
  EXPECT_NE(
      refusal(o).find("odd.jsonl:3: the first record's keys (\"question\", \"answer\") match no format"),
      std::string::npos)
      << refusal(o);
  test::write_file(tmp.file("none.jsonl"), "[1]\nnot json\n");
  o.inputs = {tmp.file("none.jsonl")};
  EXPECT_NE(refusal(o).find("none.jsonl: no line is a JSON object"), std::string::npos) << refusal(o);
  test::write_file(tmp.file("corrupt.parquet"), "PAR1 this is not a parquet file PAR1");
  o.inputs = {tmp.file("corrupt.parquet")};
  const std::string corrupt = refusal(o);
  EXPECT_NE(corrupt.find("corrupt.parquet: "), std::string::npos) << corrupt;
  if (parquet_input_supported()) {
    EXPECT_NE(corrupt.find("cannot read it as Parquet"), std::string::npos) << corrupt;
    // A real file cut short: its footer is gone.
    const std::string whole = test::read_file("data/formats/sharegpt.parquet");
    test::write_file(tmp.file("cut.parquet"), whole.substr(0, whole.size() / 2));
    o.inputs = {tmp.file("cut.parquet")};
    EXPECT_NE(refusal(o).find("cut.parquet: cannot read it as Parquet"), std::string::npos) << refusal(o);
    o.inputs = {"data/formats/binary_column.parquet"};
    EXPECT_NE(refusal(o).find("binary_column.parquet: column instruction: a column of type binary"),
              std::string::npos)
        << refusal(o);
    o.inputs = {"data/formats/sharegpt.parquet"};
    o.format = "alpaca";  // every row is then not of the format
    EXPECT_NE(refusal(o).find("no usable conversation in 5 lines (5 skipped)"), std::string::npos)
        << refusal(o);
  }
  EXPECT_FALSE(fs::exists(tmp.file("rows")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.scratch")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.tmp")));
  fs::create_directories(tmp.file("empty"));
  o.inputs = {tmp.file("empty")};
  EXPECT_NE(refusal(o).find("empty: a folder with no *.jsonl or *.parquet file"), std::string::npos)
      << refusal(o);
}

// Several inputs are one stream of conversations in their order: shards of a file (a folder,
// read in name order) give the file's rows, and a mix of formats and containers works.
TEST(DataBuild, ReadsSeveralInputsAndFoldersOfShardsInOrder) {
  const test::TempDir tmp("build-shards");
  const std::vector<std::string> lines = test::read_lines_gz(kFixture);
  fs::create_directories(tmp.file("shards"));
  std::string first, second;
  for (size_t i = 0; i < lines.size(); ++i) (i < 20 ? first : second) += lines[i] + "\n";
  // Named so that name order is not creation order.
  test::write_file(tmp.file("shards/part-10.jsonl"), second);
  test::write_file(tmp.file("shards/part-01.jsonl"), first);
  test::write_file(tmp.file("shards/notes.txt"), "not an input");
  DataBuildOptions o = options(tmp.file("rows"));
  o.inputs = {tmp.file("shards")};
  const ojson m = build(o);
  EXPECT_EQ(m["rows_sha256"], kSha64Seed1234);
  EXPECT_EQ(m["conversations"], 30);
  EXPECT_EQ(m["inputs"].size(), 2u);
  EXPECT_EQ(m["inputs"][0]["path"], tmp.file("shards") + "/part-01.jsonl");
  EXPECT_EQ(m["input_sha256"], sha256_file(kFixture));  // the inputs' bytes in order
  EXPECT_EQ(m["input_lines"], 38);
  // Skipped lines name their file when there are several.
  EXPECT_EQ(m["skipped"]["malformed_json"]["first_lines"][0], tmp.file("shards") + "/part-01.jsonl:3");
  o.inputs = {tmp.file("shards/part-01.jsonl"), tmp.file("shards/part-10.jsonl")};
  EXPECT_EQ(build(o)["rows_sha256"], kSha64Seed1234);
  o.inputs = {tmp.file("shards/part-10.jsonl"), tmp.file("shards/part-01.jsonl")};
  EXPECT_NE(build(o)["rows_sha256"], kSha64Seed1234);  // another order, other rows
  o.strict = true;  // the bad lines are all in part-01, read second now
  EXPECT_NE(refusal(o).find("part-01.jsonl:3: malformed_json"), std::string::npos) << refusal(o);
  if (parquet_input_supported()) {
    DataBuildOptions mixed = options(tmp.file("mixed"), 16, 7);
    mixed.inputs = {"data/formats/sharegpt.parquet", "data/formats/alpaca.jsonl"};
    const ojson mm = build(mixed);
    EXPECT_EQ(mm["conversations"], 9);
    EXPECT_EQ(mm["inputs"][0]["format"], "sharegpt");
    EXPECT_EQ(mm["inputs"][1]["format"], "alpaca");
  }
}

}  // namespace
}  // namespace loom
