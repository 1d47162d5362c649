// Resume checkpoints (io/checkpoint.h): the state file is full tensors by parameter name,
// round-tripping bit for bit; written streamed from a source it is the same bytes, and read
// a range at a time it gives the same values; a commit keeps the newest `keep` and removes
// what interrupted saves left; a failed background write is reported, naming the path,
// never lost, and a streamed one writes the same checkpoint as a background one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

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
  return param_table_build(model_config_load(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/config.json"));
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
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

  CheckpointStateFile file_state((dir / "state.safetensors").string(), table);
  const TrainState loaded = train_state_read(file_state);
  EXPECT_EQ(std::memcmp(loaded.master.data(), saved.master.data(), saved.master.size() * 4), 0);
  EXPECT_EQ(loaded.adam_m, saved.adam_m);
  EXPECT_EQ(loaded.adam_v, saved.adam_v);

  // Another model's table is refused, naming the tensor; so is a tensor of another dtype.
  ModelConfig other = model_config_load(std::string(LOOM_SOURCE_DIR) + "/recipes/tiny/config.json");
  other.intermediate_size *= 2;
  try {
    CheckpointStateFile((dir / "state.safetensors").string(), param_table_build(other));
    FAIL() << "read the state of another model";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'master/layers.0.gate_up'"), std::string::npos) << e.what();
  }
  std::vector<SafetensorsTensor> tensors;
  for (const SafetensorsEntry& e : file.entries())
    tensors.push_back({e.name, e.name == "adam_v/final_norm" ? DType::bf16 : DType::f32, Shape(e.shape),
                       file.bytes(e), DType::f32});
  safetensors_write((dir / "bf16.safetensors").string(), tensors);
  try {
    CheckpointStateFile((dir / "bf16.safetensors").string(), table);
    FAIL() << "read a bf16 moment";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'adam_v/final_norm' is BF16"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// The streamed writer (from a source, a piece at a time) writes the full-copy writer's bytes;
// the state file read in ranges cut inside and across tensors gives the state's values.
TEST(Checkpoint, StreamedStateIsTheSameBytesAndReadsInAnyRanges) {
  const fs::path dir = scratch("streamed");
  const ParamTable table = tiny_table();
  const TrainState saved = patterned_state(table);
  checkpoint_state_write((dir / "whole.safetensors").string(), table, saved);
  OwnedStateSource source(saved);
  checkpoint_state_write((dir / "streamed.safetensors").string(), table, source);
  EXPECT_TRUE(file_bytes(dir / "whole.safetensors") == file_bytes(dir / "streamed.safetensors"));

  CheckpointStateFile file((dir / "streamed.safetensors").string(), table);
  ASSERT_EQ(file.numel(), table.total_numel);
  const int64_t n = table.total_numel;
  for (int group = 0; group < 3; ++group) {
    const std::vector<float>& want = group == 0 ? saved.master : group == 1 ? saved.adam_m : saved.adam_v;
    std::vector<float> got(static_cast<size_t>(n), -1.0f);
    // Ranges of 1, 7, 1000 and 70001 elements in turn, each cutting tensors anywhere.
    const int64_t sizes[] = {1, 7, 1000, 70001};
    for (int64_t begin = 0, i = 0; begin < n; ++i) {
      const int64_t count = std::min(sizes[i % 4], n - begin);
      file.read(static_cast<StateGroup>(group), begin, count, got.data() + begin);
      begin += count;
    }
    EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * 4), 0) << "group " << group;
  }
  fs::remove_all(dir);
}

// The message of checkpoint_meta_parse's refusal of `text`, or "" when it parses.
std::string meta_refusal(const std::string& text) {
  try {
    checkpoint_meta_parse(text, "meta.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// meta.json is read as a resume reads it. A "format" or a run field that is not a string, or a
// count that is not an integer, once escaped as nlohmann's type_error (exit 3); a key written
// twice was read as its last value.
TEST(Checkpoint, MetaIsCheckedFieldByField) {
  const std::string run = R"("run": {"numerics": {"model": "qwen3-tiny"}, "layout": {"layout.tp": "1"}})";
  const CheckpointMeta meta = checkpoint_meta_parse(
      R"({"format": "loom-checkpoint-2", "step": 4, "skipped_steps": 1, "consecutive_skips": 0, )" + run +
          "}",
      "meta.json");
  EXPECT_EQ(meta.step, 4);
  EXPECT_EQ(meta.skipped_steps, 1);
  EXPECT_EQ(meta.run["numerics"]["model"], "qwen3-tiny");
  const auto refusal = [&](const std::string& fields) { return meta_refusal("{" + fields + "}"); };
  EXPECT_EQ(
      refusal(R"("format": 5, "step": 4, )" + run),
      "meta.json: format 5, expected loom-checkpoint-2 (a checkpoint of another loom version; use a "
      "new train.output_dir)");
  EXPECT_EQ(refusal(R"("format": "loom-checkpoint-2", "step": -1, )" + run),
            "meta.json: field step is -1, expected a non-negative integer");
  EXPECT_EQ(refusal(R"("format": "loom-checkpoint-2", "step": 4, "skipped_steps": "2", )" + run),
            "meta.json: field skipped_steps is \"2\", expected a non-negative integer");
  EXPECT_EQ(refusal(R"("format": "loom-checkpoint-2", "step": 4, "run": {"numerics": {"model": 1}})"),
            "meta.json: field run.numerics.model is 1, expected a string");
  EXPECT_EQ(refusal(R"("format": "loom-checkpoint-2", "step": 4, "run": {"layout": []})"),
            "meta.json: field run.layout is [], expected an object of strings");
  EXPECT_EQ(refusal(R"("format": "loom-checkpoint-2", "step": 4, "step": 5, )" + run),
            "meta.json: found the key 'step' a second time, expected each key once");
  EXPECT_EQ(meta_refusal("[1e999]"), "meta.json: not a loom checkpoint's meta.json (expected a JSON object)");
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
  writer.write_async(4, {{"format", kCheckpointFormat}, {"step", 4}, {"run", nlohmann::json::object()}});
  writer.wait();
  ASSERT_EQ(checkpoint_latest(dir.string())->step, 4);
  EXPECT_EQ(checkpoint_meta_read(*checkpoint_latest(dir.string())).step, 4);
  fs::remove_all(dir);
}

// A streamed write, after the background one in flight, commits the same files; a failed
// one throws at once, naming the path, and leaves no folder behind.
TEST(Checkpoint, AStreamedWriteCommitsTheSameFilesAndThrowsItsFailure) {
  const fs::path dir = scratch("streamed-writer");
  const ParamTable table = tiny_table();
  CheckpointWriter writer(dir.string(), table, 3);
  writer.next_state() = patterned_state(table);
  writer.write_async(2, {{"step", 2}});
  OwnedStateSource source(patterned_state(table));
  writer.write_streamed(4, {{"step", 2}}, source);
  EXPECT_EQ(writer.streamed_writes(), 1);
  std::vector<CheckpointRef> all = checkpoint_list(dir.string());
  ASSERT_EQ(all.size(), 2u);
  for (const char* name : {"state.safetensors", "meta.json"})
    EXPECT_TRUE(file_bytes(fs::path(all[0].dir) / name) == file_bytes(fs::path(all[1].dir) / name)) << name;

  fs::remove_all(dir / "checkpoints");
  std::ofstream(dir / "checkpoints") << "a file where the checkpoints folder goes";
  try {
    writer.write_streamed(6, {{"step", 6}}, source);
    FAIL() << "the write into a file's path succeeded";
  } catch (const RuntimeFailure& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "checkpoints" / "step-00000006.tmp").string()),
              std::string::npos)
        << e.what();
  }
  writer.wait();  // nothing else to report
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom
