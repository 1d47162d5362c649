// Resume checkpoints (docs/interface.md `train.checkpoint`, docs/checkpoints.md): folders under
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
// fp32 masters from weights and remainders bit for bit, a parallel engine streams its shards
// as full tensors on save (train/rank_shard.h DataParallelState::state_source) and takes its
// slices on load.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "io/param_source.h"
#include "io/safetensors.h"
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
// checkpoints beyond `keep` (but never the one of step `also_keep`: train.checkpoint.keep_best's)
// and the incomplete ones. Returns the committed folder.
std::string checkpoint_commit(const std::string& output_dir, int64_t step, int64_t keep,
                              int64_t also_keep = -1);

// A run's state in host memory, each vector laid out by the param table (total_numel).
struct TrainState {
  std::vector<float> master, adam_m, adam_v;
};

// The three flat buffers of the state, in the state file's order.
enum class StateGroup { master, adam_m, adam_v };

// The state read a flat range at a time, so that a run whose state does not fit the host a
// second time (an offloaded optimizer's pinned state is 12 B a parameter already) can write
// and read a checkpoint a piece at a time: an engine's state (train/engine.h state_source),
// a checkpoint's state file (CheckpointStateFile), or a TrainState.
class StateSource {
 public:
  virtual ~StateSource() = default;
  // Elements of each group: the table's total_numel.
  virtual int64_t numel() const = 0;
  // Fills dst[0, count) with the elements [begin, begin + count) of `group`;
  // 0 ≤ begin, begin + count ≤ numel(). Any range, in any order.
  virtual void read(StateGroup group, int64_t begin, int64_t count, float* dst) = 0;
};

// Over a TrainState it owns: what an engine that copies (or gathers) its whole state gives.
class OwnedStateSource final : public StateSource {
 public:
  explicit OwnedStateSource(TrainState state);
  int64_t numel() const override { return static_cast<int64_t>(state_.master.size()); }
  void read(StateGroup group, int64_t begin, int64_t count, float* dst) override;

 private:
  TrainState state_;
};

// Over a TrainState the caller keeps alive (a parallel engine's state_from_host reads its
// slices through it, as it reads a checkpoint's file).
class TrainStateView final : public StateSource {
 public:
  explicit TrainStateView(const TrainState& state);
  int64_t numel() const override { return static_cast<int64_t>(state_.master.size()); }
  void read(StateGroup group, int64_t begin, int64_t count, float* dst) override;

 private:
  const TrainState& state_;
};

// One group of a state as a source of flat ranges: the masters that final/ is written from,
// or a group a resume reads a shard's slice of. The owning form keeps `state` alive.
class StateGroupSource final : public ParamSource {
 public:
  StateGroupSource(StateSource& state, StateGroup group) : state_(state), group_(group) {}
  StateGroupSource(std::unique_ptr<StateSource> state, StateGroup group)
      : owned_(std::move(state)), state_(*owned_), group_(group) {}
  void read(int64_t begin, int64_t count, float* dst) override { state_.read(group_, begin, count, dst); }

 private:
  std::unique_ptr<StateSource> owned_;
  StateSource& state_;
  StateGroup group_;
};

// The whole state of a source in host memory (12 B a parameter).
TrainState train_state_read(StateSource& source);

// Writes the state file from host arrays (the background writer's copy).
void checkpoint_state_write(const std::string& path, const ParamTable& table, const TrainState& state);
// The same bytes from a source, a tensor piece at a time (safetensors_write_streamed): no
// host copy of the state beside the source's own.
void checkpoint_state_write(const std::string& path, const ParamTable& table, StateSource& state);

// A checkpoint's state file, mapped read-only and read a range at a time. Opening checks every
// tensor of the table (names, dtypes, shapes): InputError naming the file and the tensor on a
// mismatch, before any of it is read. The pages read are the kernel's page cache, which it
// reclaims under pressure: the state is never copied to anonymous memory as a whole.
class CheckpointStateFile final : public StateSource {
 public:
  CheckpointStateFile(const std::string& path, const ParamTable& table);
  int64_t numel() const override { return numel_; }
  void read(StateGroup group, int64_t begin, int64_t count, float* dst) override;

