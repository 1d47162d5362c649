#include "train/resume.h"

#include <cstdio>
#include <filesystem>
#include <set>

#include "check/config_check.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "data/row_store.h"
#include "data/sha256.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

std::string init_tokenizer_sha256(const TrainSpec& train) {
  if (train.init_hf_checkpoint.empty() || !fs::exists(fs::path(train.init_hf_checkpoint) / "tokenizer.json"))
    return "(none)";
  return tokenizer_files_sha256(train.init_hf_checkpoint).dump();
}

// LoRA trains adapters for one base: {file: sha256} over each of its safetensors files, in
// name order; "" where `stop` ended it first.
std::string lora_base_sha256(const std::string& dir, const std::atomic<bool>* stop) {
  std::set<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.insert(e.path().filename().string());
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const std::string& f : files) {
    out[f] = sha256_file((fs::path(dir) / f).string(), stop);
    if (stop && stop->load()) return "";
  }
  return out.dump();
}

int64_t state_bytes(int64_t numel) {
  return 12 * numel;
}

std::string gib(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f GiB (%lld B)",
                static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0), static_cast<long long>(bytes));
  return text;
}

std::vector<std::string> differences(const nlohmann::json& saved, const nlohmann::json& now) {
  std::set<std::string> names;
  for (const auto& [name, value] : saved.items()) names.insert(name);
  for (const auto& [name, value] : now.items()) names.insert(name);
  std::vector<std::string> list;
  for (const std::string& name : names) {
    const std::string a = saved.contains(name) ? saved.at(name).get<std::string>() : "(absent)";
    const std::string b = now.contains(name) ? now.at(name).get<std::string>() : "(absent)";
    if (a != b) list.push_back(name + ": " + a + " (checkpoint) vs " + b + " (now)");
  }
  return list;
}

}  // namespace

RunIdentity::RunIdentity(const Recipe& recipe, const RowSet& data, bool hash_in_background) {
  nlohmann::json numerics = nlohmann::json::object(), layout = nlohmann::json::object();
  for (const ConfigField& f : config_numerics_fields(recipe)) numerics[f.name] = f.value;
  numerics["data.rows"] = std::to_string(data.rows);
  numerics["data.rows_sha256"] = data.rows_sha256;
  numerics["data.tokenizer_sha256"] = data.tokenizer_sha256.empty() ? "(none)" : data.tokenizer_sha256;
  numerics["init.tokenizer_sha256"] = init_tokenizer_sha256(recipe.train);
  // A random base is the model fields' seed, already in numerics.
  if (recipe.train.lora.enabled() && recipe.train.init_hf_checkpoint.empty())
    numerics["train.lora.base_sha256"] = "(random init)";
  else if (recipe.train.lora.enabled())
    base_dir_ = recipe.train.init_hf_checkpoint;
  for (const ConfigField& f : config_layout_fields(recipe)) layout[f.name] = f.value;
  identity_ = {{"numerics", numerics}, {"layout", layout}};
  if (!base_dir_.empty() && hash_in_background) hasher_ = std::thread([this] { hash_base(); });
}

RunIdentity::RunIdentity(nlohmann::json whole) : identity_(std::move(whole)) {}

RunIdentity::~RunIdentity() {
  stop_ = true;
  if (hasher_.joinable()) hasher_.join();
}

void RunIdentity::hash_base() {
  try {
    base_sha256_ = lora_base_sha256(base_dir_, &stop_);
  } catch (...) {
    failure_ = std::current_exception();
  }
}

const nlohmann::json& RunIdentity::get() {
  if (base_dir_.empty()) return identity_;
  if (hasher_.joinable())
    hasher_.join();
  else
    hash_base();
  if (failure_) std::rethrow_exception(failure_);
  identity_["numerics"]["train.lora.base_sha256"] = base_sha256_;
  base_dir_.clear();
  return identity_;
}

