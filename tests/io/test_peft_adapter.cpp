// PEFT adapter folders (io/peft_adapter.h): the fixture PEFT wrote (tests/golden/tiny_lora) read
// by the adapter table's names, written back and read again bit for bit, and the
// adapter_config.json fields loom cannot train refused with the field named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/hf_checkpoint.h"
#include "io/io_test_util.h"
#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "model/lora.h"
#include "support/temp_dir.h"

namespace loom {
namespace {

const std::string kCase = "golden/tiny_lora";

nlohmann::json fixture_config() {
  std::ifstream in(kCase + "/adapter_init/adapter_config.json");
  return nlohmann::json::parse(in);
}

// An adapter folder whose config is `config` (the fixture's weights beside it).
std::string folder_with(const test::TempDir& tmp, const nlohmann::json& config) {
  const std::string dir = tmp.file("adapter");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/adapter_config.json") << config.dump(2);
  return dir;
}

TEST(PeftAdapter, ReadsTheConfigPeftWrote) {
  const PeftAdapterConfig c = peft_adapter_read_config(kCase + "/adapter_init");
  EXPECT_EQ(c.lora.rank, 4);
  EXPECT_EQ(c.lora.alpha, 8.0);
  EXPECT_FALSE(c.lora.rslora);
  EXPECT_EQ(c.dropout, 0.0);
  for (bool targeted : c.lora.targets) EXPECT_TRUE(targeted);
  EXPECT_EQ(c.lora.scale(), 2.0f);
}

TEST(PeftAdapter, WritesWhatItReadsBitForBitUnderPeftsNames) {
  const ModelConfig config = hf_checkpoint_read_config(kCase + "/model");
  const PeftAdapterConfig c = peft_adapter_read_config(kCase + "/adapter_init");
  const ParamTable table = lora_table_build(config, c.lora);
  std::vector<float> values(static_cast<size_t>(table.total_numel));
  peft_adapter_open(kCase + "/adapter_init", table)->read(0, table.total_numel, values.data());

  test::TempDir tmp("peft");
  const std::string out = tmp.file("final");
  ArrayParamSource source(values.data(), table.total_numel);
  peft_adapter_save(out, c.lora, "Qwen/Qwen3-0.6B", table, source, DType::f32);
  const PeftAdapterConfig back = peft_adapter_read_config(out);
  EXPECT_EQ(back.lora.rank, c.lora.rank);
  EXPECT_EQ(back.lora.alpha, c.lora.alpha);
  EXPECT_EQ(back.lora.targets, c.lora.targets);
  EXPECT_EQ(back.base_model, "Qwen/Qwen3-0.6B");
  std::vector<float> again(values.size());
  peft_adapter_open(out, table)->read(0, table.total_numel, again.data());
  EXPECT_EQ(again, values);
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
  // The same tensor names as PEFT's own file.
  const SafetensorsFile ours = SafetensorsFile::open(out + "/adapter_model.safetensors");
  const SafetensorsFile peft = SafetensorsFile::open(kCase + "/adapter_init/adapter_model.safetensors");
  ASSERT_EQ(ours.entries().size(), peft.entries().size());
  for (const SafetensorsEntry& e : peft.entries()) EXPECT_NE(ours.find(e.name), nullptr) << e.name;
}

TEST(PeftAdapter, RefusesWhatLoomCannotTrainNamingTheField) {
  test::TempDir tmp("peft-bad");
  const auto with = [&](const char* key, const nlohmann::json& value) {
    nlohmann::json c = fixture_config();
    c[key] = value;
    return folder_with(tmp, c);
  };
  EXPECT_INPUT_ERROR(peft_adapter_read_config(with("r", 0)), "adapter_config.json", "r: found 0");
  EXPECT_INPUT_ERROR(peft_adapter_read_config(with("peft_type", "IA3")), "peft_type", "\"LORA\"");
  EXPECT_INPUT_ERROR(peft_adapter_read_config(with("target_modules", {"q_proj", "lm_head"})),
                     "target_modules");
  EXPECT_INPUT_ERROR(peft_adapter_read_config(with("use_dora", true)), "use_dora");
  EXPECT_INPUT_ERROR(peft_adapter_read_config(with("lora_dropout", 1.0)), "lora_dropout", "[0, 1)");
  EXPECT_INPUT_ERROR(peft_adapter_read_config(with("modules_to_save", {"lm_head"})), "modules_to_save");
  nlohmann::json no_alpha = fixture_config();
  no_alpha.erase("lora_alpha");
  EXPECT_INPUT_ERROR(peft_adapter_read_config(folder_with(tmp, no_alpha)), "lora_alpha: missing");
  EXPECT_INPUT_ERROR(peft_adapter_read_config(tmp.file("none")), "adapter_config.json", "cannot open");
}

TEST(PeftAdapter, RefusesWeightsOfAnotherRankOrTargets) {
  const ModelConfig config = hf_checkpoint_read_config(kCase + "/model");
  LoraConfig other = peft_adapter_read_config(kCase + "/adapter_init").lora;
  other.rank = 8;
  const ParamTable wider = lora_table_build(config, other);
  EXPECT_INPUT_ERROR(peft_adapter_open(kCase + "/adapter_init", wider), "adapter_model.safetensors",
                     "lora_A");
  LoraConfig fewer = peft_adapter_read_config(kCase + "/adapter_init").lora;
  fewer.targets[static_cast<size_t>(LoraTarget::o)] = false;
  const ParamTable partial = lora_table_build(config, fewer);
  EXPECT_INPUT_ERROR(peft_adapter_open(kCase + "/adapter_init", partial), "o_proj", "unexpected");
}

}  // namespace
}  // namespace loom