 private:
  SafetensorsFile file_;
  int64_t numel_;
  std::vector<int64_t> offsets_;  // of the table's params, ascending (they tile [0, numel_))
  std::vector<const SafetensorsEntry*> entries_[3];  // per group, per param
};

// The format a checkpoint's meta.json names; another is a checkpoint of another loom version.
inline constexpr const char* kCheckpointFormat = "loom-checkpoint-2";

// A checkpoint's meta.json: {"format": kCheckpointFormat, "step": k, "skipped_steps": s,
// "consecutive_skips": c, "run": {"numerics": {field: text}, "layout": {field: text}}}
// (train/resume.h writes it and compares `run` with the run that resumes).
struct CheckpointMeta {
  int64_t step = 0;
  int64_t skipped_steps = 0, consecutive_skips = 0;  // the non-finite guard's (0 when absent)
  nlohmann::json run;
};

// Parses meta.json's text (`path` names it in messages): InputError naming the file and the
// field for invalid JSON, a key written twice, another format, or a field of another type or
// a negative count.
CheckpointMeta checkpoint_meta_parse(const std::string& text, const std::string& path);
// Reads and parses the meta.json of `checkpoint`.
CheckpointMeta checkpoint_meta_read(const CheckpointRef& checkpoint);

// Writes whole checkpoints (state + meta.json), in one of two ways:
//  - on a background thread while training goes on: the caller fills next_state() (a copy in
//    host memory, 12 B a parameter), then write_async() returns at once. One write is in
//    flight at a time: next_state() and wait() wait for it. A failed write (ENOSPC, EFBIG,
//    ...) removes its incomplete folder and is rethrown, a RuntimeFailure naming the file, by
//    the next rethrow_failure(), next_state() or wait(); the destructor, reached while another
//    error unwinds, prints a failure not yet reported to stderr.
//  - streamed: write_streamed() writes the state from a source, a tensor piece at a time, and
//    returns when the checkpoint has committed (the caller waits, and its state must not
//    change meanwhile); a failure is thrown from it, its folder removed.
// Both write the same files, byte for byte.
//
// Test hook: `delay_ms` > 0 makes each write pause that long after state.safetensors is
// written and before its commit, so that a test can kill a process mid-save
// (tests/train/test_faults.cpp, through `loom train`'s LOOM_TEST_CHECKPOINT_DELAY_MS).
class CheckpointWriter {
 public:
  CheckpointWriter(std::string output_dir, const ParamTable& table, int64_t keep, int64_t delay_ms = 0);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  TrainState& next_state();
  const std::string& output_dir() const { return output_dir_; }
  int64_t numel() const { return table_.total_numel; }
  void write_async(int64_t step, nlohmann::json meta);
  // After the write in flight, if any.
  void write_streamed(int64_t step, const nlohmann::json& meta, StateSource& state);
  // How many write_streamed calls this writer has made.
  int64_t streamed_writes() const { return streamed_writes_; }
  void wait();
  // Throws a finished write's failure; does not wait for one in flight.
  void rethrow_failure();
  // The checkpoint of `step` is kept besides the newest `keep` (the lowest eval loss's);
  // pruning from the next write on honours it. -1: none.
  void set_also_keep(int64_t step) { also_keep_ = step; }

 private:
  // `state_file` writes state.safetensors at the path it is given; `also_keep` is the
  // caller's set_also_keep at the time of the call (the worker must not read the member).
  void write(int64_t step, const nlohmann::json& meta, int64_t also_keep,
             const std::function<void(const std::string&)>& state_file);

  std::string output_dir_;
  const ParamTable& table_;
  int64_t keep_;
  int64_t also_keep_ = -1;
  int64_t delay_ms_;
  TrainState state_;
  int64_t streamed_writes_ = 0;
  std::thread worker_;
  std::atomic<bool> done_{true};
  std::exception_ptr failure_;
};

}  // namespace loom
