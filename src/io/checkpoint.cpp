#include "io/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "core/error.h"
#include "io/file_output.h"
#include "io/safetensors.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

fs::path root(const std::string& output_dir) {
  return fs::path(output_dir) / "checkpoints";
}

// The step of a folder named "step-00000010", or -1.
int64_t step_of(const std::string& name) {
  long long step = 0;
  char tail = 0;
  if (std::sscanf(name.c_str(), "step-%lld%c", &step, &tail) != 1 || name != step_name(step)) return -1;
  return step;
}

// Folders an interrupted save left: "step-N.tmp", or "step-N" without COMMIT.
void remove_incomplete(const std::string& output_dir) {
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(root(output_dir), ec)) {
    const std::string name = entry.path().filename().string();
    const bool tmp =
        name.size() > 4 && name.ends_with(".tmp") && step_of(name.substr(0, name.size() - 4)) >= 0;
    const bool uncommitted = step_of(name) >= 0 && !fs::exists(entry.path() / "COMMIT");
    if (tmp || uncommitted) fs::remove_all(entry.path(), ec);
  }
}

const char* const kStateGroups[] = {"master", "adam_m", "adam_v"};

std::vector<float>& state_group(TrainState& state, int group) {
  return group == 0 ? state.master : group == 1 ? state.adam_m : state.adam_v;
}
const std::vector<float>& state_group(const TrainState& state, int group) {
  return group == 0 ? state.master : group == 1 ? state.adam_m : state.adam_v;
}

}  // namespace

std::vector<CheckpointRef> checkpoint_list(const std::string& output_dir) {
  std::vector<CheckpointRef> found;
  std::error_code ec;
  if (!fs::is_directory(root(output_dir), ec)) return found;
  for (const fs::directory_entry& entry : fs::directory_iterator(root(output_dir))) {
    const int64_t step = step_of(entry.path().filename().string());
    if (step < 0) continue;
    if (!fs::exists(entry.path() / "COMMIT")) continue;  // incomplete: never resumed from
    found.push_back({step, entry.path().string()});
  }
  std::sort(found.begin(), found.end(),
            [](const CheckpointRef& a, const CheckpointRef& b) { return a.step < b.step; });
  return found;
}

