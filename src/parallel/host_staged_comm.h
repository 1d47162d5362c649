// HostStagedComm: a Comm for GPU ranks that share one GPU. NCCL refuses two ranks on one
// device, so the GPU parallel engine is tested on one GPU (threads or processes as ranks)
// through this: every call copies its device buffers to host memory, runs the inner host
// Comm (InProcessComm, SocketComm) on them and copies the results back. Host buffers pass
// straight through. Slow (every byte crosses PCIe twice) and meant for tests and the
// LOOM_TEST_STAGED_DEVICE_COMM switch of `loom train`, never for speed.
//
// Like NcclComm, a call reads device buffers as they are when it is made: the caller
// finishes the work that writes them first (the engine waits for its stream). A call returns
// with its results in place. Compiled with the CUDA backend.
#pragma once

#include <memory>

#include "parallel/comm.h"

namespace loom {

// Over `inner` (not owned; it must outlive the result). Splits wrap the inner group's splits.
std::unique_ptr<Comm> host_staged_comm_create(Comm& inner);

}  // namespace loom
