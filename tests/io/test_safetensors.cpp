#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "io/safetensors.h"
#include "io_test_util.h"

namespace loom {
namespace {

using test::read_bytes;
using test::safetensors_bytes;
using test::TempDir;
using test::write_bytes;

// Writes a raw file into `dir` and returns its path.
std::string write_raw(const TempDir& dir, const std::string& header, size_t data_bytes) {
  std::string path = dir.file("model.safetensors");
  write_bytes(path, safetensors_bytes(header, data_bytes));
  return path;
}

TEST(Safetensors, WriteThenOpenRoundTrips) {
  TempDir dir;
  std::vector<int64_t> i64 = {-7};
  std::vector<float> f32 = {1.5f, -2.25f, 3.0f, 0.0f, -0.0f, 1e-30f};
  std::vector<int32_t> i32 = {1, -2, 3, 2147483647};
  std::vector<float> to_bf16 = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -3.14159f, 65504.0f, 1e-3f};
  std::vector<float> empty;
  std::vector<uint8_t> u8 = {0, 128, 255};
  std::string path = dir.file("a.safetensors");
  safetensors_write(path,
                    {{"scalar", DType::i64, Shape{}, i64.data(), DType::i64},
                     {"w", DType::f32, Shape{2, 3}, f32.data(), DType::f32},
                     {"ids", DType::i32, Shape{4}, i32.data(), DType::i32},
                     {"empty", DType::f32, Shape{0, 4}, empty.data(), DType::f32},
                     {"half", DType::bf16, Shape{5}, to_bf16.data(), DType::f32},
                     {"bytes", DType::u8, Shape{1, 3}, u8.data(), DType::u8}},
                    {{"format", "pt"}, {"note", "a b"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "a b"}}));
  ASSERT_EQ(file.entries().size(), 6u);
  // Entries come in data order, which is the order written.
  std::vector<std::string> names;
  for (const SafetensorsEntry& e : file.entries()) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"scalar", "w", "ids", "empty", "half", "bytes"}));

  const SafetensorsEntry* w = file.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::f32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(w->begin, 8u);
  EXPECT_EQ(w->nbytes(), 24u);
  EXPECT_EQ(std::memcmp(file.bytes(*w), f32.data(), 24), 0);
  Tensor view = file.view(*w);
  EXPECT_EQ(view.shape, (Shape{2, 3}));
  EXPECT_EQ(view.dtype, DType::f32);
  EXPECT_EQ(view.as<float>()[4], -0.0f);

  const SafetensorsEntry* scalar = file.find("scalar");
  ASSERT_NE(scalar, nullptr);
  EXPECT_TRUE(scalar->shape.empty());
  EXPECT_EQ(scalar->numel(), 1);
  int64_t s = 0;
  std::memcpy(&s, file.bytes(*scalar), 8);
  EXPECT_EQ(s, -7);

  EXPECT_EQ(std::memcmp(file.bytes(*file.find("ids")), i32.data(), 16), 0);
  EXPECT_EQ(file.find("empty")->nbytes(), 0u);
  EXPECT_EQ(file.find("empty")->numel(), 0);
  EXPECT_EQ(std::memcmp(file.bytes(*file.find("bytes")), u8.data(), 3), 0);

  const SafetensorsEntry* half = file.find("half");
  ASSERT_NE(half, nullptr);
  EXPECT_EQ(half->dtype, DType::bf16);
  for (size_t i = 0; i < to_bf16.size(); ++i) {
    uint16_t bits = 0;
    std::memcpy(&bits, file.bytes(*half) + 2 * i, 2);
    EXPECT_EQ(bits, float_to_bf16(to_bf16[i]).bits) << i;
  }
  EXPECT_EQ(file.find("missing"), nullptr);
}

