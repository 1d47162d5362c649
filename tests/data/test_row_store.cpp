#include <gtest/gtest.h>

#include <filesystem>
#include <span>
#include <string>

#include "core/error.h"
#include "data/row_store.h"
#include "data/sha256.h"
#include "fixtures.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// Three rows of four tokens; kRowsSha256 is Python's
//   hashlib.sha256(b"".join(struct.pack("<4i", *t) + bytes(m) for t, m in rows)).hexdigest()
const std::vector<std::vector<int32_t>> kTokens = {{1, 2, 3, 4}, {151645, 7, 8, 9}, {100000, 0, 5, 6}};
const std::vector<std::vector<uint8_t>> kMasks = {{0, 1, 1, 0}, {0, 0, 1, 1}, {1, 1, 1, 1}};
constexpr const char* kRowsSha256 = "d112b743e09dd25dccb55b7092c1a01e6f97be3f1a963a4aff27438b37d4eb3a";

const ojson kTokenizerSha = {{"tokenizer.json", "aa"}, {"tokenizer_config.json", "bb"}};

ojson write_store(const std::string& dir) {
  RowStoreWriter writer(dir, 4);
  for (size_t r = 0; r < kTokens.size(); ++r) writer.append(kTokens[r].data(), kMasks[r].data());
  return writer.commit({{"seed", 7}, {"tokenizer_sha256", kTokenizerSha}});
}

