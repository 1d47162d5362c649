// A bounded fuzz test of safetensors_parse_header: 20,000 mutations of valid files from a
// fixed seed, each of which must either parse to a self-consistent header or throw
// InputError. Run under the sanitizer build (LOOM_SANITIZE=ON), any out-of-bounds read or
// overflow the mutations provoke fails the test too.
#include <gtest/gtest.h>

#include <cctype>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace loom {
namespace {

using test::read_bytes;
using test::safetensors_bytes;
using test::TempDir;

constexpr int kIterations = 20000;

// Valid files to mutate: one from safetensors_write (metadata, padding, several dtypes) and
// one written by hand with a gap, an empty tensor and a scalar.
std::vector<std::string> seed_files() {
  TempDir dir;
  std::string path = dir.file("seed.safetensors");
  std::vector<float> f32(12, 0.5f);
  std::vector<int64_t> i64 = {1, 2};
  std::vector<int16_t> i16 = {3, 4, 5};
  safetensors_write(
      path,
      {{"model.embed_tokens.weight", DType::f32, Shape{3, 4}, f32.data(), DType::f32},
       {"model.layers.0.self_attn.q_proj.weight", DType::bf16, Shape{2, 3}, f32.data(), DType::f32},
       {"ids", DType::i64, Shape{2}, i64.data(), DType::i64},
       {"small", DType::i16, Shape{3}, i16.data(), DType::i16}},
      {{"format", "pt"}});
  std::string by_hand =
      safetensors_bytes(R"({"__metadata__":{"a":"b"},"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},)"
                        R"("e":{"dtype":"U8","shape":[0,5],"data_offsets":[16,16]},)"
                        R"("s":{"dtype":"I32","shape":[],"data_offsets":[24,28]},)"
                        R"("t":{"dtype":"U8","shape":[1,1,2],"data_offsets":[28,30]}})",
                        30);
  return {read_bytes(path), by_hand};
}

uint64_t header_length(const std::string& file) {
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return n;
}

// Rebuilds a file from a changed header text, keeping the data section.
std::string with_header(const std::string& file, const std::string& header) {
  uint64_t n = header_length(file);
  std::string out(8, '\0');
  uint64_t m = header.size();
  std::memcpy(out.data(), &m, 8);
  return out + header + file.substr(8 + n);
}

std::string mutate(const std::string& file, std::mt19937_64& rng) {
  auto pick = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  std::string out = file;
  const uint64_t n = header_length(file);
  std::string header = file.substr(8, n);
  switch (rng() % 8) {
    case 0: {  // bit flips anywhere, the length prefix included
      for (uint64_t k = 1 + pick(4); k > 0; --k) out[pick(out.size())] ^= static_cast<char>(1u << pick(8));
      return out;
    }
    case 1:  // truncation
      return out.substr(0, pick(out.size()));
    case 2: {  // a span of the header spliced in elsewhere
      size_t a = pick(header.size()), b = a + pick(header.size() - a + 1);
      header.insert(pick(header.size() + 1), header.substr(a, b - a));
      return rng() % 2 ? with_header(file, header) : out.replace(8, n, header);
    }
    case 3: {  // a run of digits (an offset or a dim) replaced by 1 to 21 random digits
      std::vector<size_t> starts;
      for (size_t i = 0; i < header.size(); ++i)
        if (std::isdigit(static_cast<unsigned char>(header[i])) &&
            (i == 0 || !std::isdigit(static_cast<unsigned char>(header[i - 1]))))
          starts.push_back(i);
      if (starts.empty()) return out;
      size_t s = starts[pick(starts.size())], e = s;
      while (e < header.size() && std::isdigit(static_cast<unsigned char>(header[e]))) ++e;
      std::string digits;
      for (uint64_t k = 1 + pick(21); k > 0; --k) digits += static_cast<char>('0' + pick(10));
      header.replace(s, e - s, digits);
      return with_header(file, header);
    }
    case 4: {  // a wrong length prefix: near the right one, or anything
      uint64_t m = rng() % 2 ? n + pick(33) - 16 : rng();
      std::memcpy(out.data(), &m, 8);
      return out;
    }
    case 5: {  // a span of the header deleted
      size_t a = pick(header.size());
      header.erase(a, pick(header.size() - a + 1));
      return with_header(file, header);
    }
    case 6: {  // JSON punctuation inserted
      static const std::string kAlphabet = "{}[]\",:0123456789-.e \\";
      header.insert(pick(header.size() + 1), 1, kAlphabet[pick(kAlphabet.size())]);
      return with_header(file, header);
    }
    default: {  // the data section changed: must still parse
      if (out.size() > 8 + n) out[8 + n + pick(out.size() - 8 - n)] ^= static_cast<char>(1u << pick(8));
      return out;
    }
  }
}

// The promises of a parsed header, checked from scratch.
void check_consistent(const SafetensorsHeader& h, const std::string& file) {
  ASSERT_EQ(h.data_offset, 8 + header_length(file));
  ASSERT_EQ(h.data_offset + h.data_size, file.size());
  std::set<std::string> names;
  uint64_t furthest = 0, max_end = 0, previous_begin = 0;
  for (const SafetensorsEntry& e : h.entries) {
    ASSERT_TRUE(names.insert(e.name).second) << e.name;
    ASSERT_NE(e.name, "__metadata__");
    ASSERT_LE(e.begin, e.end);
    ASSERT_LE(e.end, h.data_size);
    ASSERT_GE(e.begin, previous_begin) << "entries not in data order";
    previous_begin = e.begin;
    ASSERT_EQ(e.nbytes(), static_cast<uint64_t>(e.numel()) * dtype_size(e.dtype)) << e.name;
    if (e.begin < e.end) {
      ASSERT_GE(e.begin, furthest) << e.name << " overlaps";
      furthest = e.end;
    }
    max_end = std::max(max_end, e.end);
  }
  ASSERT_EQ(max_end, h.data_size);
}

TEST(SafetensorsFuzz, MutatedHeadersParseConsistentlyOrThrowInputError) {
  const std::vector<std::string> seeds = seed_files();
  for (const std::string& s : seeds)
    check_consistent(safetensors_parse_header(reinterpret_cast<const uint8_t*>(s.data()), s.size(), "seed"),
                     s);
  std::mt19937_64 rng(0x5afe7e45);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < kIterations; ++i) {
    const std::string input = mutate(seeds[static_cast<size_t>(i) % seeds.size()], rng);
    // An exact-size heap copy, so that the sanitizer sees any read past the end.
    std::vector<uint8_t> bytes(input.begin(), input.end());
    try {
      SafetensorsHeader h = safetensors_parse_header(bytes.data(), bytes.size(), "fuzz.safetensors");
      check_consistent(h, input);
      ++accepted;
    } catch (const InputError& e) {
      ASSERT_EQ(std::string(e.what()).rfind("fuzz.safetensors: ", 0), 0u) << e.what();
      ++rejected;
    } catch (const std::exception& e) {
      FAIL() << "iteration " << i << ": " << e.what();
    }
    if (HasFatalFailure()) FAIL() << "iteration " << i;
  }
  RecordProperty("accepted", accepted);
  RecordProperty("rejected", rejected);
  // Both outcomes must be common, or the mutations test nothing.
  EXPECT_GT(accepted, kIterations / 20);
  EXPECT_GT(rejected, kIterations / 2);
}

}  // namespace
}  // namespace loom
