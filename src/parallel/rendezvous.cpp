#include "parallel/rendezvous.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"
#include "parallel/tcp.h"

namespace loom {

namespace {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

constexpr uint32_t kMagic = 0x4c4f4f4d;  // "LOOM"
constexpr uint32_t kVersion = 2;         // 2: hellos carry a contribution, replies the rank table
constexpr size_t kMaxBody = 64 * 1024;
constexpr size_t kHostBytes = 64;
// Once a message has begun, the rest follows at once; this only bounds a stalled peer.
constexpr auto kMessageTail = std::chrono::milliseconds(5000);

enum class Reply : uint32_t { ok = 0, failed = 1 };
enum class Message : uint8_t { bye = 1, fail = 2, done = 3 };

std::string ms(std::chrono::milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t get_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

bool write_all(int fd, const std::vector<uint8_t>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

enum class ReadStatus { ok, eof, timeout, error };

ReadStatus read_exact(int fd, uint8_t* out, size_t len, Deadline deadline) {
  size_t done = 0;
  while (done < len) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return ReadStatus::timeout;
    pollfd p{fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ReadStatus::error;
    if (r == 0) continue;
    ssize_t n = ::recv(fd, out + done, len - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ReadStatus::error;
    if (n == 0) return ReadStatus::eof;
    done += static_cast<size_t>(n);
  }
  return ReadStatus::ok;
}

std::vector<uint8_t> message_bytes(Message type, const std::string& body) {
  std::vector<uint8_t> out{static_cast<uint8_t>(type)};
  put_u32(out, static_cast<uint32_t>(std::min(body.size(), kMaxBody)));
  out.insert(out.end(), body.begin(),
             body.begin() + static_cast<std::ptrdiff_t>(std::min(body.size(), kMaxBody)));
  return out;
}

// Reads one watch message; false when the connection closed or broke.
bool read_message(int fd, Message* type, std::string* body) {
  uint8_t header[5];
  if (read_exact(fd, header, 1, Clock::now() + std::chrono::hours(24 * 365)) != ReadStatus::ok) return false;
  if (read_exact(fd, header + 1, 4, Clock::now() + kMessageTail) != ReadStatus::ok) return false;
  uint32_t len = get_u32(header + 1);
  if (len > kMaxBody) return false;
  body->assign(len, '\0');
  if (len && read_exact(fd, reinterpret_cast<uint8_t*>(body->data()), len, Clock::now() + kMessageTail) !=
                 ReadStatus::ok)
    return false;
  *type = static_cast<Message>(header[0]);
  return true;
}

// The numeric address a connected socket's peer has ("10.0.0.7"), or "" when unknown.
std::string peer_address(int fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof(sa);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "";
  char text[INET6_ADDRSTRLEN] = {};
  const void* where = sa.ss_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&sa)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&sa)->sin_addr);
  if (!::inet_ntop(sa.ss_family, where, text, sizeof(text))) return "";
  return text;
}

// The success reply's body: the payload, then every rank's address and contribution.
std::vector<uint8_t> rank_table_bytes(const std::vector<uint8_t>& payload,
                                      const std::vector<RendezvousRank>& ranks) {
  std::vector<uint8_t> out;
  put_u32(out, static_cast<uint32_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  for (const RendezvousRank& r : ranks) {
    put_u32(out, static_cast<uint32_t>(r.address.size()));
    out.insert(out.end(), r.address.begin(), r.address.end());
    put_u32(out, static_cast<uint32_t>(r.contribution.size()));
    out.insert(out.end(), r.contribution.begin(), r.contribution.end());
  }
  return out;
}

// Parses rank_table_bytes of a world of `size`; false when the bytes do not hold one.
bool rank_table_parse(const std::vector<uint8_t>& body, int size, std::vector<uint8_t>* payload,
                      std::vector<RendezvousRank>* ranks) {
  size_t at = 0;
  auto take = [&](std::vector<uint8_t>* out) {
    if (body.size() - at < 4) return false;
    uint32_t len = get_u32(body.data() + at);
    at += 4;
    if (body.size() - at < len) return false;
    out->assign(body.begin() + static_cast<std::ptrdiff_t>(at),
                body.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += len;
    return true;
  };
  if (!take(payload)) return false;
  ranks->assign(static_cast<size_t>(size), {});
  for (RendezvousRank& r : *ranks) {
    std::vector<uint8_t> address;
    if (!take(&address) || !take(&r.contribution)) return false;
    r.address.assign(address.begin(), address.end());
  }
  return at == body.size();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// A connected, blocking socket to host:port within the deadline, or -1.
int connect_until(const std::string& host, int port, Deadline deadline, std::string* last_error) {
  const int fd = tcp_connect_until(host, port, deadline, last_error);
  if (fd >= 0) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

}  // namespace

int rendezvous_listen(const std::string& addr, int port, int* bound_port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw_runtime_failure("rendezvous", std::string("socket: ") + std::strerror(errno));
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* found = nullptr;
  if (addr.empty() || addr == "0.0.0.0") {
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
  } else if (::getaddrinfo(addr.c_str(), nullptr, &hints, &found) == 0 && found) {
    sa.sin_addr = reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr;
    ::freeaddrinfo(found);
  } else {
    ::close(fd);
    throw_runtime_failure("rendezvous", "cannot resolve the listen address '" + addr + "'");
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    std::string why = std::strerror(errno);
    ::close(fd);
    throw_runtime_failure("rendezvous", "cannot listen on " + addr + ":" + std::to_string(port) + ": " + why);
  }
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *bound_port = ntohs(sa.sin_port);
  return fd;
}

void rendezvous_exit_on_failure(const std::string& message) {
  std::fprintf(stderr, "loom: %s\n", message.c_str());
  std::fflush(stderr);
  ::_exit(static_cast<int>(ExitCode::runtime_failure));
}

struct Rendezvous::State {
  struct Peer {
    int fd = -1;
    int rank = 0;
    std::string who;                    // "rank 2 (pid 123 on host)"
    std::string address;                // rank 0: where the peer's connection came from
    std::vector<uint8_t> contribution;  // rank 0: what the peer passed to join
    bool finished = false;
  };

  World world;
  FailureHandler on_failure;
  std::vector<Peer> peers;  // rank 0: ranks 1..n-1; others: rank 0
  int wake[2] = {-1, -1};
  std::thread watcher;
  std::mutex write_mu;  // one writer per socket at a time

  std::mutex mu;
  std::condition_variable cv;
  bool failed = false;  // a failure was seen (or reported): on_failure runs at most once
  std::string failure;
  bool quiet = false;  // report_failure ran: this rank is ending on its own terms
  bool done = false;   // rank > 0: rank 0 confirmed finish

  std::string self() const { return "rank " + std::to_string(world.rank); }

  void send_to(Peer& peer, Message type, const std::string& body) {
    std::lock_guard<std::mutex> lock(write_mu);
    if (peer.fd >= 0) write_all(peer.fd, message_bytes(type, body));
  }

  // Records the first failure, passes it on from rank 0 to everyone but `from`, and runs
  // on_failure (outside the locks) unless this rank reported its own failure.
  void fail(const std::string& message, const Peer* from) {
    bool run_handler = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (failed) return;
      failed = true;
      failure = message;
      run_handler = !quiet;
    }
    cv.notify_all();
    if (world.rank == 0)
      for (Peer& peer : peers)
        if (&peer != from) send_to(peer, Message::fail, message);
    if (run_handler) on_failure(message);
  }

  void watch() {
    while (true) {
      std::vector<pollfd> fds{{wake[0], POLLIN, 0}};
      std::vector<Peer*> owners{nullptr};
      for (Peer& peer : peers)
        if (peer.fd >= 0) {
          fds.push_back({peer.fd, POLLIN, 0});
          owners.push_back(&peer);
        }
      if (fds.size() == 1) return;
      int r = ::poll(fds.data(), fds.size(), -1);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 || (fds[0].revents & POLLIN)) return;
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!fds[i].revents) continue;
        Peer& peer = *owners[i];
        Message type{};
        std::string body;
        if (!read_message(peer.fd, &type, &body)) {
          std::lock_guard<std::mutex> lock(write_mu);
          ::close(peer.fd);
          peer.fd = -1;
          if (peer.finished) continue;
        } else if (type == Message::bye) {
          std::lock_guard<std::mutex> lock(mu);
          peer.finished = true;
          cv.notify_all();
          continue;
        } else if (type == Message::done) {
          std::lock_guard<std::mutex> lock(mu);
          done = true;
          cv.notify_all();
          return;
        } else if (type == Message::fail) {
          fail(body, &peer);
          return;
        }
        fail(peer.who + " died: its connection to " + self() + " closed before it finished", &peer);
        return;
      }
    }
  }

