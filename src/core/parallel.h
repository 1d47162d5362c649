// Host threads for the CPU backend.
//
// parallel_for splits [0, n) into contiguous chunks, one per worker. Every op that uses it
// partitions over outputs, so each output element is computed by one thread in a fixed
// order: results do not depend on the thread count (bitwise-exact resume relies on it).
#pragma once

#include <cstdint>
#include <functional>

namespace loom {

// Runs body(begin, end) over disjoint chunks covering [0, n); blocks until all finish.
// `grain` is the smallest chunk worth a thread.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// Number of worker threads (LOOM_NUM_THREADS, else the hardware's count).
int worker_count();

}  // namespace loom
