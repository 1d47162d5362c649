#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "io/hf_checkpoint.h"
#include "io/safetensors.h"
#include "io_test_util.h"

namespace loom {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::TempDir;

// A Qwen3 small enough to write in milliseconds, with every kind of tensor: GQA (4 heads over
// 2 KV heads), head_dim 8 != hidden / heads.
ModelConfig tiny_config(bool tied) {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 24;
  c.intermediate_size = 40;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  return c;
}

// Values spread over many binades, with some that sit exactly between two bf16 values.
std::vector<float> random_params(const ParamTable& table, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<float> p(static_cast<size_t>(table.total_numel));
  for (size_t i = 0; i < p.size(); ++i) {
    uint32_t bits = static_cast<uint32_t>(rng());
    float v = std::ldexp(static_cast<float>(bits % 100000) / 100000.0f, static_cast<int>(bits % 13) - 8);
    if (i % 7 == 0) v = 1.0f + 0x1p-8f;  // a tie: rounds to even
    p[i] = (bits & 0x80000000u) ? -v : v;
  }
  return p;
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void write_json(const std::string& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// (storage, max_shard_bytes, tied)
class HfCheckpointRoundTrip : public ::testing::TestWithParam<std::tuple<DType, int64_t, bool>> {};

TEST_P(HfCheckpointRoundTrip, LoadGivesBackWhatWasSaved) {
  const auto [storage, shard_bytes, tied] = GetParam();
  const ModelConfig config = tiny_config(tied);
  const ParamTable table = param_table_build(config);
  const std::vector<float> params = random_params(table, 42);
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  hf_checkpoint_save(dir + "/", config, table, params.data(), storage, shard_bytes);
  EXPECT_FALSE(fs::exists(dir + ".tmp"));

  ModelConfig read = hf_checkpoint_read_config(dir);
  EXPECT_EQ(read.dtype, storage == DType::bf16 ? "bfloat16" : "float32");
  EXPECT_EQ(read.hidden_size, config.hidden_size);
  EXPECT_EQ(read.head_dim, config.head_dim);
  EXPECT_EQ(read.tie_word_embeddings, tied);
  EXPECT_EQ(read.eos_token_id, config.eos_token_id);
  EXPECT_EQ(read_json(dir + "/config.json").at("torch_dtype"), read.dtype);

  std::vector<float> loaded(params.size(), NAN);
  hf_checkpoint_load_params(dir, read, table, loaded.data());
  for (size_t i = 0; i < params.size(); ++i) {
    float want = storage == DType::bf16 ? bf16_to_float(float_to_bf16(params[i])) : params[i];
    ASSERT_EQ(std::memcmp(&loaded[i], &want, 4), 0) << "element " << i << ": " << loaded[i] << " vs " << want;
  }

  // The folder's layout: HF names, an index for shards, format "pt", no tied lm_head.
  std::vector<std::string> names = files_in(dir);
  std::vector<std::string> shards;
  for (const std::string& n : names)
    if (n.size() > 12 && n.substr(n.size() - 12) == ".safetensors") shards.push_back(n);
  int64_t total = 0;
  std::map<std::string, std::string> where;
  for (const std::string& shard : shards) {
    SafetensorsFile f = SafetensorsFile::open(dir + "/" + shard);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    for (const SafetensorsEntry& e : f.entries()) {
      EXPECT_EQ(e.dtype, storage) << e.name;
      total += static_cast<int64_t>(e.nbytes());
      where[e.name] = shard;
    }
    if (shard_bytes > 0 && f.entries().size() > 1) {
      int64_t bytes = 0;
      for (const SafetensorsEntry& e : f.entries()) bytes += static_cast<int64_t>(e.nbytes());
      EXPECT_LE(bytes, shard_bytes) << shard;
    }
  }
  EXPECT_EQ(where.count("lm_head.weight"), tied ? 0u : 1u);
  EXPECT_EQ(where.size(), table.hf_tensors.size());
  if (shard_bytes == 0) {
    EXPECT_EQ(names, (std::vector<std::string>{"config.json", "model.safetensors"}));
    return;
  }
  ASSERT_GT(shards.size(), 2u) << "the shard size should split this model";
  EXPECT_EQ(names.size(), shards.size() + 2);
  for (size_t i = 0; i < shards.size(); ++i) {
    char want[64];
    std::snprintf(want, sizeof want, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    EXPECT_EQ(shards[i], want);
  }
  json index = read_json(dir + "/model.safetensors.index.json");
  EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), total);
  const auto weight_map = index.at("weight_map").get<std::map<std::string, std::string>>();
  EXPECT_EQ(weight_map, where);
}

std::string round_trip_name(const ::testing::TestParamInfo<HfCheckpointRoundTrip::ParamType>& param_info) {
  const auto& [storage, shard_bytes, tied] = param_info.param;
  return std::string(storage == DType::f32 ? "f32" : "bf16") + (shard_bytes ? "_sharded" : "_single") +
         (tied ? "_tied" : "_untied");
}

INSTANTIATE_TEST_SUITE_P(StorageShardsTied, HfCheckpointRoundTrip,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(int64_t{0}, int64_t{6000}), ::testing::Bool()),
                         round_trip_name);

TEST(HfCheckpoint, SaveReplacesAnExistingFolder) {
  const ModelConfig config = tiny_config(false);
  const ParamTable table = param_table_build(config);
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  hf_checkpoint_save(dir, config, table, random_params(table, 1).data(), DType::f32, 6000);
  fs::create_directories(dir + ".tmp/leftover");  // a crashed earlier save
  const std::vector<float> second = random_params(table, 2);
  hf_checkpoint_save(dir, config, table, second.data(), DType::f32, 0);
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"config.json", "model.safetensors"}));
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  std::vector<float> loaded(second.size());
  hf_checkpoint_load_params(dir, config, table, loaded.data());
  EXPECT_EQ(loaded, second);
}

