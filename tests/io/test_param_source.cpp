// Parameters piece by piece (io/param_source.h): any flat range of random init and of an HF
// checkpoint equals those elements of the whole buffer bit for bit, and hf_checkpoint_save
// from a source writes the bytes of the whole-array save.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "io/hf_checkpoint.h"
#include "io/init.h"
#include "io/param_source.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// GQA, head_dim != hidden / heads, and (with `vocab` > 4 Mi / hidden) an embedding larger
// than one piece of hf_checkpoint_save.
ModelConfig config_of(bool tied, int64_t vocab = 96) {
  ModelConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 12;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  return c;
}

// Ranges that cover [0, n) in a random order: random sizes 0 .. 3,000 (tensors here hold
// 12 .. 3,072 elements, so most ranges cross a boundary), plus one straddling every HF
// tensor's start and the single elements at both ends.
std::vector<std::pair<int64_t, int64_t>> ranges_of(const ParamTable& table, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> size(0, 3000);
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t n = table.total_numel;
  for (int64_t begin = 0; begin < n;) {
    const int64_t count = std::min(size(rng), n - begin);
    out.push_back({begin, count});
    begin += count;
  }
  const HfTensorRanges tensors(table);
  for (size_t i = 0; i < table.hf_tensors.size(); ++i) {
    const int64_t at = tensors.offset(i);
    const int64_t begin = std::max<int64_t>(0, at - 5);
    out.push_back({begin, std::min<int64_t>(n, at + 7) - begin});
  }
  out.push_back({0, 1});
  out.push_back({n - 1, 1});
  out.push_back({n, 0});
  std::shuffle(out.begin(), out.end(), rng);
  return out;
}

// Every range of `source` against the same elements of `whole`, bitwise.
void expect_ranges_match(ParamSource& source, const std::vector<float>& whole, const ParamTable& table,
                         const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(whole.size()), table.total_numel);
  std::vector<float> got;
  for (const auto& [begin, count] : ranges_of(table, 17)) {
    got.assign(static_cast<size_t>(count) + 1, NAN);
    source.read(begin, count, got.data());
    ASSERT_EQ(std::memcmp(got.data(), whole.data() + begin, static_cast<size_t>(count) * 4), 0)
        << what << ": range [" << begin << ", " << begin + count << ") differs from the whole buffer";
    ASSERT_TRUE(std::isnan(got[static_cast<size_t>(count)])) << what << ": wrote past the range";
  }
}

TEST(HfTensorRanges, PiecesTileARangeInOrder) {
  for (bool tied : {false, true}) {
    const ParamTable table = param_table_build(config_of(tied));
    const HfTensorRanges tensors(table);
    for (const auto& [begin, count] : ranges_of(table, 3)) {
      int64_t at = 0;
      for (const HfTensorRanges::Piece& p : tensors.pieces(begin, count)) {
        EXPECT_EQ(p.at, at);
        EXPECT_GT(p.count, 0);
        EXPECT_EQ(tensors.offset(p.tensor) + p.first, begin + at) << table.hf_tensors[p.tensor].hf_name;
        EXPECT_LE(p.first + p.count, table.hf_tensors[p.tensor].shape.numel());
        at += p.count;
      }
      EXPECT_EQ(at, count) << "range [" << begin << ", +" << count << ")";
    }
  }
}

TEST(RandomInitSource, AnyRangeEqualsTheWholeBufferBitwise) {
  for (bool tied : {false, true}) {
    const ModelConfig config = config_of(tied);
    const ParamTable table = param_table_build(config);
    std::vector<float> whole(static_cast<size_t>(table.total_numel), NAN);
    init_random_params(config, table, 1234, whole.data());
    // The whole buffer against the documented generator, so that the ranges are checked
    // against values of their own.
    const HfTensorSpec& k = *table.find_hf("model.layers.1.self_attn.k_proj.weight");
    const int64_t k_at = HfTensorRanges(table).offset(static_cast<size_t>(&k - table.hf_tensors.data()));
    EXPECT_EQ(whole[static_cast<size_t>(k_at + 5)],
              static_cast<float>(kInitializerRange * init_standard_normal(1234, k.hf_name, 5)));
    RandomInitSource source(config, table, 1234);
    expect_ranges_match(source, whole, table, tied ? "random init, tied" : "random init, untied");
  }
}

// The folder transformers may write for a tied model: config.json and one file that keeps
// lm_head.weight, a copy of the embedding.
void save_with_tied_lm_head(const std::string& dir, const ModelConfig& config, const ParamTable& table,
                            const std::vector<float>& weights) {
  const HfTensorRanges tensors(table);
  std::vector<SafetensorsTensor> stored;
  for (size_t i = 0; i < table.hf_tensors.size(); ++i) {
    const HfTensorSpec& spec = table.hf_tensors[i];
    stored.push_back({spec.hf_name, DType::bf16, spec.shape, weights.data() + tensors.offset(i), DType::f32});
  }
  SafetensorsTensor lm_head = stored.front();
  ASSERT_EQ(lm_head.name, "model.embed_tokens.weight");
  lm_head.name = "lm_head.weight";
  stored.push_back(lm_head);
  fs::create_directories(dir);
  test::write_bytes(dir + "/config.json", model_config_to_json(config).dump(2));
  safetensors_write(dir + "/model.safetensors", stored, {{"format", "pt"}});
}

