#include "parallel/in_process_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "parallel/rank_order_sum.h"

namespace loom {

namespace detail {

// What every group of one world shares: whether it has failed, and why.
struct InProcessWorld {
  std::mutex mu;
  bool failed = false;
  std::string failure;

  // Records the first failure; later ones are consequences of it.
  void fail(const std::string& message) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed) {
      failed = true;
      failure = message;
    }
  }
  bool has_failed(std::string* message) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed && message) *message = failure;
    return failed;
  }
};

struct P2PMessage {
  const void* data = nullptr;
  size_t count = 0;
  DType dtype = DType::f32;
  bool done = false;
};

struct InProcessGroup {
  std::shared_ptr<InProcessWorld> world;
  std::string name;
  std::vector<int> world_ranks;

  // Everything below is guarded by mu. Lock order: group mu, then world mu.
  std::mutex mu;
  std::condition_variable cv;
  // phase[r]: how many phases rank r has entered. Collective n (from 0) has phases 2n + 1
  // (inputs published) and 2n + 2 (inputs read); a rank waits in a phase until every
  // rank's count has reached it, so the ranks still missing are those below it.
  std::vector<uint64_t> phase;
  std::vector<const void*> posted;  // rank r's Collective while it is in a collective
  std::map<std::pair<int, int>, std::deque<P2PMessage*>> mailbox;  // (src, dst) → pending sends
  struct SplitSlot {
    std::shared_ptr<InProcessGroup> group;
    size_t takers_left = 0;
  };
  std::map<std::pair<uint64_t, int>, SplitSlot> splits;  // (phase, first member) → new group

  InProcessGroup(std::shared_ptr<InProcessWorld> world_state, std::string group_name, std::vector<int> ranks)
      : world(std::move(world_state)),
        name(std::move(group_name)),
        world_ranks(std::move(ranks)),
        phase(world_ranks.size(), 0),
        posted(world_ranks.size(), nullptr) {}
};

}  // namespace detail

namespace {

using Clock = std::chrono::steady_clock;
using detail::InProcessGroup;
using detail::P2PMessage;

// Waits are sliced so that a failure marked elsewhere in the world (another group's
// timeout, abort()) is seen within this long.
constexpr auto kFailurePollSlice = std::chrono::milliseconds(10);

std::string ms(CommTimeout timeout) {
  return std::to_string(timeout.count()) + " ms";
}

std::string size_str(size_t count, DType dtype) {
  return std::to_string(count) + " " + dtype_name(dtype);
}

}  // namespace

struct InProcessComm::Collective {
  enum class Kind : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, barrier, split };
  Kind kind = Kind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;  // all_reduce/broadcast: elements; reduce_scatter: recv count; all_gather: send count
  DType dtype = DType::f32;
  int root = 0;
  const std::vector<int>* members = nullptr;
  const std::string* split_name = nullptr;
  std::shared_ptr<InProcessGroup> split_result;

  std::string label(uint64_t number) const {
    static const char* const names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                        "broadcast",  "barrier",        "split"};
    std::string s = std::string(names[static_cast<int>(kind)]) + " #" + std::to_string(number);
    if (kind != Kind::barrier && kind != Kind::split) s += " (" + size_str(count, dtype) + ")";
    return s;
  }
  bool same_call(const Collective& other) const {
    return kind == other.kind && count == other.count && dtype == other.dtype && root == other.root;
  }
};

InProcessComm::InProcessComm(std::shared_ptr<detail::InProcessGroup> group, int rank)
    : Comm(group->name, rank, group->world_ranks), group_(std::move(group)) {}

InProcessComm::~InProcessComm() = default;

std::vector<std::unique_ptr<InProcessComm>> InProcessComm::create_world(int size) {
  LOOM_ASSERT(size >= 1, "a world needs at least one rank");
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  auto group = std::make_shared<InProcessGroup>(std::make_shared<detail::InProcessWorld>(), "world", ranks);
  std::vector<std::unique_ptr<InProcessComm>> comms;
  for (int r = 0; r < size; ++r) comms.push_back(std::unique_ptr<InProcessComm>(new InProcessComm(group, r)));
  return comms;
}

void InProcessComm::abort(const std::string& reason) {
  group_->world->fail(describe() + ": " + reason);
  std::lock_guard<std::mutex> lock(group_->mu);
  group_->cv.notify_all();
}

