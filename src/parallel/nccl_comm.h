// NcclComm: the Comm of one process per GPU, over NCCL; buffers are device memory.
// Compiled when the build finds NCCL's headers and library (LOOM_HAVE_NCCL = 1).
//
// Communicators are non-blocking (ncclConfig_t.blocking = 0), so that every call, the
// initialisation and splits included, can be given up: the call polls the communicator's
// async state and then its stream, and when the timeout passes first it aborts the
// communicator (ncclCommAbort) and throws RuntimeFailure naming the group and the ranks
// waited for. Each call returns once its stream has finished the operation (and the work
// queued before it on that stream).
//
// on_stream(stream) gives a stream-ordered NcclComm over the same communicator: its calls
// return once NCCL has enqueued them on `stream` (a GPU engine's compute stream, or a
// communication stream ordered by events), so the device runs collectives and compute back
// to back without the host waiting in between. An event recorded behind each such call
// tells synchronize() which collective a stuck stream waits in; synchronize() bounds the
// wait by the timeout, counted from the last collective seen to finish, and aborts the
// communicator when it passes. Every NcclComm of one communicator (the group's and its
// stream-ordered ones) shares one abort and one list of queued collectives; NCCL runs a
// communicator's operations in the order they are issued, whatever their stream, so every
// rank must issue them in the same order.
//
// Sums follow NCCL's own order and rounding (ring or tree, by size), which does not
// change from run to run on the same topology, but is not InProcessComm's rank order.
//
// NVLink multicast (NVLS) must stay off on the lent machines: run with
// NCCL_NVLS_ENABLE=0 in the environment (docs/parallel.md). NcclComm does not set it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "parallel/comm.h"

namespace loom {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES): rank 0 makes one, the rendezvous carries it.
using NcclUniqueId = std::array<uint8_t, 128>;

// A new unique id (rank 0 only). Throws RuntimeFailure.
NcclUniqueId nccl_unique_id();

// Joins the NCCL world `id` names as rank `rank` of `size` on CUDA device `device`.
// `stream` is the cudaStream_t the calls run on (nullptr: the legacy default stream); it
// must outlive the Comm. Throws RuntimeFailure when the peers do not join within timeout.
std::unique_ptr<Comm> nccl_comm_create(const NcclUniqueId& id, int rank, int size, int device, void* stream,
                                       CommTimeout timeout);

}  // namespace loom
