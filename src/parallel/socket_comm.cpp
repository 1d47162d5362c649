#include "parallel/socket_comm.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "parallel/rank_order_sum.h"
#include "parallel/tcp.h"

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

constexpr uint32_t kHelloMagic = 0x4b43534c;  // "LSCK"
constexpr size_t kHeaderBytes = 40;

enum class FrameType : uint8_t { collective = 1, p2p = 2, ack = 3 };
enum class Op : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, barrier, split };

const char* op_name(Op op) {
  static const char* const names[] = {"all_reduce", "reduce_scatter", "all_gather",
                                      "broadcast",  "barrier",        "split"};
  return names[static_cast<int>(op)];
}

std::string ms(CommTimeout timeout) {
  return std::to_string(timeout.count()) + " ms";
}

std::string size_str(size_t count, DType dtype) {
  return std::to_string(count) + " " + dtype_name(dtype);
}

// "all_reduce #3 (4 F32)", as InProcessComm labels its collectives.
std::string collective_label(Op op, uint64_t number, size_t count, DType dtype) {
  std::string s = std::string(op_name(op)) + " #" + std::to_string(number);
  if (op != Op::barrier && op != Op::split) s += " (" + size_str(count, dtype) + ")";
  return s;
}

int ms_left(Deadline deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Blocking-with-deadline transfers on a non-blocking socket, for the bootstrap. Return ""
// or why they failed.
std::string write_exact(int fd, const void* data, size_t len, Deadline deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::send(fd, p + done, len - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return std::strerror(errno);
    pollfd pf{fd, POLLOUT, 0};
    if (::poll(&pf, 1, ms_left(deadline)) == 0) return "timed out";
  }
  return "";
}

std::string read_exact(int fd, void* data, size_t len, Deadline deadline) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < len) {
    ssize_t n = ::recv(fd, p + done, len - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return "connection closed";
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return std::strerror(errno);
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, ms_left(deadline)) == 0) return "timed out";
  }
  return "";
}

// Non-blocking (the reader thread polls every peer), with the rendezvous's keep-alive and
// no-delay options.
void socket_configure(int fd) {
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  tcp_set_keepalive(fd);
}

// splitmix64's finaliser: split groups get ids from (parent id, collective number, first
// member), a tuple unique per group; 64 bits make a collision between the few groups of a
// job negligible.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

namespace detail {

// Every frame: this header, then payload_bytes of payload.
struct FrameHeader {
  FrameType type = FrameType::collective;
  Op op = Op::barrier;  // collective: which call
  DType dtype = DType::f32;
  int32_t root = 0;
  uint64_t group = 0;
  uint64_t seq = 0;  // collective: its number in the group; p2p, ack: the message's number
  uint64_t count = 0;
  uint64_t payload_bytes = 0;

  void encode(uint8_t* out) const {
    out[0] = static_cast<uint8_t>(type);
    out[1] = static_cast<uint8_t>(op);
    out[2] = static_cast<uint8_t>(dtype);
    out[3] = 0;
    std::memcpy(out + 4, &root, 4);
    std::memcpy(out + 8, &group, 8);
    std::memcpy(out + 16, &seq, 8);
    std::memcpy(out + 24, &count, 8);
    std::memcpy(out + 32, &payload_bytes, 8);
  }
  static FrameHeader decode(const uint8_t* in) {
    FrameHeader h;
    h.type = static_cast<FrameType>(in[0]);
    h.op = static_cast<Op>(in[1]);
    h.dtype = static_cast<DType>(in[2]);
    std::memcpy(&h.root, in + 4, 4);
    std::memcpy(&h.group, in + 8, 8);
    std::memcpy(&h.seq, in + 16, 8);
    std::memcpy(&h.count, in + 24, 8);
    std::memcpy(&h.payload_bytes, in + 32, 8);
    return h;
  }
};

struct Frame {
  FrameHeader header;
  std::vector<uint8_t> payload;
};

struct Connection {
  int fd = -1;
  std::mutex write_mu;  // one frame at a time on the wire
  // The reader thread's parse state.
  uint8_t header[kHeaderBytes] = {};
  size_t header_got = 0;
  Frame frame;
  size_t payload_got = 0;
  bool reading = true;
};

struct SocketTransport {
  int rank = 0;
  std::vector<std::unique_ptr<Connection>> peers;  // by world rank; nullptr for this rank
  int wake[2] = {-1, -1};
  std::thread reader;

