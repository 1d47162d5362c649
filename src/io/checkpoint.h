// Resume checkpoints (CONTRACT.md `train.checkpoint`, docs/checkpoints.md): folders under
// OUTPUT_DIR/checkpoints/, one per saved step, "step-00000010", each holding
//   state.safetensors  the run's state as full tensors by parameter name (below)
//   meta.json          the step, the run's identity (train/resume.h), what else resumes
//   COMMIT             written last: only a folder with it is a checkpoint
//
// A checkpoint is written into "step-00000010.tmp/", every file fsynced, then the folder is
// renamed into place, the parent folder fsynced, and COMMIT written (and fsynced) last, so
// a folder without COMMIT (a crash, a full disk, kill -9 mid-save) is never resumed from:
// checkpoint_latest skips it, and the previous complete checkpoint stays untouched until
// a newer one has committed. A commit then deletes the oldest complete checkpoints beyond
// `keep` and every incomplete folder left by an earlier save.
//
// The state is layout-independent: for each parameter of the table (model/param_table.h),
// "master/<name>", "adam_m/<name>" and "adam_v/<name>", fp32, the parameter's full shape.
// Every engine reads and writes this one form (train/engine.h): a bf16 engine rebuilds its
// fp32 masters from weights and remainders bit for bit, a parallel engine gathers its shards
// to full tensors on save and takes its slices on load.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "model/param_table.h"

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
// Renames the temporary folder into place, writes COMMIT, deletes the oldest complete
// checkpoints beyond `keep` and the incomplete ones. Returns the committed folder.
std::string checkpoint_commit(const std::string& output_dir, int64_t step, int64_t keep);

// A run's state in host memory, each vector laid out by the param table (total_numel).
struct TrainState {
  std::vector<float> master, adam_m, adam_v;
};

void checkpoint_state_write(const std::string& path, const ParamTable& table, const TrainState& state);
// Reads every tensor of the table, checking names, dtypes and shapes: InputError naming the
// file and the tensor on a mismatch.
void checkpoint_state_read(const std::string& path, const ParamTable& table, TrainState& state);

// meta.json of a checkpoint: InputError naming the file when it is not a JSON object.
nlohmann::json checkpoint_meta_read(const CheckpointRef& checkpoint);

// Writes whole checkpoints (state + meta.json) on a background thread while training goes
// on: the caller fills next_state() (a copy in host memory), then write_async() returns at
// once. One write is in flight at a time: next_state() and wait() wait for it. A failed
// write (ENOSPC, EFBIG, ...) removes its incomplete folder and is rethrown, a RuntimeFailure
// naming the file, by the next rethrow_failure(), next_state() or wait(); the destructor,
// reached while another error unwinds, prints a failure not yet reported to stderr.
//
// Test hook: LOOM_TEST_CHECKPOINT_DELAY_MS=N makes each write pause N ms after
// state.safetensors is written and before its commit, so that a test can kill a process
// mid-save (tests/train/test_faults.cpp). Nothing else reads it.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string output_dir, const ParamTable& table, int64_t keep);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  TrainState& next_state();
  const std::string& output_dir() const { return output_dir_; }
  int64_t numel() const { return table_.total_numel; }
  void write_async(int64_t step, nlohmann::json meta);
  void wait();
  // Throws a finished write's failure; does not wait for one in flight.
  void rethrow_failure();

 private:
  void write(int64_t step, const nlohmann::json& meta);

  std::string output_dir_;
  const ParamTable& table_;
  int64_t keep_;
  int64_t delay_ms_ = 0;
  TrainState state_;
  std::thread worker_;
  std::atomic<bool> done_{true};
  std::exception_ptr failure_;
};

}  // namespace loom