// The InputError message of open(), or "" when it opens.
std::string refusal(const std::string& dir, const RowStoreExpect& expect = {}) {
  try {
    RowStore::open(dir, expect);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

RowStoreExpect expect_tokenizer(const ojson& sha) {
  RowStoreExpect e;
  e.tokenizer_sha256 = sha;
  return e;
}

void flip_byte(const std::string& path, size_t at, uint8_t value) {
  std::string bytes = test::read_file(path);
  bytes[at] = static_cast<char>(value);
  test::write_file(path, bytes);
}

TEST(Sha256, KnownAnswer) {
  Sha256 sha;
  sha.update("ab", 2);
  sha.update("c", 1);
  EXPECT_EQ(sha.hex_digest(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(RowStore, RoundTrips) {
  const test::TempDir tmp("rowstore-roundtrip");
  const std::string dir = tmp.file("rows");
  const ojson manifest = write_store(dir);
  EXPECT_EQ(manifest["rows_sha256"], kRowsSha256);
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  RowStoreExpect expect = expect_tokenizer(kTokenizerSha);
  expect.row_tokens = 4;
  expect.vocab_size = 151936;
  const RowStore store = RowStore::open(dir, expect);
  ASSERT_EQ(store.rows(), 3);
  ASSERT_EQ(store.row_tokens(), 4);
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(std::vector<int32_t>(store.row_tokens_ptr(r), store.row_tokens_ptr(r) + 4), kTokens[r]);
    EXPECT_EQ(std::vector<uint8_t>(store.row_mask_ptr(r), store.row_mask_ptr(r) + 4), kMasks[r]);
  }
  const ojson& m = store.manifest();
  EXPECT_EQ(m["format"], "loom-rows-1");
  EXPECT_EQ(m["rows"], 3);
  EXPECT_EQ(m["row_tokens"], 4);
  EXPECT_EQ(m["padding_tokens"], 0);
  EXPECT_DOUBLE_EQ(m["supervised_token_ratio"].get<double>(), 8.0 / 12.0);
  EXPECT_EQ(m["seed"], 7);
  // The files are the bytes docs/interface.md hashes, laid out row-major.
  EXPECT_EQ(fs::file_size(dir + "/tokens.bin"), 3u * 4u * 4u);
  EXPECT_EQ(fs::file_size(dir + "/loss_mask.bin"), 12u);
}

TEST(RowStore, ReplacesAnOlderStoreButNothingElse) {
  const test::TempDir tmp("rowstore-replace");
  write_store(tmp.file("rows"));
  write_store(tmp.file("rows"));
  EXPECT_EQ(RowStore::open(tmp.file("rows")).rows(), 3);
  EXPECT_FALSE(fs::exists(tmp.file("rows.old")));
  fs::create_directories(tmp.file("other"));
  test::write_file(tmp.file("other/keep.txt"), "mine");
  EXPECT_THROW(RowStoreWriter(tmp.file("other"), 4), InputError);
  EXPECT_TRUE(fs::exists(tmp.file("other/keep.txt")));
}

TEST(RowStore, AnUncommittedStoreLeavesNothing) {
  const test::TempDir tmp("rowstore-uncommitted");
  {
    RowStoreWriter writer(tmp.file("rows"), 4);
    writer.append(kTokens[0].data(), kMasks[0].data());
  }
  EXPECT_FALSE(fs::exists(tmp.file("rows")));
  EXPECT_FALSE(fs::exists(tmp.file("rows.tmp")));
  RowStoreWriter empty(tmp.file("rows"), 4);
  EXPECT_THROW(empty.commit({}), InputError);
}

TEST(RowStore, RefusesATruncatedTokensFile) {
  const test::TempDir tmp("rowstore-truncated");
  write_store(tmp.file("rows"));
  fs::resize_file(tmp.file("rows/tokens.bin"), 47);
  EXPECT_NE(refusal(tmp.file("rows")).find("tokens.bin: size check failed: 47 bytes"), std::string::npos)
      << refusal(tmp.file("rows"));
}

// A manifest number too large for a double (found by tests/fuzz) once escaped RowStore::open as
// nlohmann's out_of_range exception; a key written twice was read as its last value.
TEST(RowStore, RefusesAManifestWithANumberTooLargeOrAKeyTwice) {
  const test::TempDir tmp("rowstore-manifest-json");
  write_store(tmp.file("rows"));
  const std::string manifest = test::read_file(tmp.file("rows/manifest.json"));
  const size_t brace = manifest.find('{');
  test::write_file(tmp.file("rows/manifest.json"), "{\"padding\": 87e25628, " + manifest.substr(brace + 1));
  std::string why = refusal(tmp.file("rows"));
  EXPECT_NE(why.find("manifest.json: manifest check failed: not valid JSON"), std::string::npos) << why;
  test::write_file(tmp.file("rows/manifest.json"), "{\"rows\": 2, " + manifest.substr(brace + 1));
  why = refusal(tmp.file("rows"));
  EXPECT_NE(why.find("manifest check failed: found the key 'rows' a second time"), std::string::npos) << why;
}

TEST(RowStore, RefusesATruncatedMaskFile) {
  const test::TempDir tmp("rowstore-truncated-mask");
  write_store(tmp.file("rows"));
  fs::resize_file(tmp.file("rows/loss_mask.bin"), 11);
  EXPECT_NE(refusal(tmp.file("rows")).find("loss_mask.bin: size check failed"), std::string::npos);
}

TEST(RowStore, RefusesAFlippedTokenByte) {
  const test::TempDir tmp("rowstore-flipped");
  write_store(tmp.file("rows"));
  flip_byte(tmp.file("rows/tokens.bin"), 20, 0x55);  // row 1, token 1: 7 → 0x55
  const std::string why = refusal(tmp.file("rows"));
  EXPECT_NE(why.find("rows_sha256 check failed"), std::string::npos) << why;
  EXPECT_NE(why.find(kRowsSha256), std::string::npos) << why;
  // Unverified, the same store opens: the check is what refuses it.
  RowStoreExpect unverified;
  unverified.verify_rows_sha256 = false;
  EXPECT_EQ(refusal(tmp.file("rows"), unverified), "");
}

TEST(RowStore, RefusesAFlippedMaskByte) {
  const test::TempDir tmp("rowstore-flipped-mask");
  write_store(tmp.file("rows"));
  flip_byte(tmp.file("rows/loss_mask.bin"), 0, 1);
  EXPECT_NE(refusal(tmp.file("rows")).find("rows_sha256 check failed"), std::string::npos);
  flip_byte(tmp.file("rows/loss_mask.bin"), 0, 2);
  EXPECT_NE(refusal(tmp.file("rows")).find("mask check failed: row 0 position 0 is 2"), std::string::npos);
}

TEST(RowStore, RefusesAnotherTokenizer) {
  const test::TempDir tmp("rowstore-tokenizer");
  write_store(tmp.file("rows"));
  ojson run = kTokenizerSha;
  run["tokenizer_config.json"] = "cc";
  std::string why = refusal(tmp.file("rows"), expect_tokenizer(run));
  EXPECT_NE(
      why.find("tokenizer check failed: tokenizer_config.json has sha256 \"cc\" in the run's tokenizer, "
               "\"bb\" in the one the store was built with"),
      std::string::npos)
      << why;
  why = refusal(tmp.file("rows"), expect_tokenizer(ojson{{"tokenizer.json", "aa"}}));
  EXPECT_NE(why.find("tokenizer_config.json has sha256 absent"), std::string::npos) << why;
  EXPECT_EQ(refusal(tmp.file("rows"), expect_tokenizer(kTokenizerSha)), "");
}

TEST(RowStore, RefusesWhatTheRunDoesNotExpect) {
  const test::TempDir tmp("rowstore-expect");
  write_store(tmp.file("rows"));
  RowStoreExpect expect;
  expect.row_tokens = 8;
  EXPECT_NE(refusal(tmp.file("rows"), expect).find("row_tokens check failed"), std::string::npos);
  expect = {};
  expect.vocab_size = 151645;
  EXPECT_NE(refusal(tmp.file("rows"), expect).find("token check failed: row 1 position 0 is 151645"),
            std::string::npos);
}

TEST(RowStore, RefusesABadManifest) {
  const test::TempDir tmp("rowstore-manifest");
  EXPECT_NE(refusal(tmp.path()).find("not a row store"), std::string::npos);
  write_store(tmp.file("rows"));
  const std::string path = tmp.file("rows/manifest.json");
  ojson m = ojson::parse(test::read_file(path));
  m["format"] = "loom-rows-0";
  test::write_file(path, m.dump());
  EXPECT_NE(refusal(tmp.file("rows")).find("manifest check failed: field format is \"loom-rows-0\""),
            std::string::npos);
  m["format"] = "loom-rows-1";
  m["rows"] = 4;
  test::write_file(path, m.dump());
  EXPECT_NE(refusal(tmp.file("rows")).find("size check failed"), std::string::npos);
  m["rows"] = "3";
  test::write_file(path, m.dump());
  EXPECT_NE(refusal(tmp.file("rows")).find("manifest check failed: field rows"), std::string::npos);
  test::write_file(path, "{");
  EXPECT_NE(refusal(tmp.file("rows")).find("manifest check failed: not valid JSON"), std::string::npos);
}

// Isolated packing: the same three rows with sample boundaries, the last row's tail padding.
const std::vector<std::vector<int32_t>> kBounds = {{0, 2, 4}, {0, 4}, {0, 1, 3}};
const std::vector<std::vector<uint8_t>> kIsolatedMasks = {{0, 1, 1, 0}, {0, 0, 1, 1}, {1, 1, 1, 0}};

ojson write_isolated_store(const std::string& dir) {
  RowStoreWriter writer(dir, 4, RowPacking::isolated);
  for (size_t r = 0; r < kTokens.size(); ++r)
    writer.append(kTokens[r].data(), kIsolatedMasks[r].data(), kBounds[r]);
  return writer.commit({{"seed", 7}});
}

TEST(RowStore, IsolatedBoundariesRoundTrip) {
  const test::TempDir tmp("rowstore-isolated");
  const std::string dir = tmp.file("rows");
  const ojson manifest = write_isolated_store(dir);
  EXPECT_EQ(manifest["format"], "loom-rows-2");
  EXPECT_EQ(manifest["packing"], "isolated");
  EXPECT_EQ(manifest["padding_tokens"], 1);
  EXPECT_EQ(manifest["files"]["samples"], "samples.bin");
  // rows_sha256 covers the boundaries: tokens, mask, then n and b_0..b_n as int32 per row.
  Sha256 sha;
  for (size_t r = 0; r < kTokens.size(); ++r) {
    sha.update(kTokens[r].data(), 16);
    sha.update(kIsolatedMasks[r].data(), 4);
    const int32_t n = static_cast<int32_t>(kBounds[r].size()) - 1;
    sha.update(&n, 4);
    sha.update(kBounds[r].data(), kBounds[r].size() * 4);
  }
  EXPECT_EQ(manifest["rows_sha256"], sha.hex_digest());
  const RowStore store = RowStore::open(dir);
  ASSERT_TRUE(store.isolated());
  for (int64_t r = 0; r < 3; ++r) {
    const std::span<const int32_t> b = store.row_bounds(r);
    EXPECT_EQ(std::vector<int32_t>(b.begin(), b.end()), kBounds[static_cast<size_t>(r)]);
  }
  // Altered boundaries are refused: by the hash, and a record out of order by its own check.
  const std::string samples = dir + "/samples.bin";
  const std::string original = test::read_file(samples);
  flip_byte(samples, 8, 3);  // row 0: b_1 = 2 → 3
  EXPECT_NE(refusal(dir).find("rows_sha256 check failed"), std::string::npos) << refusal(dir);
  test::write_file(samples, original);
  flip_byte(samples, 8, 5);  // b_1 = 5 > row_tokens
  EXPECT_NE(refusal(dir).find("sample check failed: row 0 boundary 1"), std::string::npos) << refusal(dir);
  test::write_file(samples, original.substr(0, original.size() - 4));
  EXPECT_NE(refusal(dir).find("samples.bin"), std::string::npos) << refusal(dir);
  // A packing the format does not have.
  test::write_file(samples, original);
  ojson m = ojson::parse(test::read_file(dir + "/manifest.json"));
  m["packing"] = "rows";
  test::write_file(dir + "/manifest.json", m.dump());
  EXPECT_NE(refusal(dir).find("manifest check failed: field packing"), std::string::npos) << refusal(dir);
}

TEST(RowStore, RefusesLossOnPadding) {
  const test::TempDir tmp("rowstore-padding");
  const std::string dir = tmp.file("rows");
  write_isolated_store(dir);
  flip_byte(dir + "/loss_mask.bin", 11, 1);  // row 2's padding position 3
  EXPECT_NE(refusal(dir).find("row 2 position 3 is padding with loss mask 1"), std::string::npos)
      << refusal(dir);
}

}  // namespace
}  // namespace loom
