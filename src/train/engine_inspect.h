// What tests inspect an engine by (train/engine.h), beside the engine's own interface.
#pragma once

#include <vector>

#include "train/engine.h"

namespace loom {

// What tests inspect an engine by, gathered into full tensors laid out by the table on
// world rank 0 (collective: the other ranks get empty vectors): the fp32 masters, and the
// main grads as scaled so far.
std::vector<float> engine_masters(TrainEngine& engine);
std::vector<float> engine_grads(TrainEngine& engine);

}  // namespace loom