IdentityDifferences run_identity_compare(const nlohmann::json& saved, const nlohmann::json& now) {
  auto part = [](const nlohmann::json& identity, const char* key) {
    return identity.is_object() && identity.contains(key) && identity.at(key).is_object()
               ? identity.at(key)
               : nlohmann::json::object();
  };
  return {differences(part(saved, "numerics"), part(now, "numerics")),
          differences(part(saved, "layout"), part(now, "layout"))};
}

std::optional<int64_t> resume_latest(const std::string& output_dir, int64_t steps, RunIdentity& identity,
                                     const ParamTable& table, TrainEngine& engine, NonfiniteGuard& guard,
                                     bool say) {
  const std::optional<CheckpointRef> latest = checkpoint_latest(output_dir);
  if (!latest) return std::nullopt;
  const CheckpointMeta meta = checkpoint_meta_read(*latest);
  const IdentityDifferences diff = run_identity_compare(meta.run, identity.get());
  if (!diff.numerics.empty()) {
    std::string list;
    for (const std::string& d : diff.numerics) list += "\n  " + d;
    throw_input_error(
        latest->dir, "this checkpoint belongs to another run: the recipe, data or tokenizer changed:" + list +
                         "\n(expected the same recipe, data and tokenizer, or a new train.output_dir)");
  }
  CheckpointStateFile state((fs::path(latest->dir) / "state.safetensors").string(), table);
  engine.state_load(state);
  guard.restore(meta.skipped_steps, meta.consecutive_skips);
  if (say) {
    std::fprintf(stderr, "loom: resuming from %s (step %lld of %lld)\n", latest->dir.c_str(),
                 static_cast<long long>(latest->step), static_cast<long long>(steps));
    for (const std::string& d : diff.layout)
      std::fprintf(stderr, "loom: resuming on another layout: %s\n", d.c_str());
  }
  return latest->step;
}

bool host_memory_holds_state(int64_t numel) {
  const int64_t available = host_memory_available_bytes();
  return available < 0 || state_bytes(numel) <= available;
}

void checkpoint_save(CheckpointWriter& writer, int64_t step, TrainEngine& engine,
                     const nlohmann::json& identity, const NonfiniteGuard& guard) {
  const nlohmann::json meta{{"format", kCheckpointFormat},
                            {"step", step},
                            {"skipped_steps", guard.skipped()},
                            {"consecutive_skips", guard.consecutive()},
                            {"run", identity}};
  TrainState& state = writer.next_state();
  // A copy in host memory lets training go on while it is written; the first one's arrays
  // are kept for the later ones. A parallel engine's copy would be every rank's shard
  // gathered on world rank 0, 12 B a parameter there (394 GB at Qwen3-32B, beside rank 0's
  // own pinned offloaded state), and kept from one checkpoint to the next: it always streams,
  // rank 0 holding a piece at a time.
  if (!engine.state_gathers() && (!state.master.empty() || host_memory_holds_state(writer.numel()))) {
    engine.state_to_host(state);
    writer.write_async(step, meta);
    return;
  }
  if (writer.streamed_writes() == 0 && engine.state_gathers())
    std::fprintf(
        stderr,
        "loom: checkpoints are written streamed, tensor by tensor from each rank's shard, and the step "
        "waits for each: a parallel layout never gathers its training state (master weights, Adam m "
        "and v in fp32, 12 B a parameter: %s) on one rank\n",
        gib(state_bytes(writer.numel())).c_str());
  else if (writer.streamed_writes() == 0)
    std::fprintf(stderr,
                 "loom: checkpoints are written streamed, tensor by tensor, and the step waits for each: a "
                 "copy of the training state (master weights, Adam m and v in fp32, 12 B a parameter: %s) "
                 "does not fit the host's %s available\n",
                 gib(state_bytes(writer.numel())).c_str(), gib(host_memory_available_bytes()).c_str());
  writer.write_streamed(step, meta, *engine.state_source());
}

}  // namespace loom
