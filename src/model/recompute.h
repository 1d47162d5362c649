// Activation recompute: which layers keep only their input through the forward and run
// their forward again inside the backward (Megatron's --recompute-granularity, -method and
// -num-layers). Recomputing runs the same ops on the same inputs, so the loss and every
// gradient are bit for bit those of a run that keeps everything.
#pragma once

#include <cstdint>
#include <vector>

namespace loom {

struct RecomputePolicy {
  enum class Granularity { none, full, selective };
  Granularity granularity = Granularity::none;
  // full: uniform splits the layers into chunks of num_layers layers, each keeping only its
  // input; block recomputes the first num_layers layers one by one and keeps the rest.
  // selective: every layer drops its attention core (q/k-normed and rotated qkv, attention
  // output and log-sum-exp) and recomputes it from the kept qkv projection.
  bool block = false;
  int64_t num_layers = 1;
};

// A run of consecutive layers [begin, end) whose activations are recomputed together.
struct LayerChunk {
  int64_t begin = 0;
  int64_t end = 0;
};

// The chunks of full recompute over `layers` layers; empty for none and selective.
std::vector<LayerChunk> recompute_chunks(const RecomputePolicy& policy, int64_t layers);

}  // namespace loom