TEST(Safetensors, HeaderIsPaddedWithSpacesToEightBytes) {
  TempDir dir;
  std::string path = dir.file("p.safetensors");
  float value = 2.0f;
  // Names of several lengths, so that some header lengths need padding and the test does
  // not pass by luck of one length.
  for (const char* name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    safetensors_write(path, {{name, DType::f32, Shape{1}, &value, DType::f32}});
    std::string bytes = read_bytes(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    EXPECT_EQ(n % 8, 0u) << name;
    ASSERT_EQ(bytes.size(), 8 + n + 4);
    std::string header = bytes.substr(8, n);
    size_t close = header.rfind('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << header;
    EXPECT_LT(n - (close + 1), 8u);
  }
}

TEST(Safetensors, RewritingReplacesTheFile) {
  TempDir dir;
  std::string path = dir.file("r.safetensors");
  float a = 1.0f, b[2] = {2.0f, 3.0f};
  safetensors_write(path, {{"a", DType::f32, Shape{1}, &a, DType::f32}});
  safetensors_write(path, {{"b", DType::f32, Shape{2}, b, DType::f32}});
  SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.entries().size(), 1u);
  EXPECT_EQ(file.entries()[0].name, "b");
}

TEST(Safetensors, AcceptsGapsAndEmptyTensorsInsideOthers) {
  TempDir dir;
  // Bytes [8, 16) belong to no tensor; "e" is empty and sits inside "a" without sharing a byte.
  std::string path = write_raw(dir,
                               R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("b":{"dtype":"I16","shape":[4],"data_offsets":[16,24]},)"
                               R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                               24);
  SafetensorsFile file = SafetensorsFile::open(path);
  ASSERT_EQ(file.entries().size(), 3u);
  EXPECT_EQ(file.find("b")->begin, 16u);
  EXPECT_TRUE(file.metadata().empty());
  EXPECT_EQ(file.bytes(*file.find("b"))[0], 16);  // safetensors_bytes writes i % 251 at i
}

TEST(Safetensors, ReadsHeaderPaddedByTheReferenceWriter) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}      )", 3);
  SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.entries().size(), 1u);
}

TEST(SafetensorsErrors, MissingFile) {
  TempDir dir;
  std::string path = dir.file("absent.safetensors");
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "cannot open");
}

TEST(SafetensorsErrors, FileShorterThanTheLength) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  write_bytes(path, "");
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "0 bytes, too short");
  write_bytes(path, std::string(5, '\0'));
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "5 bytes, too short");
}

TEST(SafetensorsErrors, HeaderLengthPastTheEnd) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  std::string bytes = safetensors_bytes(R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", 3);
  uint64_t n = 1000;
  std::memcpy(bytes.data(), &n, 8);
  write_bytes(path, bytes);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "header length 1000 past the end of the file");
  n = ~uint64_t{0};  // 8 + n wraps around in careless arithmetic
  std::memcpy(bytes.data(), &n, 8);
  write_bytes(path, bytes);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "past the end of the file");
}

TEST(SafetensorsErrors, TruncatedData) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  float values[6] = {};
  safetensors_write(path, {{"a", DType::f32, Shape{2}, values, DType::f32},
                           {"b", DType::f32, Shape{4}, values, DType::f32}});
  std::string bytes = read_bytes(path);
  write_bytes(path, bytes.substr(0, bytes.size() - 3));
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "tensor 'b': data_offsets [8, 24] past the end of the data section (21 bytes)");
}

TEST(SafetensorsErrors, StrayBytesAfterTheLastTensor) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", 5);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "2 stray bytes");
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  TempDir dir;
  std::string path = write_raw(dir,
                               R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                               R"("far":{"dtype":"F32","shape":[2],"data_offsets":[100,108]}})",
                               8);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "tensor 'far': data_offsets [100, 108] past the end of the data section (8 bytes)");
  path = write_raw(dir, R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[9,8]}})", 8);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "tensor 'a': data_offsets [9, 8] end before they begin");
  path = write_raw(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "tensor 'a': data_offsets [-8,0] is not a list of two");
  path = write_raw(dir, R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}})", 8);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'a'", "not a list of two");
}

TEST(SafetensorsErrors, OverlappingOffsets) {
  TempDir dir;
  std::string path = write_raw(dir,
                               R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                               R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                               24);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "tensor 'b': data_offsets [8, 24] overlap tensor 'a' [0, 16]");
  // One tensor inside a longer one, listed before it by name.
  path = write_raw(dir,
                   R"({"big":{"dtype":"U8","shape":[32],"data_offsets":[0,32]},)"
                   R"("a":{"dtype":"U8","shape":[4],"data_offsets":[20,24]},)"
                   R"("z":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                   32);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "tensor 'z': data_offsets [4, 8] overlap tensor 'big' [0, 32]");
  // Two tensors at the same place.
  path = write_raw(dir,
                   R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                   R"("y":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                   4);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'y'", "overlap tensor 'x'");
}

