// Resume checkpoints (io/checkpoint.h): the state file is full tensors by parameter name,
// round-tripping bit for bit; a commit keeps the newest `keep` and removes what interrupted
// saves left; a failed background write is reported, naming the path, never lost.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/config.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("loom-checkpoint-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

ParamTable tiny_table() {
  return param_table_build(qwen3_config_load(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/config.json"));
}

TrainState patterned_state(const ParamTable& table) {
  TrainState state;
  for (std::vector<float>* v : {&state.master, &state.adam_m, &state.adam_v}) v->resize(table.total_numel);
  for (int64_t i = 0; i < table.total_numel; ++i) {
    state.master[i] = std::sin(static_cast<float>(i)) * 1e-3f;
    state.adam_m[i] = static_cast<float>(i) * 1e-7f;
    state.adam_v[i] = std::nextafter(static_cast<float>(i), 1e30f);
  }
  state.master[3] = NAN;  // any bit pattern survives
  return state;
}

TEST(Checkpoint, StateIsFullTensorsByParameterNameAndRoundTripsBitwise) {
  const fs::path dir = scratch("state");
  const ParamTable table = tiny_table();
  const TrainState saved = patterned_state(table);
  checkpoint_state_write((dir / "state.safetensors").string(), table, saved);

  SafetensorsFile file = SafetensorsFile::open((dir / "state.safetensors").string());
  ASSERT_EQ(file.entries().size(), 3 * table.params.size());
  for (const ParamSpec& p : table.params)
    for (const char* group : {"master/", "adam_m/", "adam_v/"}) {
      const SafetensorsEntry* e = file.find(group + p.name);
      ASSERT_NE(e, nullptr) << group << p.name;
      EXPECT_EQ(Shape(e->shape).numel(), p.numel());
      EXPECT_EQ(e->shape.size(), static_cast<size_t>(p.shape.ndim)) << "the parameter's own shape";
    }

  TrainState loaded;
  checkpoint_state_read((dir / "state.safetensors").string(), table, loaded);
  EXPECT_EQ(std::memcmp(loaded.master.data(), saved.master.data(), saved.master.size() * 4), 0);
  EXPECT_EQ(loaded.adam_m, saved.adam_m);
  EXPECT_EQ(loaded.adam_v, saved.adam_v);

  // Another model's table is refused, naming the tensor.
  Qwen3Config other = qwen3_config_load(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/config.json");
  other.intermediate_size *= 2;
  try {
    checkpoint_state_read((dir / "state.safetensors").string(), param_table_build(other), loaded);
    FAIL() << "read the state of another model";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'master/layers.0.gate_up'"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, CommitKeepsTheNewestAndRemovesIncompleteFolders) {
  const fs::path dir = scratch("keep");
  for (int64_t step : {2, 4}) {
    checkpoint_begin(dir.string(), step);
    checkpoint_commit(dir.string(), step, 2);
  }
  fs::create_directories(dir / "checkpoints" / "step-00000005");      // renamed, no COMMIT
  fs::create_directories(dir / "checkpoints" / "step-00000007.tmp");  // a save cut short
  fs::create_directories(dir / "checkpoints" / "notes");              // not loom's: left alone
  EXPECT_EQ(checkpoint_latest(dir.string())->step, 4);
  checkpoint_begin(dir.string(), 6);
  checkpoint_commit(dir.string(), 6, 2);
  std::set<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir / "checkpoints"))
    names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"notes", "step-00000004", "step-00000006"}));
  fs::remove_all(dir);
}

TEST(Checkpoint, AFailedBackgroundWriteIsReportedNamingThePath) {
  const fs::path dir = scratch("fail");
  const ParamTable table = tiny_table();
  std::ofstream(dir / "checkpoints") << "a file where the checkpoints folder goes";
  CheckpointWriter writer(dir.string(), table, 1);
  writer.next_state() = patterned_state(table);
  writer.write_async(2, {{"step", 2}});
  try {
    writer.wait();
    FAIL() << "the write into a file's path succeeded";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "checkpoints" / "step-00000002.tmp").string()),
              std::string::npos)
        << e.what();
  }
  writer.wait();  // reported once
  fs::remove(dir / "checkpoints");

  writer.next_state() = patterned_state(table);
  writer.write_async(4, {{"step", 4}});
  writer.wait();
  ASSERT_EQ(checkpoint_latest(dir.string())->step, 4);
  EXPECT_EQ(checkpoint_meta_read(*checkpoint_latest(dir.string())).at("step"), 4);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
