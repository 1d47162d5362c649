// How a THD attention backward (sample-isolated rows, ops/cuda/attention.h) splits a
// micro-batch's sequences into cuDNN calls so that no call asks for more than a bound of
// workspace. cuDNN's deterministic backward takes a workspace proportional to its call's
// bucketed shape (sequences × longest sequence, both rounded up to powers of two), not to
// its real tokens: one call over a micro-batch of isolated rows asked 17 GiB at 8 × 8,192
// bucketed tokens (docs/status.md), and a 131,072-token row of long samples would ask
// hundreds. Groups are runs of consecutive sequences (a call's tensors are then one window
// of the micro-batch's, its offsets relative to the window's first token), each as long as
// the bound allows. Host code without CUDA: the CUDA ops and `loom plan`'s shape backend
// group the same way.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ops/ops.h"

namespace loom {

// What one call's workspace is taken to be: bytes_per_token for each bucketed token
// (sequences × longest), and the most a call may ask (a sequence whose call alone asks
// more runs by itself). token_elements is a token's elements in the largest tensor whose
// ragged offsets are int32 (the fused qkv: q_heads + 2 kv_heads heads of head_dim): a
// call's window must keep them below 2^31.
struct ThdWorkspaceModel {
  int64_t bytes_per_token = 0;
  int64_t bound_bytes = 0;
  int64_t token_elements = 0;
};

// One call: sequences [first, first + count) of the micro-batch, whose tokens are
// [first_token, first_token + tokens); bucketed to `sequences` (the extra ones empty) of at
// most `sequence_tokens` each, asking `workspace_bytes`.
struct ThdGroup {
  int64_t first = 0, count = 0;
  int64_t first_token = 0, tokens = 0;
  int64_t sequences = 0, sequence_tokens = 0;
  int64_t workspace_bytes = 0;
};

// cuDNN's deterministic SDPA backward workspace, as `loom plan` models it
// (plan/plan_constants.h sdpa_backward_workspace_dq_units): 33 fp32 dQ accumulators of a
// call's bucketed tokens, heads narrower than 128 counted as 128 wide.
inline constexpr double kSdpaBackwardDqUnits = 33.0;
// The most a THD backward call asks where its sequences allow: what the plain path's one-row
// call asks at 8,192 tokens and 32 q heads (4.126 GiB, cuDNN's own figure), so that
// isolated rows of the seed's shapes need no more workspace than packed ones.
inline constexpr int64_t kThdBackwardWorkspaceBoundBytes = int64_t{4} << 30;
// The model of the CUDA engine's calls for these heads (units: kSdpaBackwardDqUnits unless
// the plan calibrates them).
ThdWorkspaceModel thd_workspace_model(const HeadLayout& heads, double dq_units = kSdpaBackwardDqUnits,
                                      int64_t bound_bytes = kThdBackwardWorkspaceBoundBytes);

// The bucketed sequence count of a call of `count` sequences of at most `sequence_tokens`
// (already bucketed) tokens: a power of two of at least 8 (a few graphs a run), the floor
// halved, down to 1, while it alone would ask more than the bound (a long sequence then runs
// alone, not as one of 8).
int64_t thd_bucketed_sequences(int64_t count, int64_t sequence_tokens, const ThdWorkspaceModel& model);

// The calls of a THD backward over the sequences whose token offsets are `offsets` (rows + 1
// values, from 0), in order; each takes as many further sequences as keep it within the bound
// and its offsets within int32.
std::vector<ThdGroup> thd_backward_groups(std::span<const int32_t> offsets, const ThdWorkspaceModel& model);

}  // namespace loom
