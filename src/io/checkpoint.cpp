#include "io/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "core/json_strict.h"
#include "io/file_output.h"

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

std::string checkpoint_commit(const std::string& output_dir, int64_t step, int64_t keep, int64_t also_keep) {
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
    if (all[i].step != also_keep) fs::remove_all(all[i].dir, ec);
  remove_incomplete(output_dir);
  return final_dir.string();
}

OwnedStateSource::OwnedStateSource(TrainState state) : state_(std::move(state)) {}

void OwnedStateSource::read(StateGroup group, int64_t begin, int64_t count, float* dst) {
  TrainStateView(state_).read(group, begin, count, dst);
}

TrainStateView::TrainStateView(const TrainState& state) : state_(state) {
  LOOM_ASSERT(state_.adam_m.size() == state_.master.size() && state_.adam_v.size() == state_.master.size(),
              "state groups of different sizes");
}

void TrainStateView::read(StateGroup group, int64_t begin, int64_t count, float* dst) {
  const std::vector<float>& values = state_group(state_, static_cast<int>(group));
  LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= numel(), "state range past the end");
  std::memcpy(dst, values.data() + begin, static_cast<size_t>(count) * sizeof(float));
}

TrainState train_state_read(StateSource& source) {
  TrainState state;
  for (int group = 0; group < 3; ++group) {
    std::vector<float>& values = state_group(state, group);
    values.resize(static_cast<size_t>(source.numel()));
    source.read(static_cast<StateGroup>(group), 0, source.numel(), values.data());
  }
  return state;
}

namespace {

// The state file's tensors in order: each group's params in table order; `data` points into
// `state` when given, else is null (a streamed write reads the values from a source).
std::vector<SafetensorsTensor> state_tensors(const ParamTable& table, const TrainState* state) {
  std::vector<SafetensorsTensor> tensors;
  for (int group = 0; group < 3; ++group) {
    const float* values = nullptr;
    if (state) {
      LOOM_ASSERT(static_cast<int64_t>(state_group(*state, group).size()) == table.total_numel,
                  "state not laid out by the table");
      values = state_group(*state, group).data();
    }
    for (const ParamSpec& p : table.params)
      tensors.push_back({std::string(kStateGroups[group]) + "/" + p.name, DType::f32, p.shape,
                         values ? values + p.offset : nullptr, DType::f32});
  }
  return tensors;
}

const std::map<std::string, std::string> kStateMetadata{{"format", "loom-state-1"}};

}  // namespace

void checkpoint_state_write(const std::string& path, const ParamTable& table, const TrainState& state) {
  safetensors_write(path, state_tensors(table, &state), kStateMetadata);
}

void checkpoint_state_write(const std::string& path, const ParamTable& table, StateSource& state) {
  LOOM_ASSERT(state.numel() == table.total_numel, "state not laid out by the table");
  const size_t params = table.params.size();
  safetensors_write_streamed(path, state_tensors(table, nullptr), kStateMetadata,
                             [&](size_t tensor, int64_t first, int64_t count, float* dst) {
                               const ParamSpec& p = table.params[tensor % params];
                               state.read(static_cast<StateGroup>(tensor / params), p.offset + first, count,
                                          dst);
                             });
}

CheckpointStateFile::CheckpointStateFile(const std::string& path, const ParamTable& table)
    : file_(SafetensorsFile::open(path)), numel_(table.total_numel) {
  int64_t next = 0;
  for (const ParamSpec& p : table.params) {
    LOOM_ASSERT(p.offset == next, "the table's params do not tile the flat buffer");
    offsets_.push_back(p.offset);
    next += p.numel();
  }
  LOOM_ASSERT(next == numel_, "the table's params do not tile the flat buffer");
  for (int group = 0; group < 3; ++group)
    for (const ParamSpec& p : table.params) {
      const std::string name = std::string(kStateGroups[group]) + "/" + p.name;
      const SafetensorsEntry* entry = file_.find(name);
      if (!entry)
        throw_input_error(
            path, "tensor '" + name + "' is missing (a checkpoint of another model or loom version?)");
      const std::vector<int64_t> expected(p.shape.dims.begin(), p.shape.dims.begin() + p.shape.ndim);
      if (entry->dtype != DType::f32 || entry->shape != expected)
        throw_input_error(path, "tensor '" + name + "' is " + dtype_name(entry->dtype) + " " +
                                    entry->shape_str() + ", expected F32 " +
                                    SafetensorsEntry{name, DType::f32, expected}.shape_str() +
                                    " (a checkpoint of another model?)");
      entries_[group].push_back(entry);
    }
}