void InProcessComm::run_collective(Collective& op, CommTimeout timeout) {
  InProcessGroup& g = *group_;
  const size_t self = static_cast<size_t>(rank());
  const size_t n = static_cast<size_t>(size());
  const auto deadline = Clock::now() + timeout;
  uint64_t published = 0;
  std::string label;

  // Phase 1: publish and wait for every rank (times out; failures elsewhere stop it).
  {
    std::unique_lock<std::mutex> lock(g.mu);
    published = g.phase[self] + 1;
    label = op.label((published + 1) / 2);
    g.posted[self] = &op;
    g.phase[self] = published;
    g.cv.notify_all();
    auto all_arrived = [&] {
      return std::all_of(g.phase.begin(), g.phase.end(), [&](uint64_t p) { return p >= published; });
    };
    while (!all_arrived()) {
      std::string failure;
      // A failure elsewhere comes first: a rank that timed out before this one has
      // withdrawn, and would be listed as missing.
      bool failed_elsewhere = g.world->has_failed(&failure);
      bool timed_out = !failed_elsewhere && Clock::now() >= deadline;
      if (timed_out || failed_elsewhere) {
        std::string missing;
        for (size_t r = 0; r < n; ++r)
          if (g.phase[r] < published)
            missing += (missing.empty() ? "" : ", ") + describe_peer(static_cast<int>(r));
        // Withdraw, so that no rank arriving later reads this rank's buffers.
        g.phase[self] = published - 1;
        g.posted[self] = nullptr;
        if (!timed_out) throw RuntimeFailure(describe() + ": " + label + " stopped: " + failure);
        std::string message =
            describe() + ": " + label + " timed out after " + ms(timeout) + " waiting for " + missing;
        g.world->fail(message);
        g.cv.notify_all();
        throw RuntimeFailure(message);
      }
      g.cv.wait_until(lock, std::min(deadline, Clock::now() + kFailurePollSlice));
    }
  }

  // Every rank is here with its inputs published: compute this rank's result. Nothing in
  // this stretch blocks, so the wait of phase 2 is bounded and has no timeout.
  std::vector<const Collective*> all(n);
  for (size_t r = 0; r < n; ++r) all[r] = static_cast<const Collective*>(g.posted[r]);
  std::string error;
  for (size_t r = 0; r < n && error.empty(); ++r)
    if (!all[r]->same_call(op))
      error = describe() + ": mismatched collectives: this rank called " + label + ", " +
              describe_peer(static_cast<int>(r)) + " called " + all[r]->label((published + 1) / 2);
  std::vector<uint8_t> result;
  if (error.empty()) {
    std::vector<const void*> inputs(n);
    for (size_t r = 0; r < n; ++r) inputs[r] = all[r]->send;
    const size_t elem = dtype_size(op.dtype);
    switch (op.kind) {
      case Collective::Kind::all_reduce:
        result.resize(op.count * elem);
        sum_in_rank_order(result.data(), inputs, 0, op.count, op.dtype);
        break;
      case Collective::Kind::reduce_scatter:
        result.resize(op.count * elem);
        sum_in_rank_order(result.data(), inputs, self * op.count, op.count, op.dtype);
        break;
      case Collective::Kind::all_gather:
        result.resize(n * op.count * elem);
        for (size_t r = 0; r < n; ++r)
          std::memcpy(result.data() + r * op.count * elem, inputs[r], op.count * elem);
        break;
      case Collective::Kind::broadcast:
        result.resize(op.count * elem);
        std::memcpy(result.data(), inputs[static_cast<size_t>(op.root)], op.count * elem);
        break;
      case Collective::Kind::barrier: break;
      case Collective::Kind::split: {
        const std::vector<int>& mine = *op.members;
        for (int m : mine)
          if (*all[static_cast<size_t>(m)]->members != mine ||
              *all[static_cast<size_t>(m)]->split_name != *op.split_name)
            error = describe() + ": split '" + *op.split_name + "': " + describe_peer(m) +
                    " passed other members or another name for the same group";
        if (!error.empty() || mine.empty()) break;
        std::lock_guard<std::mutex> lock(g.mu);
        auto key = std::make_pair(published, mine.front());
        auto [slot, created] = g.splits.try_emplace(key);
        if (created) {
          std::vector<int> world_ranks;
          for (int m : mine) world_ranks.push_back(world_rank_of(m));
          slot->second.group = std::make_shared<InProcessGroup>(g.world, *op.split_name, world_ranks);
          slot->second.takers_left = mine.size();
        }
        op.split_result = slot->second.group;
        if (--slot->second.takers_left == 0) g.splits.erase(slot);
        break;
      }
    }
  }

  // Phase 2: wait until every rank has read the others' inputs, then write the result.
  {
    std::unique_lock<std::mutex> lock(g.mu);
    g.phase[self] = published + 1;
    g.cv.notify_all();
    g.cv.wait(lock, [&] {
      return std::all_of(g.phase.begin(), g.phase.end(), [&](uint64_t p) { return p >= published + 1; });
    });
    g.posted[self] = nullptr;
  }
  if (!error.empty()) {
    g.world->fail(error);
    throw RuntimeFailure(error);
  }
  if (!result.empty()) std::memcpy(op.recv, result.data(), result.size());
}

void InProcessComm::all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) {
  check_dtype(dtype, "all_reduce");
  Collective op;
  op.kind = Collective::Kind::all_reduce;
  op.send = data;
  op.recv = data;
  op.count = count;
  op.dtype = dtype;
  run_collective(op, timeout);
}

