// How much host memory this process may still take: a run that copies its whole state to the
// host (a checkpoint, a resume) checks first, so that it ends with a message naming the sizes
// rather than being killed by the kernel's out-of-memory killer mid-run.
#pragma once

#include <cstdint>

namespace loom {

// Linux's MemAvailable (/proc/meminfo): what can be allocated without swapping, page cache
// it would reclaim included. -1 where it cannot be read (not Linux).
//
// Test hook: LOOM_TEST_HOST_AVAILABLE_BYTES=N stands in for it (tests/train/test_faults.cpp,
// tests/cli/test_cli.cpp). Nothing else reads it.
int64_t host_memory_available_bytes();

}  // namespace loom