  // Guarded by mu.
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<uint64_t, int, uint64_t>, Frame> collectives;  // (group, src, number)
  std::map<std::pair<uint64_t, int>, std::deque<Frame>> messages;    // (group, src) → p2p, in order
  std::set<std::tuple<uint64_t, int, uint64_t>> acks;                // (group, receiver, message)
  std::map<int, std::string> gone;                                   // world rank → why
  bool failed = false;
  std::string failure;

  // Records the first failure (mu held).
  void fail_locked(const std::string& message) {
    if (!failed) {
      failed = true;
      failure = message;
    }
    cv.notify_all();
  }

  void deliver(int src, Frame&& frame) {
    std::lock_guard<std::mutex> lock(mu);
    const FrameHeader& h = frame.header;
    switch (h.type) {
      case FrameType::collective: collectives[{h.group, src, h.seq}] = std::move(frame); break;
      case FrameType::p2p: messages[{h.group, src}].push_back(std::move(frame)); break;
      case FrameType::ack: acks.insert({h.group, src, h.seq}); break;
    }
    cv.notify_all();
  }

  void mark_gone(int src, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    gone.emplace(src, why);
    cv.notify_all();
  }

  // Reads what `c` has, delivering each complete frame; false once it closed or broke.
  bool read_available(int src, Connection& c) {
    while (true) {
      uint8_t* into;
      size_t want;
      if (c.header_got < kHeaderBytes) {
        into = c.header + c.header_got;
        want = kHeaderBytes - c.header_got;
      } else {
        into = c.frame.payload.data() + c.payload_got;
        want = c.frame.payload.size() - c.payload_got;
      }
      ssize_t n = ::recv(c.fd, into, want, 0);
      if (n == 0) {
        mark_gone(src, "its connection closed");
        return false;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
        mark_gone(src, std::string("its connection broke: ") + std::strerror(errno));
        return false;
      }
      if (c.header_got < kHeaderBytes) {
        c.header_got += static_cast<size_t>(n);
        if (c.header_got < kHeaderBytes) continue;
        c.frame.header = FrameHeader::decode(c.header);
        c.frame.payload.resize(c.frame.header.payload_bytes);
        c.payload_got = 0;
      } else {
        c.payload_got += static_cast<size_t>(n);
      }
      if (c.payload_got == c.frame.payload.size()) {
        deliver(src, std::move(c.frame));
        c.frame = Frame{};
        c.header_got = 0;
        c.payload_got = 0;
      }
    }
  }

  // The reader thread: drains every connection as data arrives, so that a sender never
  // waits on a full socket buffer whatever the receiving thread is doing.
  void read_loop() {
    while (true) {
      std::vector<pollfd> fds{{wake[0], POLLIN, 0}};
      std::vector<int> owners{-1};
      for (size_t r = 0; r < peers.size(); ++r)
        if (peers[r] && peers[r]->reading) {
          fds.push_back({peers[r]->fd, POLLIN, 0});
          owners.push_back(static_cast<int>(r));
        }
      int n = ::poll(fds.data(), fds.size(), -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || (fds[0].revents & POLLIN)) return;
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        Connection& c = *peers[static_cast<size_t>(owners[i])];
        if (!read_available(owners[i], c)) c.reading = false;
      }
    }
  }