void InProcessComm::reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                                       CommTimeout timeout) {
  check_dtype(dtype, "reduce_scatter");
  Collective op;
  op.kind = Collective::Kind::reduce_scatter;
  op.send = send;
  op.recv = recv;
  op.count = recv_count;
  op.dtype = dtype;
  run_collective(op, timeout);
}

void InProcessComm::all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                               CommTimeout timeout) {
  check_dtype(dtype, "all_gather");
  Collective op;
  op.kind = Collective::Kind::all_gather;
  op.send = send;
  op.recv = recv;
  op.count = send_count;
  op.dtype = dtype;
  run_collective(op, timeout);
}

void InProcessComm::broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) {
  check_dtype(dtype, "broadcast");
  check_peer(root, "broadcast");
  Collective op;
  op.kind = Collective::Kind::broadcast;
  op.send = data;
  op.recv = data;
  op.count = count;
  op.dtype = dtype;
  op.root = root;
  run_collective(op, timeout);
}

void InProcessComm::barrier(CommTimeout timeout) {
  Collective op;
  op.kind = Collective::Kind::barrier;
  run_collective(op, timeout);
}

std::unique_ptr<Comm> InProcessComm::split(const std::vector<int>& members, const std::string& name,
                                           CommTimeout timeout) {
  check_split_members(members);
  Collective op;
  op.kind = Collective::Kind::split;
  op.members = &members;
  op.split_name = &name;
  run_collective(op, timeout);
  if (members.empty()) return nullptr;
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  return std::unique_ptr<Comm>(new InProcessComm(op.split_result, new_rank));
}

void InProcessComm::exchange(std::span<const P2POp> ops, CommTimeout timeout) {
  InProcessGroup& g = *group_;
  const int self = rank();
  const auto deadline = Clock::now() + timeout;
  std::vector<P2PMessage> sends;
  sends.reserve(ops.size());
  for (const P2POp& op : ops) {
    check_dtype(op.dtype, op.kind == P2POp::Kind::send ? "send" : "recv");
    check_peer(op.peer, op.kind == P2POp::Kind::send ? "send" : "recv");
  }

  std::unique_lock<std::mutex> lock(g.mu);
  // Takes this call's unreceived sends back out of the mailboxes before it throws, so that
  // no peer reads a buffer the caller is about to free.
  auto withdraw_and_throw = [&](const std::string& message, bool first_failure) {
    for (size_t i = 0, s = 0; i < ops.size(); ++i) {
      if (ops[i].kind != P2POp::Kind::send) continue;
      auto& box = g.mailbox[{self, ops[i].peer}];
      box.erase(std::remove(box.begin(), box.end(), &sends[s]), box.end());
      ++s;
    }
    if (first_failure) g.world->fail(message);
    g.cv.notify_all();
    throw RuntimeFailure(message);
  };
  // Waits until ready(); throws on the deadline or a failure elsewhere. `what` names the
  // leg for the timeout message.
  auto wait_until_ready = [&](const std::function<bool()>& ready, const std::function<std::string()>& what) {
    while (!ready()) {
      std::string failure;
      if (g.world->has_failed(&failure))
        withdraw_and_throw(describe() + ": " + what() + " stopped: " + failure, false);
      if (Clock::now() >= deadline)
        withdraw_and_throw(describe() + ": " + what() + " timed out after " + ms(timeout), true);
      g.cv.wait_until(lock, std::min(deadline, Clock::now() + kFailurePollSlice));
    }
  };

  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::send) continue;
    sends.push_back(P2PMessage{op.data, op.count, op.dtype, false});
    g.mailbox[{self, op.peer}].push_back(&sends.back());
  }
  g.cv.notify_all();

  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::recv) continue;
    auto& box = g.mailbox[{op.peer, self}];
    auto what = [&] { return "recv of " + size_str(op.count, op.dtype) + " from " + describe_peer(op.peer); };
    wait_until_ready([&] { return !box.empty(); }, what);
    P2PMessage* message = box.front();
    if (message->count != op.count || message->dtype != op.dtype)
      withdraw_and_throw(
          describe() + ": " + what() + " matched a send of " + size_str(message->count, message->dtype),
          true);
    std::memcpy(op.data, message->data, comm_bytes(op.count, op.dtype));
    box.pop_front();
    message->done = true;
    g.cv.notify_all();
  }

  for (size_t i = 0, s = 0; i < ops.size(); ++i) {
    if (ops[i].kind != P2POp::Kind::send) continue;
    P2PMessage& message = sends[s++];
    auto what = [&] {
      return "send of " + size_str(ops[i].count, ops[i].dtype) + " to " + describe_peer(ops[i].peer) +
             " (not received)";
    };
    wait_until_ready([&] { return message.done; }, what);
  }
}

void run_in_process(int size, const std::function<void(Comm& world)>& body) {
  auto comms = InProcessComm::create_world(size);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      InProcessComm& comm = *comms[static_cast<size_t>(r)];
      try {
        body(comm);
      } catch (const std::exception& e) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        comm.abort(std::string("rank failed: ") + e.what());
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (!first) first = std::current_exception();
        }
        comm.abort("rank failed with a non-standard exception");
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace loom