  void stop_watch() {
    if (watcher.joinable()) {
      char byte = 1;
      [[maybe_unused]] ssize_t n = ::write(wake[1], &byte, 1);
      watcher.join();
    }
  }

  ~State() {
    stop_watch();
    for (Peer& peer : peers)
      if (peer.fd >= 0) ::close(peer.fd);
    for (int fd : wake)
      if (fd >= 0) ::close(fd);
  }
};

Rendezvous::Rendezvous(std::unique_ptr<State> state) : state_(std::move(state)) {}

Rendezvous::~Rendezvous() = default;

namespace {

using Peer = Rendezvous::State::Peer;

// Rank 0: the hello of a connection it accepted. nullopt (the connection closed) when it is
// not one of ours, or gone before saying who it is; else the peer, with in *error why it
// cannot join when it cannot.
std::optional<Peer> read_hello(int fd, const World& world, const std::vector<Peer>& arrived,
                               Deadline deadline, std::string* error) {
  uint8_t hello[20 + kHostBytes];
  if (read_exact(fd, hello, sizeof(hello), deadline) != ReadStatus::ok || get_u32(hello) != kMagic) {
    ::close(fd);
    return std::nullopt;
  }
  Peer peer;
  peer.fd = fd;
  peer.rank = static_cast<int>(get_u32(hello + 8));
  int size = static_cast<int>(get_u32(hello + 12));
  int pid = static_cast<int>(get_u32(hello + 16));
  std::string host(reinterpret_cast<char*>(hello + 20), kHostBytes);
  host = host.substr(0, host.find('\0'));
  peer.who = "rank " + std::to_string(peer.rank) + " (pid " + std::to_string(pid) + " on " + host + ")";
  peer.address = peer_address(fd);
  uint8_t length[4];
  bool has_contribution = get_u32(hello + 4) == kVersion &&
                          read_exact(fd, length, sizeof(length), deadline) == ReadStatus::ok &&
                          get_u32(length) <= kMaxRendezvousContribution;
  if (has_contribution) {
    peer.contribution.resize(get_u32(length));
    has_contribution =
        read_exact(fd, peer.contribution.data(), peer.contribution.size(), deadline) == ReadStatus::ok;
  }
  bool duplicate =
      std::any_of(arrived.begin(), arrived.end(), [&](const Peer& a) { return a.rank == peer.rank; });
  if (get_u32(hello + 4) != kVersion)
    *error = peer.who + " speaks rendezvous version " + std::to_string(get_u32(hello + 4)) + ", expected " +
             std::to_string(kVersion);
  else if (!has_contribution)
    *error = peer.who + " sent a broken hello";
  else if (size != world.size)
    *error =
        peer.who + " has WORLD_SIZE " + std::to_string(size) + ", rank 0 has " + std::to_string(world.size);
  else if (peer.rank <= 0 || peer.rank >= world.size || duplicate)
    *error = peer.who + " is a rank already taken or outside [1, " + std::to_string(world.size) + ")";
  return peer;
}

// Rank 0: accepts the other ranks until all have said hello, a hello is wrong or `timeout`
// passes. Returns why the rendezvous fails, "" when it does not.
std::string accept_ranks(const World& world, int listen_fd, std::chrono::milliseconds timeout,
                         std::vector<Peer>* arrived) {
  const Deadline deadline = Clock::now() + timeout;
  std::string error;
  while (arrived->size() + 1 < static_cast<size_t>(world.size) && error.empty()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{listen_fd, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left));
    if (r <= 0) continue;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    if (std::optional<Peer> peer = read_hello(fd, world, *arrived, deadline, &error))
      arrived->push_back(std::move(*peer));
  }
  if (error.empty() && arrived->size() + 1 < static_cast<size_t>(world.size)) {
    std::vector<int> missing;
    for (int r = 1; r < world.size; ++r)
      if (std::none_of(arrived->begin(), arrived->end(), [&](const Peer& a) { return a.rank == r; }))
        missing.push_back(r);
    error = rank_list(missing) + " did not arrive within " + ms(timeout) + " (world of " +
            std::to_string(world.size) + ")";
  }
  return error;
}

// Rank 0's reply: magic, ok or failed, then the body's length and the body.
std::vector<uint8_t> reply_bytes(Reply reply, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> out;
  put_u32(out, kMagic);
  put_u32(out, static_cast<uint32_t>(reply));
  put_u32(out, static_cast<uint32_t>(body.size()));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// Rank 0's side: gathers every rank's hello, then answers all with the payload and the rank
// table, or with why the rendezvous failed (and throws that). Returns the table; *peers the
// connections, by rank.
std::vector<RendezvousRank> join_as_rank_zero(const World& world, const std::vector<uint8_t>& payload,
                                              std::chrono::milliseconds timeout,
                                              const std::vector<uint8_t>& contribution,
                                              const std::string& where, std::vector<Peer>* peers) {
  int bound = 0;
  int listen_fd = world.rendezvous_fd >= 0 ? world.rendezvous_fd
                                           : rendezvous_listen("0.0.0.0", world.master_port, &bound);
  std::vector<Peer> arrived;
  const std::string error = accept_ranks(world, listen_fd, timeout, &arrived);
  ::close(listen_fd);
  std::vector<RendezvousRank> table;
  if (error.empty()) {
    table.assign(static_cast<size_t>(world.size), {});
    table[0] = {world.master_addr, contribution};
    for (const Peer& peer : arrived)
      table[static_cast<size_t>(peer.rank)] = {peer.address, peer.contribution};
  }
  std::string message = where + ": " + error;
  const std::vector<uint8_t> reply =
      error.empty() ? reply_bytes(Reply::ok, rank_table_bytes(payload, table))
                    : reply_bytes(Reply::failed, std::vector<uint8_t>(message.begin(), message.end()));
  for (Peer& peer : arrived) write_all(peer.fd, reply);
  if (!error.empty()) {
    for (Peer& peer : arrived) ::close(peer.fd);
    throw RuntimeFailure(message);
  }
  for (Peer& peer : arrived) tcp_set_keepalive(peer.fd);
  std::sort(arrived.begin(), arrived.end(), [](const Peer& a, const Peer& b) { return a.rank < b.rank; });
  *peers = std::move(arrived);
  return table;
}

// A hello: magic, version, rank, world size, pid, host name (kHostBytes, zero-padded), then
// the contribution's length and bytes.
std::vector<uint8_t> hello_bytes(const World& world, const std::vector<uint8_t>& contribution) {
  std::vector<uint8_t> hello;
  put_u32(hello, kMagic);
  put_u32(hello, kVersion);
  put_u32(hello, static_cast<uint32_t>(world.rank));
  put_u32(hello, static_cast<uint32_t>(world.size));
  put_u32(hello, static_cast<uint32_t>(::getpid()));
  std::string host = host_name().substr(0, kHostBytes - 1);
  hello.insert(hello.end(), host.begin(), host.end());
  hello.resize(20 + kHostBytes, 0);
  put_u32(hello, static_cast<uint32_t>(contribution.size()));
  hello.insert(hello.end(), contribution.begin(), contribution.end());
  return hello;
}

// Any other rank's side: says hello to rank 0 and reads its answer; throws the failure rank
// 0 sent, or why rank 0 could not be heard. Returns the payload; *table the rank table,
// *peers the connection to rank 0.
std::vector<uint8_t> join_as_other_rank(const World& world, std::chrono::milliseconds timeout,
                                        const std::vector<uint8_t>& contribution, const std::string& where,
                                        std::vector<RendezvousRank>* table, std::vector<Peer>* peers) {
  const Deadline deadline = Clock::now() + timeout + kVerdictMargin;
  std::string last_error;
  int fd = connect_until(world.master_addr, world.master_port, deadline, &last_error);
  if (fd < 0)
    throw RuntimeFailure(where + ": could not reach rank 0 within " + ms(timeout + kVerdictMargin) + " (" +
                         last_error + ")");
  Peer peer;
  peer.fd = fd;
  peer.who = "rank 0 (" + world.master_addr + ":" + std::to_string(world.master_port) + ")";
  uint8_t header[12];
  ReadStatus status = write_all(fd, hello_bytes(world, contribution))
                          ? read_exact(fd, header, sizeof(header), deadline)
                          : ReadStatus::error;
  std::vector<uint8_t> body;
  if (status == ReadStatus::ok) {
    // The payload, and per rank an address (a host name: at most 255 bytes) and a contribution.
    const size_t limit =
        4 + kMaxBody + static_cast<size_t>(world.size) * (8 + 255 + kMaxRendezvousContribution);
    body.resize(std::min<size_t>(get_u32(header + 8), limit));
    status = read_exact(fd, body.data(), body.size(), deadline);
  }
  if (status != ReadStatus::ok) {
    ::close(fd);
    throw RuntimeFailure(
        where + (status == ReadStatus::timeout
                     ? ": rank 0 did not complete the rendezvous within " + ms(timeout + kVerdictMargin)
                     : ": rank 0 closed the connection before completing the rendezvous"));
  }
  if (get_u32(header + 4) != static_cast<uint32_t>(Reply::ok)) {
    ::close(fd);
    throw RuntimeFailure(std::string(body.begin(), body.end()));
  }
  std::vector<uint8_t> payload;
  if (!rank_table_parse(body, world.size, &payload, table)) {
    ::close(fd);
    throw RuntimeFailure(where + ": rank 0 sent a broken rank table");
  }
  tcp_set_keepalive(fd);
  peers->push_back(std::move(peer));
  return payload;
}

}  // namespace

std::unique_ptr<Rendezvous> Rendezvous::join(const World& world, const std::vector<uint8_t>& payload,
                                             std::chrono::milliseconds timeout, FailureHandler on_failure,
                                             const std::vector<uint8_t>& contribution) {
  LOOM_ASSERT(world.size > 1, "a rendezvous needs more than one rank");
  LOOM_ASSERT(payload.size() <= kMaxBody || world.rank != 0, "rendezvous payload too large");
  LOOM_ASSERT(contribution.size() <= kMaxRendezvousContribution, "rendezvous contribution too large");
  auto state = std::make_unique<State>();
  state->world = world;
  state->on_failure = std::move(on_failure);
  const std::string where = "rank " + std::to_string(world.rank) + ": rendezvous at " + world.master_addr +
                            ":" + std::to_string(world.master_port);
  std::vector<RendezvousRank> table;
  std::vector<uint8_t> received;
  if (world.rank == 0) {
    table = join_as_rank_zero(world, payload, timeout, contribution, where, &state->peers);
    received = payload;
  } else {
    received = join_as_other_rank(world, timeout, contribution, where, &table, &state->peers);
  }

  if (::pipe2(state->wake, O_CLOEXEC) != 0)
    throw_runtime_failure(where, std::string("pipe: ") + std::strerror(errno));
  State* raw = state.get();
  state->watcher = std::thread([raw] { raw->watch(); });
  std::unique_ptr<Rendezvous> out(new Rendezvous(std::move(state)));
  out->payload_ = std::move(received);
  out->ranks_ = std::move(table);
  return out;
}

void Rendezvous::report_failure(const std::string& message) {
  State& s = *state_;
  const std::string full = s.self() + " failed: " + message;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.quiet = true;
  }
  for (State::Peer& peer : s.peers) s.send_to(peer, Message::fail, full);
}

