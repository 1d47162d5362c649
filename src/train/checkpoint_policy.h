// When a run writes a resume checkpoint and which ones it keeps (docs/checkpoints.md "When a
// checkpoint is written"): every train.checkpoint.every steps but the last (final/ is written
// then), after the last step of a --stop-at-step, after the step in progress when a stop was
// voted (SIGTERM, SIGINT); the newest train.checkpoint.keep of them, and with
// train.checkpoint.keep_best the one whose step's evaluation has the lowest eval loss so far,
// which a resumed run finds again among metrics.jsonl's eval records and the checkpoints kept.
//
// World rank 0 writes (io/checkpoint.h CheckpointWriter, train/resume.h checkpoint_save); on
// a parallel layout every other rank answers its reads of the state meanwhile
// (TrainEngine::state_serve), so every rank calls after_step with the same arguments.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "io/checkpoint.h"
#include "model/param_table.h"
#include "train/engine.h"
#include "train/metrics.h"
#include "train/nonfinite.h"
#include "train/resume.h"

namespace loom {

struct CheckpointPolicySpec {
  std::string output_dir;
  int64_t every = 0;       // train.checkpoint.every; 0: none periodic
  int64_t keep = 1;        // train.checkpoint.keep
  bool keep_best = false;  // train.checkpoint.keep_best
  int64_t steps = 0;       // train.steps: no periodic checkpoint at the last, final/ is written then
  int64_t last_step = 0;   // this invocation's last (--stop-at-step, else train.steps)
  bool writer = false;     // world rank 0
  // Test hook (TrainFaults::checkpoint_delay_ms): each write pauses this long between its state
  // file and its commit.
  int64_t write_delay_ms = 0;
};

class CheckpointPolicy {
 public:
  // `table` must outlive the policy (the writer reads the state's layout from it).
  CheckpointPolicy(CheckpointPolicySpec spec, const ParamTable& table);

  // A resumed run's keep_best (world rank 0; nothing elsewhere or without keep_best): the lowest
  // eval loss among metrics.jsonl's eval records (RunOutputs has cut it back to the resumed step)
  // at a step with a complete checkpoint under output_dir is the best so far, and its checkpoint
  // is kept from the next write on. An eval whose step's checkpoint was pruned does not count:
  // there is nothing of it left to keep.
  void resume(const std::string& metrics_path);

  // Whether `step` ends with a checkpoint: a stop (voted by every rank, or the last step of a
  // --stop-at-step short of train.steps) or a periodic one.
  bool due(int64_t step, bool stop) const;

  // After `step` (every rank): rethrows a failed background write, then, when due, writes the
  // checkpoint (world rank 0; `last_eval` ranks it for keep_best when it is of this step) or
  // answers rank 0's reads of this rank's state (the others).
  void after_step(int64_t step, bool stop, const std::optional<EvalMetrics>& last_eval, TrainEngine& engine,
                  RunIdentity& identity, const NonfiniteGuard& guard);

  // Waits for the write in flight (world rank 0), rethrowing its failure.
  void wait();

 private:
  // keep_best: `e` becomes the best when it is lower than the best so far (the first one
  // always); its checkpoint is then kept.
  void offer_best(const EvalMetrics& e);

  CheckpointPolicySpec spec_;
  std::optional<CheckpointWriter> writer_;  // world rank 0's
  std::optional<EvalMetrics> best_;
};

}  // namespace loom
