// The resume checkpoints of a run (io/checkpoint.h, docs/checkpoints.md): what a checkpoint
// records about its run, the check a resume makes against it, and the save and load.
//
// The run's identity, in meta.json "run", field → value text:
//   numerics  every field config_check compares (check/config_check.h: model, data,
//             schedule, optimizer, precision, loss), plus the rows actually loaded:
//             data.rows, data.rows_sha256 (a row store's is verified on load, a rows .jsonl's
//             computed), data.tokenizer_sha256 (the row store's manifest) and
//             init.tokenizer_sha256 (the HF init folder's tokenizer files), "(none)" where
//             there is none;
//   layout    layout.*, gpu.count, train.device: what may differ on resume.
// With LoRA, numerics also holds train.lora.base_sha256: the sha256 of each safetensors file
// of the frozen base (RunIdentity computes it beside the training).
// A resume whose numerics differ is refused (InputError, exit 2) listing each field, "field:
// CHECKPOINT (checkpoint) vs NOW (now)"; layout differences are printed and allowed (the
// state is layout-independent; the remaining steps are then not bitwise those of the old
// layout, because sums are taken in another order). train.on_nonfinite,
// max_consecutive_skips and comm_timeout_s are not part of it: they act only on a failure.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "io/checkpoint.h"
#include "recipe/recipe.h"
#include "train/engine.h"
#include "train/nonfinite.h"
#include "train/rows.h"

namespace loom {

// A run's identity, {"numerics": {field: text}, "layout": {field: text}}. A LoRA base's hash
// reads every byte of the base (64 GB at Qwen3-32B, half a minute or more), which a run needs
// only to resume from a checkpoint or to write one: with `hash_in_background` (the rank that
// writes the checkpoints) a thread of its own hashes the files from construction while the
// run loads and trains; otherwise the first get() hashes them. get() waits for the hash; the
// destructor stops an unfinished one between 1 MiB reads.
class RunIdentity {
 public:
  RunIdentity(const Recipe& recipe, const RowSet& data, bool hash_in_background);
  explicit RunIdentity(nlohmann::json whole);  // an identity with nothing left to compute
  ~RunIdentity();
  RunIdentity(const RunIdentity&) = delete;
  RunIdentity& operator=(const RunIdentity&) = delete;

  // The whole identity; a failure to read the base (RuntimeFailure naming the file) is
  // thrown here.
  const nlohmann::json& get();

 private:
  void hash_base();

  nlohmann::json identity_;
  std::string base_dir_;  // the LoRA base whose hash identity_ still lacks; empty once it has it
  std::thread hasher_;
  std::atomic<bool> stop_{false};
  std::string base_sha256_;
  std::exception_ptr failure_;
};

struct IdentityDifferences {
  std::vector<std::string> numerics, layout;  // "field: A (checkpoint) vs B (now)"
};
IdentityDifferences run_identity_compare(const nlohmann::json& saved, const nlohmann::json& now);

// Loads the latest complete checkpoint under output_dir, after the identity check, into
// `engine` and `guard`, and returns its step; nullopt when there is none. `say`: prints
// "loom: resuming from DIR (step K of N)" and any layout difference on stderr. The engine
// reads the mapped state file a range at a time (TrainEngine::state_load).
std::optional<int64_t> resume_latest(const std::string& output_dir, int64_t steps, RunIdentity& identity,
                                     const ParamTable& table, TrainEngine& engine, NonfiniteGuard& guard,
                                     bool say);

// Hands checkpoint `step` of the engine's state to the writer (world rank 0's; on a parallel
// layout the other ranks run engine.state_serve meanwhile). Where the host's available
// memory holds a copy of the whole state (core/host_memory.h; later checkpoints reuse the
// first one's arrays) and the engine's copy is its own (not state_gathers), the engine
// copies it to host memory and the writer writes it while training goes on. Otherwise it is
// written from the engine's state_source, tensor by tensor, and the step waits for it (said
// once on stderr, with the sizes).
void checkpoint_save(CheckpointWriter& writer, int64_t step, TrainEngine& engine,
                     const nlohmann::json& identity, const NonfiniteGuard& guard);

// Whether the host's available memory holds a copy of the whole state of `numel` parameters
// (TrainState: master weights, Adam m and v in fp32, 12 B a parameter: 98 GB at Qwen3-8B)
// beside what the run holds already (an offloaded optimizer's pinned state: as much again
// at fraction 1). True where the available memory cannot be read.
bool host_memory_holds_state(int64_t numel);

}  // namespace loom