void Rendezvous::finish(std::chrono::milliseconds timeout) {
  State& s = *state_;
  const auto deadline = Clock::now() + timeout;
  std::unique_lock<std::mutex> lock(s.mu);
  if (s.world.rank == 0) {
    auto all_finished = [&] {
      return std::all_of(s.peers.begin(), s.peers.end(), [](const State::Peer& p) { return p.finished; });
    };
    if (!s.cv.wait_until(lock, deadline, [&] { return s.failed || all_finished(); })) {
      std::vector<int> waiting;
      for (const State::Peer& p : s.peers)
        if (!p.finished) waiting.push_back(p.rank);
      throw RuntimeFailure("rank 0: finish timed out after " + ms(timeout) + " waiting for " +
                           rank_list(waiting));
    }
    if (s.failed) throw RuntimeFailure(s.failure);
    lock.unlock();
    s.stop_watch();
    for (State::Peer& peer : s.peers) s.send_to(peer, Message::done, "");
  } else {
    lock.unlock();
    s.send_to(s.peers.front(), Message::bye, "");
    lock.lock();
    if (!s.cv.wait_until(lock, deadline, [&] { return s.failed || s.done; }))
      throw RuntimeFailure(s.self() + ": finish timed out after " + ms(timeout) + " waiting for rank 0");
    if (s.failed) throw RuntimeFailure(s.failure);
    lock.unlock();
    s.stop_watch();
  }
  for (State::Peer& peer : s.peers) {
    std::lock_guard<std::mutex> write_lock(s.write_mu);
    if (peer.fd >= 0) ::close(peer.fd);
    peer.fd = -1;
  }
}

}  // namespace loom