TEST(SafetensorsErrors, SizeNotMatchingDtypeAndShape) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", 12);
  EXPECT_INPUT_ERROR(
      SafetensorsFile::open(path), path,
      "tensor 'w': data_offsets [0, 12] hold 12 bytes, but dtype F32 and shape [2, 2] need 16");
  path = write_raw(dir,
                   R"({"w":{"dtype":"BF16","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})", 8);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'w'", "more bytes than any file can hold");
}

TEST(SafetensorsErrors, BadDtype) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'w': dtype \"F16\" is not supported");
  path = write_raw(dir, R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,4]}})", 4);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'w': field 'dtype' is a JSON number");
}

TEST(SafetensorsErrors, BadShape) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"w":{"dtype":"U8","shape":[2,-1],"data_offsets":[0,2]}})", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "tensor 'w': shape [2,-1]: dim 1 is not a non-negative integer");
  path = write_raw(dir, R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,2]}})", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'w'", "dim 0 is not a non-negative integer");
  path = write_raw(dir, R"({"w":{"dtype":"U8","shape":2,"data_offsets":[0,2]}})", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "tensor 'w': field 'shape' is a JSON number, expected a list");
  path = write_raw(dir, R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,2]}})", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'w'", "not a non-negative integer");
}

TEST(SafetensorsErrors, BadEntry) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"w":[1,2]})", 0);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'w': is a JSON array, expected an object");
  path = write_raw(dir, R"({"w":{"shape":[2],"data_offsets":[0,2]}})", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'w': missing field 'dtype'");
  path = write_raw(dir, R"({"w":{"dtype":"U8","shape":[2]}})", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "tensor 'w': missing field 'data_offsets'");
}

TEST(SafetensorsErrors, BadJson) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "header is not valid JSON");
  path = write_raw(dir, R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}} trailing)", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "header is not valid JSON");
  path = write_raw(dir, "[1, 2]", 0);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "header does not start with '{'");
  path = write_raw(dir, " {}", 0);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "header does not start with '{'");
  path = write_raw(dir, "", 0);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "header does not start with '{'");
  path = write_raw(dir, std::string("{}\0garbage", 10), 0);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "NUL byte at file offset 10");
  path = write_raw(dir, "{\"w\xff\":1}", 0);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "header is not valid JSON");
}

TEST(SafetensorsErrors, DuplicateKeys) {
  TempDir dir;
  std::string path = write_raw(dir,
                               R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                               R"("w":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                               4);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "the key 'w' twice");
  path = write_raw(dir, R"({"w":{"dtype":"U8","dtype":"I32","shape":[2],"data_offsets":[0,2]}})", 2);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "the key 'dtype' twice");
}

TEST(SafetensorsErrors, BadMetadata) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"__metadata__":{"format":1}})", 0);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path,
                     "__metadata__ 'format' is a JSON number, expected a string");
  path = write_raw(dir, R"({"__metadata__":"pt"})", 0);
  EXPECT_INPUT_ERROR(SafetensorsFile::open(path), path, "__metadata__ is a JSON string, expected an object");
}

TEST(SafetensorsErrors, ViewOfTooManyDims) {
  TempDir dir;
  std::string path = write_raw(dir, R"({"w":{"dtype":"U8","shape":[1,1,1,1,2],"data_offsets":[0,2]}})", 2);
  SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_INPUT_ERROR(file.view(file.entries()[0]), path, "tensor 'w': shape [1, 1, 1, 1, 2] has 5 dims");
}

TEST(SafetensorsErrors, ParseHeaderNamesThePathItIsGiven) {
  std::string bytes = safetensors_bytes(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[0,3]}})", 3);
  EXPECT_INPUT_ERROR(safetensors_parse_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                              "shard-7.safetensors"),
                     "shard-7.safetensors: tensor 'w': data_offsets [0, 3] hold 3 bytes");
}

}  // namespace
}  // namespace loom
