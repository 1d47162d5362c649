#include "parallel/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <thread>

#include "core/error.h"

namespace loom {

namespace {

static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<NcclUniqueId>, "NcclUniqueId must hold ncclUniqueId");

using Clock = std::chrono::steady_clock;

// Polling interval of a pending call: short against a collective's milliseconds, long
// enough not to keep a core busy.
constexpr auto kPoll = std::chrono::microseconds(20);
// How long a communicator may take to finalize when it is destroyed before it is aborted.
constexpr auto kDestroyLimit = std::chrono::seconds(10);

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::f64: return ncclFloat64;
    default: LOOM_ASSERT(false, "no NCCL type for this dtype");
  }
  return ncclFloat32;
}

std::string ms(CommTimeout t) {
  return std::to_string(t.count()) + " ms";
}

std::string nccl_error(ncclComm_t comm, ncclResult_t result) {
  std::string s = ncclGetErrorString(result);
  const char* last = comm ? ncclGetLastError(comm) : nullptr;
  if (last && *last) s += std::string(" (") + last + ")";
  return s;
}

void set_device(int device, const std::string& where) {
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) throw_runtime_failure(where, std::string("cudaSetDevice: ") + cudaGetErrorString(e));
}

// Waits until `comm` leaves ncclInProgress (non-blocking communicators return before
// work is enqueued). Returns "" when it has, "timeout" on the deadline, else NCCL's error.
std::string wait_enqueued(ncclComm_t comm, Clock::time_point deadline) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return "ncclCommGetAsyncError: " + nccl_error(comm, r);
    if (state == ncclSuccess) return "";
    if (state != ncclInProgress) return nccl_error(comm, state);
    if (Clock::now() >= deadline) return "timeout";
    std::this_thread::sleep_for(kPoll);
  }
}

// A group's communicator, shared by its NcclComm and the stream-ordered NcclComms made from
// it (on_stream), since NCCL runs one communicator's operations in the order they are issued
// whatever their stream: one abort ends them all, and the collectives queued without a host
// wait are listed here, oldest first, until the host sees them finish.
class NcclGroup {
 public:
  NcclGroup(ncclComm_t comm, int device, const std::string& where) : comm_(comm), device_(device) {
    set_device(device_, where);
    cudaError_t e = cudaMalloc(&scratch_, sizeof(int32_t));
    if (e != cudaSuccess) {
      ncclCommAbort(comm_);
      throw_runtime_failure(where, std::string("cudaMalloc: ") + cudaGetErrorString(e));
    }
  }
  ~NcclGroup() {
    cudaSetDevice(device_);
    if (!aborted_) {
      // A non-blocking communicator finalizes asynchronously; one that cannot (a peer gone)
      // is aborted instead of holding up the exit.
      ncclResult_t r = ncclCommFinalize(comm_);
      bool finalized = (r == ncclSuccess || r == ncclInProgress) &&
                       wait_enqueued(comm_, Clock::now() + kDestroyLimit).empty();
      if (finalized)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    // An event whose work has not run yet (after an abort) is released once it has.
    for (const Queued& q : queued_) cudaEventDestroy(q.done);
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
    cudaFree(scratch_);
  }
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  ncclComm_t comm() const { return comm_; }
  int32_t* scratch() const { return static_cast<int32_t*>(scratch_); }
  bool aborted() const { return aborted_; }
  void abort() {
    ncclCommAbort(comm_);
    aborted_ = true;
  }

  // A collective queued on a stream without a host wait: `done` is recorded behind it.
  struct Queued {
    cudaEvent_t done = nullptr;
    std::string what;  // "all_gather #57 (4096 BF16)"
    std::vector<int> waited;
  };
  std::deque<Queued>& queued() { return queued_; }
  // The number of the next stream-ordered call, for its name in messages.
  int64_t next_call() { return ++calls_; }
  // An event for a new Queued entry, recycled from finished ones.
  cudaError_t take_event(cudaEvent_t* event) {
    if (spare_events_.empty()) return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
    *event = spare_events_.back();
    spare_events_.pop_back();
    return cudaSuccess;
  }
  // Drops the entries that have finished, oldest first, up to the first that has not;
  // returns whether any was dropped. An error other than "not ready" is left for the caller
  // to find on the front entry.
  bool retire_finished() {
    bool any = false;
    while (!queued_.empty() && cudaEventQuery(queued_.front().done) == cudaSuccess) {
      spare_events_.push_back(queued_.front().done);
      queued_.pop_front();
      any = true;
    }
    return any;
  }

 private:
  ncclComm_t comm_;
  int device_;
  void* scratch_ = nullptr;  // barrier's one int32
  bool aborted_ = false;
  std::deque<Queued> queued_;
  std::vector<cudaEvent_t> spare_events_;
  int64_t calls_ = 0;
};

class NcclComm final : public Comm {
 public:
  NcclComm(std::shared_ptr<NcclGroup> group, std::string name, int rank, std::vector<int> world_ranks,
           int device, cudaStream_t stream, bool stream_ordered)
      : Comm(std::move(name), rank, std::move(world_ranks)),
        group_(std::move(group)),
        device_(device),
        stream_(stream),
        stream_ordered_(stream_ordered) {}

