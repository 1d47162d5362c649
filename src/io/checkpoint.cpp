#include "io/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <system_error>

#include "core/error.h"
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

}  // namespace

std::vector<CheckpointRef> checkpoint_list(const std::string& output_dir) {
  std::vector<CheckpointRef> found;
  std::error_code ec;
  if (!fs::is_directory(root(output_dir), ec)) return found;
  for (const fs::directory_entry& entry : fs::directory_iterator(root(output_dir))) {
    const std::string name = entry.path().filename().string();
    long long step = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "step-%lld%c", &step, &tail) != 1 || name != step_name(step)) continue;
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
  return final_dir.string();
}

}  // namespace loom
