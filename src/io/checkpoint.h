// Resume checkpoints (CONTRACT.md `train.checkpoint`): folders under
// OUTPUT_DIR/checkpoints/, one per saved step, "step-00000010".
//
// A checkpoint is written into "step-00000010.tmp/", every file fsynced, then the folder is
// renamed into place and a COMMIT file is written last (and the parent folder fsynced), so
// a folder without COMMIT (a crash, a full disk, kill -9 mid-save) is never resumed from:
// checkpoint_latest skips it, and the previous complete checkpoint stays untouched until
// a newer one has committed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct CheckpointRef {
  int64_t step = 0;
  std::string dir;
};

// The complete checkpoints under output_dir, oldest first.
std::vector<CheckpointRef> checkpoint_list(const std::string& output_dir);
std::optional<CheckpointRef> checkpoint_latest(const std::string& output_dir);

// Creates (emptying any stale one) the temporary folder for `step` and returns its path.
std::string checkpoint_begin(const std::string& output_dir, int64_t step);
// Renames the temporary folder into place, writes COMMIT, and deletes the oldest complete
// checkpoints beyond `keep`. Returns the committed folder.
std::string checkpoint_commit(const std::string& output_dir, int64_t step, int64_t keep);

}  // namespace loom
