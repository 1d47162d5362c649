// Comm: the collectives and point-to-point transfers of one group of ranks.
//
// Two implementations run the same TP/PP/DP code: InProcessComm (threads of one process
// as ranks, host buffers; in_process_comm.h) and NcclComm (one process per GPU, device
// buffers; nccl_comm.h). Every call is collective over the group, except send/recv/
// exchange, which pair two ranks; every call returns when its result is in place (for
// NCCL: when the stream it ran on has finished it), except on a stream-ordered Comm
// (on_stream), whose calls return once queued on a device stream.
//
// Buffers are `count` elements of `dtype`, one of f32, bf16, i32, f64. Sums are exact
// in order for i32 (wrapping, as NCCL) and rounded as the implementation documents for the
// floating types.
//
// Every call takes a timeout. A peer that does not take part in time (dead, hung, or
// calling something else) makes the call throw RuntimeFailure naming the group, this rank
// and the peer ranks waited for, instead of hanging; the group is unusable afterwards.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace loom {

using CommTimeout = std::chrono::milliseconds;

// One leg of a batched point-to-point exchange. For a send, `data` is read; for a recv,
// written. `peer` is a rank of this group.
struct P2POp {
  enum class Kind : uint8_t { send, recv };
  Kind kind = Kind::send;
  void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::f32;
  int peer = 0;
};

class Comm {
 public:
  // `world_ranks[i]` is the world rank of this group's rank i (ascending).
  Comm(std::string name, int rank, std::vector<int> world_ranks);
  virtual ~Comm() = default;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(world_ranks_.size()); }
  const std::string& name() const { return name_; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  int world_rank_of(int group_rank) const;

  // data[j] = Σ_r data_r[j], r in rank order; in place. data: [count].
  virtual void all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) = 0;
  // recv[j] = Σ_r send_r[rank · recv_count + j]. send: [size · recv_count], recv: [recv_count].
  virtual void reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                                  CommTimeout timeout) = 0;
  // recv[r · send_count + j] = send_r[j]. send: [send_count], recv: [size · send_count].
  // send may be recv + rank · send_count (in place).
  virtual void all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                          CommTimeout timeout) = 0;
  // data = data_root on every rank. data: [count].
  virtual void broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) = 0;
  // Returns once every rank of the group has entered it.
  virtual void barrier(CommTimeout timeout) = 0;

  // All sends and recvs of `ops` run together (NCCL: one ncclGroupStart/End), so two ranks
  // may each send to and receive from the other in one call without deadlock. Sends and
  // recvs between one pair of ranks match in the order they are issued; counts and dtypes
  // of a matched pair must agree.
  virtual void exchange(std::span<const P2POp> ops, CommTimeout timeout) = 0;
  void send(const void* data, size_t count, DType dtype, int peer, CommTimeout timeout);
  void recv(void* data, size_t count, DType dtype, int peer, CommTimeout timeout);

  // Collective over this group, like ncclCommSplit: every rank passes the ranks (of this
  // group, ascending, itself included) of the new group it joins, or an empty list to join
  // none; every member of a new group must pass the same list. Returns this rank's new
  // group, named `name`, or nullptr for an empty list.
  virtual std::unique_ptr<Comm> split(const std::vector<int>& members, const std::string& name,
                                      CommTimeout timeout) = 0;

  // A Comm over the same group and communicator whose calls are queued in stream order on
  // the device stream `stream` (a cudaStream_t; it must outlive the result): each call reads
  // what the work queued before it on that stream wrote and returns once the operation is
  // queued, without the host waiting for it; the work queued after it sees its result. The
  // host must not read a result, or reuse a buffer a call reads, before `synchronize`. This
  // is how a GPU engine keeps the device busy across the collectives between two host
  // waits. nullptr where the implementation cannot (the host Comms; HostStagedComm, whose
  // calls go through host memory). Not collective: no communicator is made.
  virtual std::unique_ptr<Comm> on_stream(void* stream) {
    (void)stream;
    return nullptr;
  }
  // True for the Comms on_stream makes.
  virtual bool stream_ordered() const { return false; }
  // Blocks the host until everything queued on this Comm's stream, and every collective of
  // the communicator queued on any stream without a host wait, has run. A collective that
  // does not finish within `timeout` of the previous one finishing (or of the call, for the
  // first) — a peer dead, hung or calling something else — makes it abort the communicator
  // and throw RuntimeFailure naming the collective, the ranks waited for and how many more
  // are queued behind it, as a timed-out call does. Returns at once on other Comms, whose
  // calls have finished when they return.
  virtual void synchronize(CommTimeout timeout) { (void)timeout; }

  // "group 'tp' (world ranks [2, 3]) rank 0": how messages name this end of the group.
  std::string describe() const;
  // "rank 1 (world rank 3)": how messages name a peer.
  std::string describe_peer(int group_rank) const;

 protected:
  // Checks dtype and peer arguments; a wrong one is a programming error (aborts).
  void check_dtype(DType dtype, const char* op) const;
  void check_peer(int peer, const char* op) const;
  // Checks a split's member list the way every implementation needs it.
  void check_split_members(const std::vector<int>& members) const;

 private:
  std::string name_;
  int rank_;
  std::vector<int> world_ranks_;
};

// Size in bytes of `count` elements; only the Comm dtypes.
size_t comm_bytes(size_t count, DType dtype);

}  // namespace loom