  // Sends one frame to world rank `to` by the deadline (to this rank itself: delivers it).
  // Returns "" or why it could not; a frame cut short leaves the connection unusable,
  // and the caller's failure marks the transport failed.
  std::string post(int to, FrameHeader header, const void* payload, Deadline deadline) {
    if (to == rank) {
      Frame frame{header, {}};
      const auto* p = static_cast<const uint8_t*>(payload);
      frame.payload.assign(p, p + header.payload_bytes);
      deliver(to, std::move(frame));
      return "";
    }
    Connection& c = *peers[static_cast<size_t>(to)];
    uint8_t bytes[kHeaderBytes];
    header.encode(bytes);
    std::lock_guard<std::mutex> lock(c.write_mu);
    iovec parts[2] = {{bytes, kHeaderBytes}, {const_cast<void*>(payload), header.payload_bytes}};
    size_t total = kHeaderBytes + header.payload_bytes, done = 0;
    while (done < total) {
      // Skip what has gone already.
      iovec left[2];
      int count = 0;
      size_t skip = done;
      for (const iovec& part : parts) {
        if (skip >= part.iov_len) {
          skip -= part.iov_len;
          continue;
        }
        left[count++] = {static_cast<uint8_t*>(part.iov_base) + skip, part.iov_len - skip};
        skip = 0;
      }
      msghdr msg{};
      msg.msg_iov = left;
      msg.msg_iovlen = static_cast<size_t>(count);
      ssize_t n = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL);
      if (n > 0) {
        done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return std::strerror(errno);
      pollfd pf{c.fd, POLLOUT, 0};
      if (Clock::now() >= deadline || ::poll(&pf, 1, ms_left(deadline)) == 0)
        return "its socket took no data until the timeout";
    }
    return "";
  }

  ~SocketTransport() {
    if (reader.joinable()) {
      char byte = 1;
      [[maybe_unused]] ssize_t n = ::write(wake[1], &byte, 1);
      reader.join();
    }
    for (auto& c : peers)
      if (c && c->fd >= 0) ::close(c->fd);
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }
};

}  // namespace detail

using detail::Frame;
using detail::FrameHeader;
using detail::SocketTransport;

// One collective as this rank calls it: `part(peer)` is what it sends that group rank (a
// view of the caller's buffer, not a copy).
struct SocketComm::Call {
  Op op = Op::barrier;
  size_t count = 0;
  DType dtype = DType::f32;
  int root = 0;
  std::function<std::span<const uint8_t>(int peer)> part;
};

SocketComm::SocketComm(std::shared_ptr<SocketTransport> transport, uint64_t id, std::string name, int rank,
                       std::vector<int> world_ranks)
    : Comm(std::move(name), rank, std::move(world_ranks)),
      transport_(std::move(transport)),
      id_(id),
      sent_(static_cast<size_t>(size()), 0) {}

SocketComm::~SocketComm() = default;