// A save that fails midway (here the weights' source throws, as a failing read of a GPU or a
// rank would) leaves no DIR.tmp behind (it once stayed beside output_dir's final/), and the
// previous checkpoint as it was.
TEST(HfCheckpoint, AFailedSaveLeavesNoTmpFolder) {
  const ModelConfig config = tiny_config(false);
  const ParamTable table = param_table_build(config);
  TempDir tmp;
  const std::string dir = tmp.file("final");
  const std::vector<float> first = random_params(table, 1);
  hf_checkpoint_save(dir, config, table, first.data(), DType::f32, 0);
  struct FailingSource final : ParamSource {
    void read(int64_t, int64_t, float*) override { throw_runtime_failure("a rank", "the read failed"); }
  } failing;
  EXPECT_THROW(hf_checkpoint_save(dir, config, table, failing, DType::f32, 0), RuntimeFailure);
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  std::vector<float> loaded(first.size());
  hf_checkpoint_load_params(dir, config, table, loaded.data());
  EXPECT_EQ(loaded, first);
}

// A checkpoint folder holding config.json and one model.safetensors of the given tensors.
class HfCheckpointErrors : public ::testing::Test {
 protected:
  void SetUp() override { use(false); }

  void use(bool tied, bool experts = false) {
    config = tiny_config(tied);
    if (experts) {  // a qwen3_moe: 4 experts of FFN 16, top 2, every layer sparse
      config.model_type = "qwen3_moe";
      config.num_experts = 4;
      config.num_experts_per_tok = 2;
      config.moe_intermediate_size = 16;
      config.decoder_sparse_step = 1;
    }
    table = param_table_build(config);
    params = random_params(table, 7);
    tensors.clear();
    for (const HfTensorSpec& spec : table.hf_tensors) {
      const ParamSpec& p = table.params[static_cast<size_t>(spec.param)];
      const float* src = params.data() + p.offset + spec.row_offset * (p.numel() / p.shape[0]);
      tensors.push_back({spec.hf_name, DType::f32, spec.shape, src, DType::f32});
    }
  }

  void write() {
    fs::create_directories(dir());
    write_json(dir() + "/config.json", model_config_to_json(config));
    safetensors_write(weights(), tensors, {{"format", "pt"}});
  }

  void load() {
    std::vector<float> out(static_cast<size_t>(table.total_numel));
    hf_checkpoint_load_params(dir(), hf_checkpoint_read_config(dir()), table, out.data());
  }

  SafetensorsTensor* tensor(const std::string& name) {
    for (SafetensorsTensor& t : tensors)
      if (t.name == name) return &t;
    ADD_FAILURE() << "no tensor " << name;
    return nullptr;
  }

  std::string dir() const { return tmp.file("ckpt"); }
  std::string weights() const { return dir() + "/model.safetensors"; }

  TempDir tmp;
  ModelConfig config;
  ParamTable table;
  std::vector<float> params;
  std::vector<SafetensorsTensor> tensors;
};

TEST_F(HfCheckpointErrors, WellFormedFolderLoads) {
  write();
  load();
}

TEST_F(HfCheckpointErrors, TensorMissing) {
  tensors.erase(tensors.begin() + 3);
  const std::string name = table.hf_tensors[3].hf_name;
  write();
  EXPECT_INPUT_ERROR(load(), weights(), "tensor '" + name + "' is missing (expected ");
}