void CheckpointStateFile::read(StateGroup group, int64_t begin, int64_t count, float* dst) {
  LOOM_ASSERT(begin >= 0 && count >= 0 && begin + count <= numel_, "state range past the end");
  const std::vector<const SafetensorsEntry*>& entries = entries_[static_cast<int>(group)];
  // The param holding `begin`, then each param the range crosses, in turn.
  size_t i =
      static_cast<size_t>(std::upper_bound(offsets_.begin(), offsets_.end(), begin) - offsets_.begin()) - 1;
  for (int64_t at = begin, end = begin + count; at < end; ++i) {
    const int64_t first = at - offsets_[i];
    const int64_t n = std::min(entries[i]->numel() - first, end - at);
    std::memcpy(dst + (at - begin), file_.bytes(*entries[i]) + first * static_cast<int64_t>(sizeof(float)),
                static_cast<size_t>(n) * sizeof(float));
    at += n;
  }
}

CheckpointMeta checkpoint_meta_parse(const std::string& text, const std::string& path) {
  const StrictJson parsed = json_parse_strict(text);
  const nlohmann::json& meta = parsed.value;
  if (meta.is_discarded() || !meta.is_object())
    throw_input_error(path, "not a loom checkpoint's meta.json (expected a JSON object)");
  if (parsed.duplicate)
    throw_input_error(path,
                      "found the key '" + *parsed.duplicate + "' a second time, expected each key once");
  const nlohmann::json format = meta.contains("format") ? meta.at("format") : nlohmann::json();
  if (format != kCheckpointFormat)
    throw_input_error(path, "format " +
                                (format.is_string() ? format.get<std::string>()
                                 : format.is_null() ? std::string("(none)")
                                                    : format.dump()) +
                                ", expected " + kCheckpointFormat +
                                " (a checkpoint of another loom version; use a new train.output_dir)");
  CheckpointMeta out;
  const auto count = [&](const char* field, bool required) -> int64_t {
    if (!meta.contains(field)) {
      if (required) throw_input_error(path, std::string("field ") + field + " is missing");
      return 0;
    }
    const nlohmann::json& value = meta.at(field);
    if (!value.is_number_integer() || (value.is_number_unsigned() && value.get<uint64_t>() > INT64_MAX) ||
        value.get<int64_t>() < 0)
      throw_input_error(
          path, std::string("field ") + field + " is " + value.dump() + ", expected a non-negative integer");
    return value.get<int64_t>();
  };
  out.step = count("step", true);
  out.skipped_steps = count("skipped_steps", false);
  out.consecutive_skips = count("consecutive_skips", false);
  if (!meta.contains("run") || !meta.at("run").is_object())
    throw_input_error(path, "field run is missing or not an object");
  for (const auto& [part, fields] : meta.at("run").items()) {
    if (!fields.is_object())
      throw_input_error(path,
                        "field run." + part + " is " + fields.dump() + ", expected an object of strings");
    for (const auto& [name, value] : fields.items())
      if (!value.is_string())
        throw_input_error(path,
                          "field run." + part + "." + name + " is " + value.dump() + ", expected a string");
  }
  out.run = meta.at("run");
  return out;
}

CheckpointMeta checkpoint_meta_read(const CheckpointRef& checkpoint) {
  const std::string path = (fs::path(checkpoint.dir) / "meta.json").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_input_error(path, "cannot open a checkpoint's meta.json");
  std::stringstream text;
  text << in.rdbuf();
  CheckpointMeta meta = checkpoint_meta_parse(text.str(), path);
  if (meta.step != checkpoint.step)
    throw_input_error(path, "field step is " + std::to_string(meta.step) + ", expected " +
                                std::to_string(checkpoint.step) + " (the step its folder names)");
  return meta;
}

CheckpointWriter::CheckpointWriter(std::string output_dir, const ParamTable& table, int64_t keep,
                                   int64_t delay_ms)
    : output_dir_(std::move(output_dir)), table_(table), keep_(keep), delay_ms_(delay_ms) {}

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
  worker_ = std::thread([this, step, meta = std::move(meta), also_keep = also_keep_] {
    try {
      write(step, meta, also_keep,
            [this](const std::string& path) { checkpoint_state_write(path, table_, state_); });
    } catch (...) {
      failure_ = std::current_exception();
    }
    done_ = true;
  });
}

void CheckpointWriter::write_streamed(int64_t step, const nlohmann::json& meta, StateSource& state) {
  wait();
  ++streamed_writes_;
  write(step, meta, also_keep_,
        [&](const std::string& path) { checkpoint_state_write(path, table_, state); });
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

void CheckpointWriter::write(int64_t step, const nlohmann::json& meta, int64_t also_keep,
                             const std::function<void(const std::string&)>& state_file) {
  const std::string dir = checkpoint_begin(output_dir_, step);
  try {
    state_file((fs::path(dir) / "state.safetensors").string());
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    file_write_atomic((fs::path(dir) / "meta.json").string(), meta.dump(1) + "\n");
    checkpoint_commit(output_dir_, step, keep_, also_keep);
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
