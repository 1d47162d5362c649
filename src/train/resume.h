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
// A resume whose numerics differ is refused (InputError, exit 2) listing each field, "field:
// CHECKPOINT (checkpoint) vs NOW (now)"; layout differences are printed and allowed (the
// state is layout-independent; the remaining steps are then not bitwise those of the old
// layout, because sums are taken in another order). train.on_nonfinite,
// max_consecutive_skips and comm_timeout_s are not part of it: they act only on a failure.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "recipe/recipe.h"
#include "train/engine.h"
#include "train/nonfinite.h"
#include "train/rows.h"

namespace loom {

// {"numerics": {field: text}, "layout": {field: text}}
nlohmann::json run_identity(const Recipe& recipe, const RowSet& data);

struct IdentityDifferences {
  std::vector<std::string> numerics, layout;  // "field: A (checkpoint) vs B (now)"
};
IdentityDifferences run_identity_compare(const nlohmann::json& saved, const nlohmann::json& now);

// Loads the latest complete checkpoint under output_dir, after the identity check, into
// `engine` and `guard`, and returns its step; nullopt when there is none. `say`: prints
// "loom: resuming from DIR (step K of N)" and any layout difference on stderr. The engine
// reads the mapped state file a range at a time (TrainEngine::state_load).
std::optional<int64_t> resume_latest(const std::string& output_dir, int64_t steps,
                                     const nlohmann::json& identity, const ParamTable& table,
                                     TrainEngine& engine, NonfiniteGuard& guard, bool say);

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
