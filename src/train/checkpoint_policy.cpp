#include "train/checkpoint_policy.h"

#include <utility>
#include <vector>

#include "train/resume.h"

namespace loom {

CheckpointPolicy::CheckpointPolicy(CheckpointPolicySpec spec, const ParamTable& table)
    : spec_(std::move(spec)) {
  if (spec_.writer) writer_.emplace(spec_.output_dir, table, spec_.keep, spec_.write_delay_ms);
}

void CheckpointPolicy::resume(const std::string& metrics_path) {
  if (!writer_ || !spec_.keep_best) return;
  const std::vector<CheckpointRef> kept = checkpoint_list(spec_.output_dir);
  for (const EvalMetrics& e : eval_metrics_read_jsonl(metrics_path))
    for (const CheckpointRef& c : kept)
      if (c.step == e.step) offer_best(e);
}

bool CheckpointPolicy::due(int64_t step, bool stop) const {
  const bool stopping = stop || (step == spec_.last_step && spec_.last_step < spec_.steps);
  const bool periodic = spec_.every > 0 && step % spec_.every == 0 && step < spec_.steps;
  return stopping || periodic;
}

void CheckpointPolicy::after_step(int64_t step, bool stop, const std::optional<EvalMetrics>& last_eval,
                                  TrainEngine& engine, RunIdentity& identity, const NonfiniteGuard& guard) {
  if (writer_) writer_->rethrow_failure();
  if (!due(step, stop)) return;
  if (!writer_) {
    // Rank 0 streams the checkpoint from every rank's shard: this rank answers its reads.
    engine.state_serve();
    return;
  }
  // The evaluation of this step runs before its checkpoint, which it ranks.
  if (spec_.keep_best && last_eval && last_eval->step == step) offer_best(*last_eval);
  checkpoint_save(*writer_, step, engine, identity.get(), guard);
}

void CheckpointPolicy::wait() {
  if (writer_) writer_->wait();
}

void CheckpointPolicy::offer_best(const EvalMetrics& e) {
  // An evaluation over no targets has no loss to rank (eval_run: NaN, null in the record).
  if (e.eval_tokens == 0) return;
  // `<` as keep_best has always ranked: a NaN eval loss beats nothing, and a NaN that came
  // first is never beaten.
  if (best_ && !(e.eval_loss < best_->eval_loss)) return;
  best_ = e;
  writer_->set_also_keep(e.step);
}

}  // namespace loom