  void all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) override {
    check_dtype(dtype, "all_reduce");
    run("all_reduce", "(" + std::to_string(count) + " " + dtype_name(dtype) + ")", timeout, others(),
        [&] { return ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, comm(), stream_); });
  }

  void reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                          CommTimeout timeout) override {
    check_dtype(dtype, "reduce_scatter");
    run("reduce_scatter", "(" + std::to_string(recv_count) + " " + dtype_name(dtype) + ")", timeout, others(),
        [&] {
          return ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), ncclSum, comm(), stream_);
        });
  }

  void all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                  CommTimeout timeout) override {
    check_dtype(dtype, "all_gather");
    run("all_gather", "(" + std::to_string(send_count) + " " + dtype_name(dtype) + ")", timeout, others(),
        [&] { return ncclAllGather(send, recv, send_count, nccl_type(dtype), comm(), stream_); });
  }

  void broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) override {
    check_dtype(dtype, "broadcast");
    check_peer(root, "broadcast");
    std::vector<int> waited = root == rank() ? others() : std::vector<int>{root};
    run("broadcast", "(" + std::to_string(count) + " " + dtype_name(dtype) + ")", timeout, waited,
        [&] { return ncclBroadcast(data, data, count, nccl_type(dtype), root, comm(), stream_); });
  }

  void barrier(CommTimeout timeout) override {
    run("barrier", "", timeout, others(), [&] {
      return ncclAllReduce(group_->scratch(), group_->scratch(), 1, ncclInt32, ncclSum, comm(), stream_);
    });
    // A barrier returns once every rank has entered it, on a stream-ordered Comm too.
    synchronize(timeout);
  }

  void exchange(std::span<const P2POp> ops, CommTimeout timeout) override {
    std::vector<int> peers;
    for (const P2POp& op : ops) {
      check_dtype(op.dtype, op.kind == P2POp::Kind::send ? "send" : "recv");
      check_peer(op.peer, op.kind == P2POp::Kind::send ? "send" : "recv");
      if (std::find(peers.begin(), peers.end(), op.peer) == peers.end()) peers.push_back(op.peer);
    }
    run("exchange", "of " + std::to_string(ops.size()) + " transfer(s)", timeout, peers, [&] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (const P2POp& op : ops) {
        r = op.kind == P2POp::Kind::send
                ? ncclSend(op.data, op.count, nccl_type(op.dtype), op.peer, comm(), stream_)
                : ncclRecv(op.data, op.count, nccl_type(op.dtype), op.peer, comm(), stream_);
        if (r != ncclSuccess && r != ncclInProgress) {
          ncclGroupEnd();
          return r;
        }
      }
      return ncclGroupEnd();
    });
  }

  std::unique_ptr<Comm> split(const std::vector<int>& members, const std::string& name,
                              CommTimeout timeout) override {
    check_split_members(members);
    live("split");
    set_device(device_, describe());
    const auto deadline = Clock::now() + timeout;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    int color = members.empty() ? NCCL_SPLIT_NOCOLOR : members.front();
    int key = members.empty()
                  ? 0
                  : static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    ncclComm_t child = nullptr;
    ncclResult_t r = ncclCommSplit(comm(), color, key, &child, &config);
    const std::string where = describe() + ": split '" + name + "'";
    if (r != ncclSuccess && r != ncclInProgress) throw_runtime_failure(where, nccl_error(comm(), r));
    std::string state = wait_enqueued(comm(), deadline);
    if (state.empty() && child) state = wait_enqueued(child, deadline);
    if (!state.empty()) {
      if (child) ncclCommAbort(child);
      abort_with(where + (state == "timeout"
                              ? " timed out after " + ms(timeout) + " waiting for " + describe_peers(others())
                              : ": " + state));
    }
    if (members.empty()) return nullptr;
    std::vector<int> world_ranks;
    for (int m : members) world_ranks.push_back(world_rank_of(m));
    auto group = std::make_shared<NcclGroup>(child, device_, where);
    return std::make_unique<NcclComm>(std::move(group), name, key, world_ranks, device_, stream_,
                                      stream_ordered_);
  }

  std::unique_ptr<Comm> on_stream(void* stream) override {
    return std::make_unique<NcclComm>(group_, name(), rank(), world_ranks(), device_,
                                      static_cast<cudaStream_t>(stream), true);
  }

  bool stream_ordered() const override { return stream_ordered_; }

  void synchronize(CommTimeout timeout) override {
    if (!stream_ordered_) return;
    live("synchronize");
    set_device(device_, describe());
    std::deque<NcclGroup::Queued>& queued = group_->queued();
    auto progress = Clock::now();
    while (!queued.empty()) {
      if (group_->retire_finished()) {
        progress = Clock::now();
        continue;
      }
      const NcclGroup::Queued& front = queued.front();
      const std::string where = describe() + ": stream-ordered " + front.what;
      cudaError_t e = cudaEventQuery(front.done);
      if (e == cudaSuccess) continue;  // it finished since retire_finished looked
      if (e != cudaErrorNotReady) abort_with(where + ": " + cudaGetErrorString(e));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm(), &async);
      if (async != ncclSuccess && async != ncclInProgress)
        abort_with(where + ": " + nccl_error(comm(), async));
      if (Clock::now() - progress >= timeout) {
        const size_t behind = queued.size() - 1;
        abort_with(where + " did not finish within " + ms(timeout) + " waiting for " +
                   describe_peers(front.waited) +
                   (behind ? " (" + std::to_string(behind) + " more collective(s) queued behind it)" : ""));
      }
      std::this_thread::sleep_for(kPoll);
    }
    // What follows the last collective is this rank's own work: it cannot wait on a peer.
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) abort_with(describe() + ": synchronize: " + cudaGetErrorString(e));
  }

 private:
  ncclComm_t comm() const { return group_->comm(); }

  std::vector<int> others() const {
    std::vector<int> out;
    for (int r = 0; r < size(); ++r)
      if (r != rank()) out.push_back(r);
    return out;
  }

  std::string describe_peers(const std::vector<int>& peers) const {
    if (peers.empty()) return "no peer (this rank alone)";
    std::string s;
    for (size_t i = 0; i < peers.size(); ++i) s += (i ? ", " : "") + describe_peer(peers[i]);
    return s;
  }

  void live(const std::string& what) const {
    if (group_->aborted())
      throw_runtime_failure(describe() + ": " + what, "the communicator was aborted by an earlier failure");
  }

  [[noreturn]] void abort_with(const std::string& message) {
    group_->abort();
    throw RuntimeFailure(message);
  }

  // Issues one call and waits until NCCL has enqueued it; then, on a stream-ordered Comm,
  // records it for synchronize and returns, else waits until the stream has run it.
  // `op` and `detail` name it ("all_reduce", "(4 F32)").
  template <typename Issue>
  void run(const char* op, const std::string& detail, CommTimeout timeout, const std::vector<int>& waited,
           Issue issue) {
    const std::string what = std::string(op) + (detail.empty() ? "" : " " + detail);
    live(what);
    set_device(device_, describe());
    const auto deadline = Clock::now() + timeout;
    const std::string where = describe() + ": " + what;
    ncclResult_t r = issue();
    if (r != ncclSuccess && r != ncclInProgress) abort_with(where + ": " + nccl_error(comm(), r));
    auto timed_out = [&] {
      abort_with(where + " timed out after " + ms(timeout) + " waiting for " + describe_peers(waited));
    };
    // Enqueueing can wait on the peers too (NCCL connects a kind of operation lazily, on
    // its first use).
    std::string state = wait_enqueued(comm(), deadline);
    if (state == "timeout") timed_out();
    if (!state.empty()) abort_with(where + ": " + state);
    if (stream_ordered_) {
      queue(op, detail, waited);
      return;
    }
    while (true) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) abort_with(where + ": " + cudaGetErrorString(e));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm(), &async);
      if (async != ncclSuccess && async != ncclInProgress)
        abort_with(where + ": " + nccl_error(comm(), async));
      if (Clock::now() >= deadline) timed_out();
      std::this_thread::sleep_for(kPoll);
    }
  }

  // Records an event behind a stream-ordered call, so that synchronize can tell which
  // collective a stuck stream is waiting in.
  void queue(const char* op, const std::string& detail, const std::vector<int>& waited) {
    group_->retire_finished();
    NcclGroup::Queued q;
    q.what =
        std::string(op) + " #" + std::to_string(group_->next_call()) + (detail.empty() ? "" : " " + detail);
    q.waited = waited;
    cudaError_t e = group_->take_event(&q.done);
    if (e == cudaSuccess) e = cudaEventRecord(q.done, stream_);
    if (e != cudaSuccess) {
      if (q.done) cudaEventDestroy(q.done);
      abort_with(describe() + ": " + q.what + ": " + cudaGetErrorString(e));
    }
    group_->queued().push_back(std::move(q));
  }

  std::shared_ptr<NcclGroup> group_;
  int device_;
  cudaStream_t stream_;
  bool stream_ordered_;
};

}  // namespace