std::optional<CheckpointRef> checkpoint_latest(const std::string& output_dir) {
  std::vector<CheckpointRef> all = checkpoint_list(output_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

std::string checkpoint_begin(const std::string& output_dir, int64_t step) {
  const fs::path tmp = root(output_dir) / (step_name(step) + ".tmp");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw_runtime_failure(tmp.string(), "cannot create the checkpoint folder: " + ec.message());
  return tmp.string();
}

std::string checkpoint_commit(const std::string& output_dir, int64_t step, int64_t keep) {
  const fs::path final_dir = root(output_dir) / step_name(step);
  const fs::path tmp = root(output_dir) / (step_name(step) + ".tmp");
  std::error_code ec;
  file_sync_dir(tmp.string());
  fs::remove_all(final_dir, ec);  // a stale, uncommitted folder of the same step
  fs::rename(tmp, final_dir, ec);
  if (ec) throw_runtime_failure(final_dir.string(), "cannot commit the checkpoint: " + ec.message());
  file_sync_dir(root(output_dir).string());
  file_write_atomic((final_dir / "COMMIT").string(), "step " + std::to_string(step) + "\n");
  file_sync_dir(final_dir.string());
  std::vector<CheckpointRef> all = checkpoint_list(output_dir);
  for (size_t i = 0; i + static_cast<size_t>(std::max<int64_t>(keep, 1)) < all.size(); ++i)
    fs::remove_all(all[i].dir, ec);
  remove_incomplete(output_dir);
  return final_dir.string();
}

void checkpoint_state_write(const std::string& path, const ParamTable& table, const TrainState& state) {
  std::vector<SafetensorsTensor> tensors;
  for (int group = 0; group < 3; ++group) {
    const std::vector<float>& values = state_group(state, group);
    LOOM_ASSERT(static_cast<int64_t>(values.size()) == table.total_numel, "state not laid out by the table");
    for (const ParamSpec& p : table.params)
      tensors.push_back({std::string(kStateGroups[group]) + "/" + p.name, DType::f32, p.shape,
                         values.data() + p.offset, DType::f32});
  }
  safetensors_write(path, tensors, {{"format", "loom-state-1"}});
}

void checkpoint_state_read(const std::string& path, const ParamTable& table, TrainState& state) {
  SafetensorsFile file = SafetensorsFile::open(path);
  for (int group = 0; group < 3; ++group) {
    std::vector<float>& values = state_group(state, group);
    values.resize(static_cast<size_t>(table.total_numel));
    for (const ParamSpec& p : table.params) {
      const std::string name = std::string(kStateGroups[group]) + "/" + p.name;
      const SafetensorsEntry* entry = file.find(name);
      if (!entry)
        throw_input_error(
            path, "tensor '" + name + "' is missing (a checkpoint of another model or loom version?)");
      const std::vector<int64_t> expected(p.shape.dims.begin(), p.shape.dims.begin() + p.shape.ndim);
      if (entry->dtype != DType::f32 || entry->shape != expected)
        throw_input_error(path, "tensor '" + name + "' is " + dtype_name(entry->dtype) + " " +
                                    entry->shape_str() + ", expected F32 " +
                                    SafetensorsEntry{name, DType::f32, expected}.shape_str() +
                                    " (a checkpoint of another model?)");
      std::memcpy(values.data() + p.offset, file.bytes(*entry),
                  static_cast<size_t>(p.numel()) * sizeof(float));
    }
  }
}

nlohmann::json checkpoint_meta_read(const CheckpointRef& checkpoint) {
  const std::string path = (fs::path(checkpoint.dir) / "meta.json").string();
  std::ifstream in(path);
  nlohmann::json meta = nlohmann::json::parse(in, nullptr, false);
  if (!in || meta.is_discarded() || !meta.is_object())
    throw_input_error(path, "not a loom checkpoint's meta.json (expected a JSON object)");
  return meta;
}

CheckpointWriter::CheckpointWriter(std::string output_dir, const ParamTable& table, int64_t keep)
    : output_dir_(std::move(output_dir)), table_(table), keep_(keep) {
  if (const char* delay = std::getenv("LOOM_TEST_CHECKPOINT_DELAY_MS")) delay_ms_ = std::atoll(delay);
}

CheckpointWriter::~CheckpointWriter() {
  if (worker_.joinable()) worker_.join();
  if (!failure_) return;
  try {
    std::rethrow_exception(failure_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom: a checkpoint write failed: %s\n", e.what());
  }
}

TrainState& CheckpointWriter::next_state() {
  wait();
  return state_;
}

void CheckpointWriter::write_async(int64_t step, nlohmann::json meta) {
  wait();
  done_ = false;
  worker_ = std::thread([this, step, meta = std::move(meta)] {
    try {
      write(step, meta);
    } catch (...) {
      failure_ = std::current_exception();
    }
    done_ = true;
  });
}

void CheckpointWriter::wait() {
  if (worker_.joinable()) worker_.join();
  rethrow_failure();
}

void CheckpointWriter::rethrow_failure() {
  if (worker_.joinable() && done_) worker_.join();
  if (worker_.joinable() || !failure_) return;
  std::exception_ptr failure = failure_;
  failure_ = nullptr;
  std::rethrow_exception(failure);
}

void CheckpointWriter::write(int64_t step, const nlohmann::json& meta) {
  const std::string dir = checkpoint_begin(output_dir_, step);
  try {
    checkpoint_state_write((fs::path(dir) / "state.safetensors").string(), table_, state_);
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    file_write_atomic((fs::path(dir) / "meta.json").string(), meta.dump(1) + "\n");
    checkpoint_commit(output_dir_, step, keep_);
  } catch (...) {
    // Never leave half a checkpoint behind; the previous complete one is untouched.
    std::error_code ec;
    fs::remove_all(dir, ec);
    const fs::path final_dir = root(output_dir_) / step_name(step);
    if (!fs::exists(final_dir / "COMMIT", ec)) fs::remove_all(final_dir, ec);
    throw;
  }
}

}  // namespace loom