std::vector<std::vector<uint8_t>> SocketComm::run_collective(Call& call, CommTimeout timeout) {
  SocketTransport& t = *transport_;
  const uint64_t number = ++collectives_;
  const std::string label = collective_label(call.op, number, call.count, call.dtype);
  const Deadline deadline = Clock::now() + timeout;
  auto fail = [&](std::unique_lock<std::mutex>& lock, const std::string& message) {
    if (!lock.owns_lock()) lock.lock();
    t.fail_locked(message);
    throw RuntimeFailure(message);
  };
  {
    std::unique_lock<std::mutex> lock(t.mu);
    if (t.failed) throw RuntimeFailure(describe() + ": " + label + " stopped: " + t.failure);
  }

  for (int p = 0; p < size(); ++p) {
    if (p == rank()) continue;
    std::span<const uint8_t> part = call.part(p);
    FrameHeader h;
    h.type = FrameType::collective;
    h.op = call.op;
    h.dtype = call.dtype;
    h.root = call.root;
    h.group = id_;
    h.seq = number;
    h.count = call.count;
    h.payload_bytes = part.size();
    std::string why = t.post(world_rank_of(p), h, part.data(), deadline);
    if (!why.empty()) {
      std::unique_lock<std::mutex> lock(t.mu, std::defer_lock);
      fail(lock, describe() + ": " + label + ": cannot send to " + describe_peer(p) + ": " + why);
    }
  }

  std::vector<Frame> frames(static_cast<size_t>(size()));
  {
    std::unique_lock<std::mutex> lock(t.mu);
    while (true) {
      if (t.failed) throw RuntimeFailure(describe() + ": " + label + " stopped: " + t.failure);
      std::vector<int> missing;
      for (int p = 0; p < size(); ++p)
        if (p != rank() && !t.collectives.count({id_, world_rank_of(p), number})) missing.push_back(p);
      if (missing.empty()) break;
      for (int p : missing)
        if (auto gone = t.gone.find(world_rank_of(p)); gone != t.gone.end())
          fail(lock, describe() + ": " + label + ": " + describe_peer(p) +
                         " is gone before it took part: " + gone->second);
      if (Clock::now() >= deadline) {
        std::string names;
        for (int p : missing) names += (names.empty() ? "" : ", ") + describe_peer(p);
        fail(lock, describe() + ": " + label + " timed out after " + ms(timeout) + " waiting for " + names);
      }
      t.cv.wait_until(lock, deadline);
    }
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      auto it = t.collectives.find({id_, world_rank_of(p), number});
      frames[static_cast<size_t>(p)] = std::move(it->second);
      t.collectives.erase(it);
    }
    for (int p = 0; p < size(); ++p) {
      if (p == rank()) continue;
      const FrameHeader& h = frames[static_cast<size_t>(p)].header;
      if (h.op != call.op || h.count != call.count || h.dtype != call.dtype || h.root != call.root)
        fail(lock, describe() + ": mismatched collectives: this rank called " + label + ", " +
                       describe_peer(p) + " called " + collective_label(h.op, h.seq, h.count, h.dtype));
    }
  }
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(size()));
  for (size_t p = 0; p < out.size(); ++p) out[p] = std::move(frames[p].payload);
  return out;
}

namespace {

// The sum over ranks, in rank order, of the peers' `parts` and this rank's `own` (its part
// never travels): count values into dst, which may be own (in place).
void sum_parts(const std::vector<std::vector<uint8_t>>& parts, int rank, const void* own, void* dst,
               size_t count, DType dtype) {
  std::vector<const void*> inputs(parts.size());
  for (size_t p = 0; p < parts.size(); ++p) inputs[p] = static_cast<int>(p) == rank ? own : parts[p].data();
  std::vector<uint8_t> result(comm_bytes(count, dtype));
  sum_in_rank_order(result.data(), inputs, 0, count, dtype);
  std::memcpy(dst, result.data(), result.size());
}

}  // namespace

void SocketComm::all_reduce_sum(void* data, size_t count, DType dtype, CommTimeout timeout) {
  check_dtype(dtype, "all_reduce");
  const size_t bytes = comm_bytes(count, dtype);
  const auto* mine = static_cast<const uint8_t*>(data);
  Call call{Op::all_reduce, count, dtype, 0, [&](int) { return std::span<const uint8_t>(mine, bytes); }};
  sum_parts(run_collective(call, timeout), rank(), mine, data, count, dtype);
}

void SocketComm::reduce_scatter_sum(const void* send, void* recv, size_t recv_count, DType dtype,
                                    CommTimeout timeout) {
  check_dtype(dtype, "reduce_scatter");
  const size_t bytes = comm_bytes(recv_count, dtype);
  const auto* mine = static_cast<const uint8_t*>(send);
  // Each peer needs only its own slice of this rank's input.
  Call call{Op::reduce_scatter, recv_count, dtype, 0, [&](int peer) {
              return std::span<const uint8_t>(mine + static_cast<size_t>(peer) * bytes, bytes);
            }};
  sum_parts(run_collective(call, timeout), rank(), mine + static_cast<size_t>(rank()) * bytes, recv,
            recv_count, dtype);
}