NcclUniqueId nccl_unique_id() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) throw_runtime_failure("ncclGetUniqueId", ncclGetErrorString(r));
  NcclUniqueId out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

std::unique_ptr<Comm> nccl_comm_create(const NcclUniqueId& id, int rank, int size, int device, void* stream,
                                       CommTimeout timeout) {
  const std::string where = "NCCL world rank " + std::to_string(rank) + " of " + std::to_string(size);
  set_device(device, where);
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), id.size());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, uid, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    throw_runtime_failure(where, "ncclCommInitRankConfig: " + nccl_error(comm, r));
  }
  std::string state = wait_enqueued(comm, Clock::now() + timeout);
  if (!state.empty()) {
    ncclCommAbort(comm);
    throw_runtime_failure(where, state == "timeout" ? "initialisation timed out after " + ms(timeout) +
                                                          " waiting for the other ranks"
                                                    : "ncclCommInitRankConfig: " + state);
  }
  std::vector<int> world_ranks(static_cast<size_t>(size));
  for (int i = 0; i < size; ++i) world_ranks[static_cast<size_t>(i)] = i;
  auto group = std::make_shared<NcclGroup>(comm, device, where);
  return std::make_unique<NcclComm>(std::move(group), "world", rank, world_ranks, device,
                                    static_cast<cudaStream_t>(stream), false);
}

}  // namespace loom