// A mixture of experts' checkpoint under the Hub's per-expert names: whole, it loads; one
// expert's projection missing is named.
TEST_F(HfCheckpointErrors, MoeCheckpointMissingAnExpert) {
  use(false, true);
  write();
  load();
  const std::string name = "model.layers.1.mlp.experts.2.up_proj.weight";
  tensors.erase(std::find_if(tensors.begin(), tensors.end(),
                             [&](const SafetensorsTensor& t) { return t.name == name; }));
  write();
  EXPECT_INPUT_ERROR(load(), weights(), "tensor '" + name + "' is missing (expected ");
}

TEST_F(HfCheckpointErrors, UnexpectedTensor) {
  float extra[24] = {};
  tensors.push_back({"model.layers.2.input_layernorm.weight", DType::f32, Shape{24}, extra, DType::f32});
  write();
  EXPECT_INPUT_ERROR(load(), weights(), "tensor 'model.layers.2.input_layernorm.weight' is unexpected",
                     "2 layers");
}

TEST_F(HfCheckpointErrors, ShapeNotMatchingTheConfig) {
  SafetensorsTensor* k = tensor("model.layers.1.self_attn.k_proj.weight");
  k->shape = Shape{8, 24};  // config: 2 KV heads × head_dim 8 = 16 rows
  write();
  EXPECT_INPUT_ERROR(
      load(), weights(),
      "tensor 'model.layers.1.self_attn.k_proj.weight': expected [16, 24] from config.json, found [8, 24]");
  use(false);
  tensor("model.norm.weight")->shape = Shape{4, 6};
  write();
  EXPECT_INPUT_ERROR(load(), weights(),
                     "tensor 'model.norm.weight': expected [24] from config.json, found [4, 6]");
}

TEST_F(HfCheckpointErrors, DtypeNotAFloatType) {
  std::vector<int32_t> ints(24, 1);
  SafetensorsTensor* norm = tensor("model.layers.0.input_layernorm.weight");
  norm->dtype = norm->source = DType::i32;
  norm->data = ints.data();
  write();
  EXPECT_INPUT_ERROR(load(), weights(),
                     "tensor 'model.layers.0.input_layernorm.weight': dtype I32 is not a float type");
}

TEST_F(HfCheckpointErrors, StoredF64IsConverted) {
  std::vector<double> wide(24);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = 0.1 * static_cast<double>(i);
  SafetensorsTensor* norm = tensor("model.norm.weight");
  norm->dtype = norm->source = DType::f64;
  norm->data = wide.data();
  write();
  std::vector<float> out(static_cast<size_t>(table.total_numel));
  hf_checkpoint_load_params(dir(), config, table, out.data());
  const float* loaded =
      out.data() + table.params[static_cast<size_t>(table.find(ParamKind::final_norm))].offset;
  for (size_t i = 0; i < wide.size(); ++i) EXPECT_EQ(loaded[i], static_cast<float>(wide[i]));
}

TEST_F(HfCheckpointErrors, TiedCheckpointMayHoldAnEqualLmHead) {
  use(true);
  const SafetensorsTensor embed = *tensor("model.embed_tokens.weight");
  tensors.push_back({"lm_head.weight", DType::f32, embed.shape, embed.data, DType::f32});
  write();
  load();
  std::vector<float> other(static_cast<size_t>(embed.shape.numel()));
  std::memcpy(other.data(), embed.data, other.size() * 4);
  other[77] += 1.0f;
  tensors.back().data = other.data();
  write();
  EXPECT_INPUT_ERROR(load(), weights(), "tensor 'lm_head.weight' differs from model.embed_tokens.weight",
                     "element 77", "tie_word_embeddings: true");
  tensors.back().shape = Shape{32, 48};
  write();
  EXPECT_INPUT_ERROR(load(), weights(),
                     "tensor 'lm_head.weight': expected [64, 24] from config.json, found [32, 48]");
}

TEST_F(HfCheckpointErrors, UntiedCheckpointNeedsItsLmHead) {
  tensors.pop_back();
  ASSERT_EQ(table.hf_tensors.back().hf_name, "lm_head.weight");
  write();
  EXPECT_INPUT_ERROR(load(), weights(), "tensor 'lm_head.weight' is missing");
}

TEST_F(HfCheckpointErrors, NoWeightsInTheFolder) {
  fs::create_directories(dir());
  write_json(dir() + "/config.json", model_config_to_json(config));
  EXPECT_INPUT_ERROR(load(), dir(), "no model.safetensors or model.safetensors.index.json");
}