void SocketComm::all_gather(const void* send, void* recv, size_t send_count, DType dtype,
                            CommTimeout timeout) {
  check_dtype(dtype, "all_gather");
  const size_t bytes = comm_bytes(send_count, dtype);
  const auto* mine = static_cast<const uint8_t*>(send);
  Call call{Op::all_gather, send_count, dtype, 0, [&](int) { return std::span<const uint8_t>(mine, bytes); }};
  std::vector<std::vector<uint8_t>> parts = run_collective(call, timeout);
  auto* out = static_cast<uint8_t*>(recv);
  // send may be this rank's slot of recv (in place): memmove.
  std::memmove(out + static_cast<size_t>(rank()) * bytes, send, bytes);
  for (size_t p = 0; p < parts.size(); ++p)
    if (static_cast<int>(p) != rank()) std::memcpy(out + p * bytes, parts[p].data(), bytes);
}

void SocketComm::broadcast(void* data, size_t count, DType dtype, int root, CommTimeout timeout) {
  check_dtype(dtype, "broadcast");
  check_peer(root, "broadcast");
  const size_t bytes = comm_bytes(count, dtype);
  const auto* mine = static_cast<const uint8_t*>(data);
  // Everyone sends everyone a header (so that all take part, as in InProcessComm); only the
  // root's carries the data.
  Call call{Op::broadcast, count, dtype, root,
            [&](int) { return std::span<const uint8_t>(mine, rank() == root ? bytes : 0); }};
  std::vector<std::vector<uint8_t>> parts = run_collective(call, timeout);
  if (rank() != root) std::memcpy(data, parts[static_cast<size_t>(root)].data(), bytes);
}

void SocketComm::barrier(CommTimeout timeout) {
  Call call{Op::barrier, 0, DType::f32, 0, [](int) { return std::span<const uint8_t>{}; }};
  run_collective(call, timeout);
}

std::unique_ptr<Comm> SocketComm::split(const std::vector<int>& members, const std::string& name,
                                        CommTimeout timeout) {
  check_split_members(members);
  // The payload names the new group; its members must all have sent the same one.
  std::vector<uint8_t> mine;
  auto put = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    mine.insert(mine.end(), b, b + n);
  };
  const uint32_t name_len = static_cast<uint32_t>(name.size());
  put(&name_len, 4);
  put(name.data(), name.size());
  for (int m : members) put(&m, 4);
  Call call{Op::split, 0, DType::f32, 0, [&](int) { return std::span<const uint8_t>(mine); }};
  std::vector<std::vector<uint8_t>> parts = run_collective(call, timeout);
  const uint64_t number = collectives_;
  for (int m : members)
    if (m != rank() && parts[static_cast<size_t>(m)] != mine) {
      std::lock_guard<std::mutex> lock(transport_->mu);
      std::string message = describe() + ": split '" + name + "': " + describe_peer(m) +
                            " passed other members or another name for the same group";
      transport_->fail_locked(message);
      throw RuntimeFailure(message);
    }
  if (members.empty()) return nullptr;
  std::vector<int> world_ranks;
  for (int m : members) world_ranks.push_back(world_rank_of(m));
  const uint64_t id = mix(mix(id_ ^ number) ^ static_cast<uint64_t>(members.front()));
  int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
  return std::make_unique<SocketComm>(transport_, id, name, new_rank, std::move(world_ranks));
}