// Checkpoints with every way of storing a tensor loom reads: f32 and bf16, one file and
// shards, a tied one that holds its lm_head; and the golden fixture transformers wrote.
TEST(HfCheckpointSource, AnyRangeEqualsTheWholeLoadBitwise) {
  TempDir tmp;
  struct Case {
    std::string name;
    bool tied;
    DType storage;
    int64_t shard_bytes;
  };
  for (const Case& c :
       {Case{"f32_single", false, DType::f32, 0}, Case{"bf16_sharded", false, DType::bf16, 5000},
        Case{"f32_sharded_tied", true, DType::f32, 9000}, Case{"bf16_tied_lm_head", true, DType::bf16, -1}}) {
    const ModelConfig config = config_of(c.tied);
    const ParamTable table = param_table_build(config);
    std::vector<float> weights(static_cast<size_t>(table.total_numel));
    init_random_params(config, table, 9, weights.data());
    const std::string dir = tmp.file(c.name);
    if (c.shard_bytes < 0)
      save_with_tied_lm_head(dir, config, table, weights);
    else
      hf_checkpoint_save(dir, config, table, weights.data(), c.storage, c.shard_bytes);
    std::vector<float> whole(weights.size(), NAN);
    hf_checkpoint_load_params(dir, config, table, whole.data());
    std::unique_ptr<ParamSource> source = hf_checkpoint_open_params(dir, config, table);
    expect_ranges_match(*source, whole, table, c.name);
  }
  const std::string golden = "golden/tiny_untied/model";
  const ModelConfig config = hf_checkpoint_read_config(golden);
  const ParamTable table = param_table_build(config);
  std::vector<float> whole(static_cast<size_t>(table.total_numel), NAN);
  hf_checkpoint_load_params(golden, config, table, whole.data());
  std::unique_ptr<ParamSource> source = hf_checkpoint_open_params(golden, config, table);
  expect_ranges_match(*source, whole, table, golden);
}

// A source over an array that records what it is asked for.
class RecordingSource final : public ParamSource {
 public:
  explicit RecordingSource(const std::vector<float>& data) : array_(data) {}
  void read(int64_t begin, int64_t count, float* dst) override {
    max_count = std::max(max_count, count);
    requested += count;
    array_.read(begin, count, dst);
  }
  int64_t max_count = 0;
  int64_t requested = 0;

 private:
  ArrayParamSource array_;
};

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void expect_same_folders(const std::string& got, const std::string& want, const std::string& what) {
  ASSERT_EQ(files_in(got), files_in(want)) << what;
  for (const std::string& name : files_in(want))
    EXPECT_TRUE(test::read_bytes(got + "/" + name) == test::read_bytes(want + "/" + name))
        << what << ": " << name << " differs";
}

// (storage, max_shard_bytes, tied)
class StreamedSave : public ::testing::TestWithParam<std::tuple<DType, int64_t, bool>> {};

TEST_P(StreamedSave, WritesTheBytesOfTheWholeArraySave) {
  const auto [storage, shard_bytes, tied] = GetParam();
  // Tied: 131,200 × 32 = 4.2 Mi elements of embedding, more than one piece.
  const ModelConfig config = config_of(tied, tied ? 131200 : 96);
  const ParamTable table = param_table_build(config);
  std::vector<float> params(static_cast<size_t>(table.total_numel));
  init_random_params(config, table, 4, params.data());
  for (size_t i = 0; i < params.size(); i += 7) params[i] = 1.0f + 0x1p-8f;  // a bf16 tie: rounds to even
  TempDir tmp;
  hf_checkpoint_save(tmp.file("whole"), config, table, params.data(), storage, shard_bytes);
  RecordingSource source(params);
  hf_checkpoint_save(tmp.file("streamed"), config, table, source, storage, shard_bytes);
  EXPECT_FALSE(fs::exists(tmp.file("streamed.tmp")));
  expect_same_folders(tmp.file("streamed"), tmp.file("whole"), "streamed vs whole-array save");
  EXPECT_EQ(source.requested, table.total_numel) << "each element read once";
  int64_t largest = 0;
  for (const HfTensorSpec& spec : table.hf_tensors) largest = std::max(largest, spec.shape.numel());
  EXPECT_EQ(source.max_count, std::min(largest, kSafetensorsPieceNumel))
      << "a tensor, or a piece of one, at a time";

  // Against safetensors_write of the tensors in place, as the whole-array save wrote them
  // before it streamed.
  if (shard_bytes != 0) return;
  const HfTensorRanges tensors(table);
  std::vector<SafetensorsTensor> in_place;
  for (size_t i = 0; i < table.hf_tensors.size(); ++i) {
    const HfTensorSpec& spec = table.hf_tensors[i];
    in_place.push_back({spec.hf_name, storage, spec.shape, params.data() + tensors.offset(i), DType::f32});
  }
  safetensors_write(tmp.file("in_place.safetensors"), in_place, {{"format", "pt"}});
  EXPECT_TRUE(test::read_bytes(tmp.file("streamed/model.safetensors")) ==
              test::read_bytes(tmp.file("in_place.safetensors")));
}

std::string streamed_name(const ::testing::TestParamInfo<StreamedSave::ParamType>& param_info) {
  const auto& [storage, shard_bytes, tied] = param_info.param;
  return std::string(storage == DType::f32 ? "f32" : "bf16") + (shard_bytes ? "_sharded" : "_single") +
         (tied ? "_tied" : "_untied");
}

INSTANTIATE_TEST_SUITE_P(StorageShardsTied, StreamedSave,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(int64_t{0}, int64_t{100000}),
                                            ::testing::Bool()),
                         streamed_name);

}  // namespace
}  // namespace loom