TEST_F(HfCheckpointErrors, CorruptWeightsFileNamesItself) {
  write();
  std::string bytes = test::read_bytes(weights());
  test::write_bytes(weights(), bytes.substr(0, bytes.size() / 2));
  EXPECT_INPUT_ERROR(load(), weights(), "past the end of the data section");
}

// A sharded checkpoint written by hf_checkpoint_save, then damaged.
class HfCheckpointShardErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    hf_checkpoint_save(dir(), config, table, params.data(), DType::bf16, 6000);
    index = read_json(index_path());
  }
  void load() {
    std::vector<float> out(static_cast<size_t>(table.total_numel));
    hf_checkpoint_load_params(dir(), config, table, out.data());
  }
  std::string dir() const { return tmp.file("sharded"); }
  std::string index_path() const { return dir() + "/model.safetensors.index.json"; }

  TempDir tmp;
  ModelConfig config = tiny_config(false);
  ParamTable table = param_table_build(config);
  std::vector<float> params = random_params(table, 3);
  json index;
};

TEST_F(HfCheckpointShardErrors, IndexNamingAMissingShard) {
  const std::string shard = index.at("weight_map").at("model.norm.weight");
  fs::remove(dir() + "/" + shard);
  EXPECT_INPUT_ERROR(load(), index_path(), "is mapped to shard '" + shard + "', which does not exist");
}

TEST_F(HfCheckpointShardErrors, IndexPointingAtTheWrongShard) {
  const std::string first = index.at("weight_map").at("model.embed_tokens.weight");
  const std::string last = index.at("weight_map").at("lm_head.weight");
  ASSERT_NE(first, last);
  index["weight_map"]["lm_head.weight"] = first;
  write_json(index_path(), index);
  EXPECT_INPUT_ERROR(load(), dir() + "/" + first,
                     "tensor 'lm_head.weight' is missing (model.safetensors.index.json maps it");
}

TEST_F(HfCheckpointShardErrors, ShardTensorLeftOutOfTheIndex) {
  index["weight_map"].erase("model.norm.weight");
  write_json(index_path(), index);
  EXPECT_INPUT_ERROR(load(), "tensor 'model.norm.weight' is not listed for this shard");
}

TEST_F(HfCheckpointShardErrors, IndexWithABadWeightMap) {
  index["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  write_json(index_path(), index);
  EXPECT_INPUT_ERROR(load(), index_path(),
                     "tensor 'model.norm.weight' is mapped to \"../elsewhere.safetensors\"");
  write_json(index_path(), json{{"metadata", json::object()}});
  EXPECT_INPUT_ERROR(load(), index_path(), "'weight_map'");
  test::write_bytes(index_path(), "{\"weight_map\": ");
  EXPECT_INPUT_ERROR(load(), index_path(), "not valid JSON");
}

// config.json defects, read through the checkpoint folder.
class HfCheckpointConfigErrors : public ::testing::Test {
 protected:
  void SetUp() override { fs::create_directories(tmp.path()); }
  std::string config_path() const { return tmp.file("config.json"); }
  void write_config(const json& j) { write_json(config_path(), j); }
  json good = model_config_to_json(tiny_config(false));
  TempDir tmp;
};

TEST_F(HfCheckpointConfigErrors, Missing) {
  EXPECT_INPUT_ERROR(hf_checkpoint_read_config(tmp.path()), config_path(), "cannot open");
}

TEST_F(HfCheckpointConfigErrors, MissingField) {
  good.erase("hidden_size");
  write_config(good);
  EXPECT_INPUT_ERROR(hf_checkpoint_read_config(tmp.path()), config_path(), "missing field 'hidden_size'");
}

TEST_F(HfCheckpointConfigErrors, MistypedField) {
  good["num_hidden_layers"] = "2";
  write_config(good);
  EXPECT_INPUT_ERROR(hf_checkpoint_read_config(tmp.path()), config_path(),
                     "field 'num_hidden_layers' is string, expected an integer");
}

TEST_F(HfCheckpointConfigErrors, UnsupportedModelType) {
  good["model_type"] = "gemma";
  write_config(good);
  EXPECT_INPUT_ERROR(hf_checkpoint_read_config(tmp.path()), config_path(),
                     "unsupported model_type \"gemma\"");
}

TEST_F(HfCheckpointConfigErrors, NotJson) {
  test::write_bytes(config_path(), "{\"model_type\": \"qwen3\",");
  EXPECT_INPUT_ERROR(hf_checkpoint_read_config(tmp.path()), config_path(), "not valid JSON");
}

}  // namespace
}  // namespace loom