void SocketComm::exchange(std::span<const P2POp> ops, CommTimeout timeout) {
  SocketTransport& t = *transport_;
  const Deadline deadline = Clock::now() + timeout;
  for (const P2POp& op : ops) {
    check_dtype(op.dtype, op.kind == P2POp::Kind::send ? "send" : "recv");
    check_peer(op.peer, op.kind == P2POp::Kind::send ? "send" : "recv");
  }
  auto fail = [&](const std::string& message) {
    std::lock_guard<std::mutex> lock(t.mu);
    t.fail_locked(message);
    throw RuntimeFailure(message);
  };
  // Waits until ready() (mu held), throwing on the deadline, on `peer` gone, or on a
  // failure elsewhere; `what` names the leg.
  auto wait_for = [&](int peer, const std::function<bool()>& ready, const std::string& what) {
    std::unique_lock<std::mutex> lock(t.mu);
    while (!ready()) {
      std::string message;
      if (t.failed) throw RuntimeFailure(describe() + ": " + what + " stopped: " + t.failure);
      if (auto gone = t.gone.find(world_rank_of(peer)); gone != t.gone.end())
        message = describe() + ": " + what + ": " + describe_peer(peer) + " is gone: " + gone->second;
      else if (Clock::now() >= deadline)
        message = describe() + ": " + what + " timed out after " + ms(timeout);
      if (!message.empty()) {
        t.fail_locked(message);
        throw RuntimeFailure(message);
      }
      t.cv.wait_until(lock, deadline);
    }
  };
  {
    std::lock_guard<std::mutex> lock(t.mu);
    if (t.failed) throw RuntimeFailure(describe() + ": exchange stopped: " + t.failure);
  }

  // Every send goes out before any wait, so that two ranks may send to each other.
  std::vector<uint64_t> numbers(ops.size(), 0);
  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    if (op.kind != P2POp::Kind::send) continue;
    numbers[i] = ++sent_[static_cast<size_t>(op.peer)];
    FrameHeader h;
    h.type = FrameType::p2p;
    h.dtype = op.dtype;
    h.group = id_;
    h.seq = numbers[i];
    h.count = op.count;
    h.payload_bytes = comm_bytes(op.count, op.dtype);
    std::string why = t.post(world_rank_of(op.peer), h, op.data, deadline);
    if (!why.empty())
      fail(describe() + ": send of " + size_str(op.count, op.dtype) + " to " + describe_peer(op.peer) + ": " +
           why);
  }

  for (const P2POp& op : ops) {
    if (op.kind != P2POp::Kind::recv) continue;
    const std::string what = "recv of " + size_str(op.count, op.dtype) + " from " + describe_peer(op.peer);
    const std::pair<uint64_t, int> box_key{id_, world_rank_of(op.peer)};
    wait_for(
        op.peer, [&] { return !t.messages[box_key].empty(); }, what);
    Frame frame;
    {
      std::lock_guard<std::mutex> lock(t.mu);
      std::deque<Frame>& box = t.messages[box_key];
      frame = std::move(box.front());
      box.pop_front();
    }
    if (frame.header.count != op.count || frame.header.dtype != op.dtype)
      fail(describe() + ": " + what + " matched a send of " +
           size_str(frame.header.count, frame.header.dtype));
    std::memcpy(op.data, frame.payload.data(), frame.payload.size());
    FrameHeader ack;
    ack.type = FrameType::ack;
    ack.group = id_;
    ack.seq = frame.header.seq;
    std::string why = t.post(world_rank_of(op.peer), ack, nullptr, deadline);
    if (!why.empty()) fail(describe() + ": " + what + ": cannot acknowledge it: " + why);
  }

  for (size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    if (op.kind != P2POp::Kind::send) continue;
    const std::tuple<uint64_t, int, uint64_t> key{id_, world_rank_of(op.peer), numbers[i]};
    wait_for(
        op.peer, [&] { return t.acks.count(key) > 0; },
        "send of " + size_str(op.count, op.dtype) + " to " + describe_peer(op.peer) + " (not received)");
    std::lock_guard<std::mutex> lock(t.mu);
    t.acks.erase(key);
  }
}

