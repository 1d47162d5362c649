#include "parallel/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
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

class NcclComm final : public Comm {
 public:
  NcclComm(ncclComm_t comm, std::string name, int rank, std::vector<int> world_ranks, int device,
           cudaStream_t stream)
      : Comm(std::move(name), rank, std::move(world_ranks)), comm_(comm), device_(device), stream_(stream) {
    set_device(device_, describe());
    cudaError_t e = cudaMalloc(&scratch_, sizeof(int32_t));
    if (e != cudaSuccess) {
      ncclCommAbort(comm_);
      throw_runtime_failure(describe(), std::string("cudaMalloc: ") + cudaGetErrorString(e));
    }
  }

  ~NcclComm() override {
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
    cudaFree(scratch_);
  }

  void all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) override {
    check_dtype(dtype, "all_reduce");
    run("all_reduce (" + std::to_string(count) + " " + dtype_name(dtype) + ")", timeout, others(),
        [&] { return ncclAllReduce(data, data, count, nccl_type(dtype), ncclSum, comm_, stream_); });
  }

  void reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                          CommTimeout timeout) override {
    check_dtype(dtype, "reduce_scatter");
    run("reduce_scatter (" + std::to_string(recv_count) + " " + dtype_name(dtype) + ")", timeout, others(),
        [&] { return ncclReduceScatter(send, recv, recv_count, nccl_type(dtype), ncclSum, comm_, stream_); });
  }

  void all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                  CommTimeout timeout) override {
    check_dtype(dtype, "all_gather");
    run("all_gather (" + std::to_string(send_count) + " " + dtype_name(dtype) + ")", timeout, others(),
        [&] { return ncclAllGather(send, recv, send_count, nccl_type(dtype), comm_, stream_); });
  }

  void broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) override {
    check_dtype(dtype, "broadcast");
    check_peer(root, "broadcast");
    std::vector<int> waited = root == rank() ? others() : std::vector<int>{root};
    run("broadcast (" + std::to_string(count) + " " + dtype_name(dtype) + ")", timeout, waited,
        [&] { return ncclBroadcast(data, data, count, nccl_type(dtype), root, comm_, stream_); });
  }

  void barrier(CommTimeout timeout) override {
    run("barrier", timeout, others(),
        [&] { return ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_); });
  }

  void exchange(std::span<const P2POp> ops, CommTimeout timeout) override {
    std::vector<int> peers;
    for (const P2POp& op : ops) {
      check_dtype(op.dtype, op.kind == P2POp::Kind::send ? "send" : "recv");
      check_peer(op.peer, op.kind == P2POp::Kind::send ? "send" : "recv");
      if (std::find(peers.begin(), peers.end(), op.peer) == peers.end()) peers.push_back(op.peer);
    }
    std::string what = "exchange of " + std::to_string(ops.size()) + " transfer(s)";
    run(what, timeout, peers, [&] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (const P2POp& op : ops) {
        r = op.kind == P2POp::Kind::send
                ? ncclSend(op.data, op.count, nccl_type(op.dtype), op.peer, comm_, stream_)
                : ncclRecv(op.data, op.count, nccl_type(op.dtype), op.peer, comm_, stream_);
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
    ncclResult_t r = ncclCommSplit(comm_, color, key, &child, &config);
    const std::string where = describe() + ": split '" + name + "'";
    if (r != ncclSuccess && r != ncclInProgress) throw_runtime_failure(where, nccl_error(comm_, r));
    std::string state = wait_enqueued(comm_, deadline);
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
    return std::make_unique<NcclComm>(child, name, key, world_ranks, device_, stream_);
  }

 private:
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
    if (aborted_)
      throw_runtime_failure(describe() + ": " + what, "the communicator was aborted by an earlier failure");
  }

  [[noreturn]] void abort_with(const std::string& message) {
    ncclCommAbort(comm_);
    aborted_ = true;
    throw RuntimeFailure(message);
  }

  // Issues one call, then waits until NCCL has enqueued it and the stream has run it.
  template <typename Issue>
  void run(const std::string& what, CommTimeout timeout, const std::vector<int>& waited, Issue issue) {
    live(what);
    set_device(device_, describe());
    const auto deadline = Clock::now() + timeout;
    const std::string where = describe() + ": " + what;
    ncclResult_t r = issue();
    if (r != ncclSuccess && r != ncclInProgress) abort_with(where + ": " + nccl_error(comm_, r));
    auto timed_out = [&] {
      abort_with(where + " timed out after " + ms(timeout) + " waiting for " + describe_peers(waited));
    };
    std::string state = wait_enqueued(comm_, deadline);
    if (state == "timeout") timed_out();
    if (!state.empty()) abort_with(where + ": " + state);
    while (true) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) abort_with(where + ": " + cudaGetErrorString(e));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress)
        abort_with(where + ": " + nccl_error(comm_, async));
      if (Clock::now() >= deadline) timed_out();
      std::this_thread::sleep_for(kPoll);
    }
  }

  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_;
  void* scratch_ = nullptr;  // barrier's one int32
  bool aborted_ = false;
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
  return std::make_unique<NcclComm>(comm, "world", rank, world_ranks, device,
                                    static_cast<cudaStream_t>(stream));
}

}  // namespace loom