SocketWorld socket_world_join(const World& world, CommTimeout timeout,
                              Rendezvous::FailureHandler on_failure) {
  LOOM_ASSERT(world.size > 1, "a SocketComm world needs more than one rank");
  const std::string self = "rank " + std::to_string(world.rank) + ": SocketComm";
  int port = 0;
  const int listen_fd = rendezvous_listen("0.0.0.0", 0, &port);
  struct CloseOnExit {
    int fd;
    ~CloseOnExit() { ::close(fd); }
  } listener{listen_fd};
  const uint32_t port32 = static_cast<uint32_t>(port);
  std::vector<uint8_t> contribution(4);
  std::memcpy(contribution.data(), &port32, 4);

  SocketWorld out;
  out.rendezvous = Rendezvous::join(world, {}, timeout, std::move(on_failure), contribution);
  const Deadline deadline = Clock::now() + timeout;
  auto transport = std::make_shared<SocketTransport>();
  transport->rank = world.rank;
  transport->peers.resize(static_cast<size_t>(world.size));

  // Rank i connects to every j < i and says who it is; the listeners are up since before
  // the rendezvous, so the connects complete into their backlogs at once.
  for (int j = 0; j < world.rank; ++j) {
    const RendezvousRank& peer = out.rendezvous->ranks()[static_cast<size_t>(j)];
    if (peer.contribution.size() != 4)
      throw RuntimeFailure(self + ": rank " + std::to_string(j) + " published no listening port");
    uint32_t peer_port = 0;
    std::memcpy(&peer_port, peer.contribution.data(), 4);
    std::string error;
    int fd = tcp_connect_until(peer.address, static_cast<int>(peer_port), deadline, &error);
    uint32_t hello[3] = {kHelloMagic, static_cast<uint32_t>(world.rank), static_cast<uint32_t>(world.size)};
    if (fd >= 0) error = write_exact(fd, hello, sizeof(hello), deadline);
    if (fd < 0 || !error.empty()) {
      if (fd >= 0) ::close(fd);
      throw RuntimeFailure(self + ": cannot connect to rank " + std::to_string(j) + " at " + peer.address +
                           ":" + std::to_string(peer_port) + " within " + ms(timeout) + " (" + error + ")");
    }
    transport->peers[static_cast<size_t>(j)] = std::make_unique<detail::Connection>();
    transport->peers[static_cast<size_t>(j)]->fd = fd;
  }
  // ... and accepts one from every j > i.
  int waiting = world.size - 1 - world.rank;
  while (waiting > 0) {
    pollfd pf{listen_fd, POLLIN, 0};
    int left = ms_left(deadline);
    if (left == 0 || ::poll(&pf, 1, left) == 0) {
      std::string missing;
      for (int j = world.rank + 1; j < world.size; ++j)
        if (!transport->peers[static_cast<size_t>(j)])
          missing += (missing.empty() ? "" : ", ") + std::to_string(j);
      throw RuntimeFailure(self + ": rank(s) " + missing + " did not connect within " + ms(timeout));
    }
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    uint32_t hello[3] = {};
    bool ours = read_exact(fd, hello, sizeof(hello), deadline).empty() && hello[0] == kHelloMagic &&
                static_cast<int>(hello[2]) == world.size && static_cast<int>(hello[1]) > world.rank &&
                static_cast<int>(hello[1]) < world.size && !transport->peers[hello[1]];
    if (!ours) {
      ::close(fd);  // a stray connection, not one of this world's ranks
      continue;
    }
    transport->peers[hello[1]] = std::make_unique<detail::Connection>();
    transport->peers[hello[1]]->fd = fd;
    --waiting;
  }
  for (auto& c : transport->peers)
    if (c) socket_configure(c->fd);

  if (::pipe2(transport->wake, O_CLOEXEC) != 0)
    throw_runtime_failure(self, std::string("pipe: ") + std::strerror(errno));
  SocketTransport* raw = transport.get();
  transport->reader = std::thread([raw] { raw->read_loop(); });
  std::vector<int> ranks(static_cast<size_t>(world.size));
  for (int r = 0; r < world.size; ++r) ranks[static_cast<size_t>(r)] = r;
  out.comm = std::make_unique<SocketComm>(std::move(transport), 0, "world", world.rank, std::move(ranks));
  return out;
}

}  // namespace loom
