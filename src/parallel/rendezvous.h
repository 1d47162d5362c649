// The TCP rendezvous of a World, and the watch that keeps a dead rank from hanging the
// others.
//
// Rank 0 listens on MASTER_ADDR:MASTER_PORT (or the socket spawn_local handed it); every
// other rank connects, retrying until rank 0 is up, and says who it is. Once all have
// arrived rank 0 sends each the same opaque payload (NCCL's unique id, 128 bytes) and the
// table of every rank's address and contribution (SocketComm's listening port). When
// the timeout passes first, rank 0 throws RuntimeFailure naming the ranks that did not
// arrive and sends the same message to those that did, which throw it too; a rank that
// cannot reach rank 0 throws naming rank 0. Ranks other than 0 wait kVerdictMargin longer
// than the timeout, so that they hear rank 0's verdict rather than time out on their own.
//
// The connections then stay open and a thread watches them:
//   - a rank that dies (its process ends, so the kernel closes its socket; a vanished host
//     is caught by TCP keep-alive within about 25 s) or calls report_failure: rank 0 tells
//     every other rank, and on every rank on_failure(message naming that rank) runs once;
//   - rank 0 dying: the others' connections close, and they run on_failure naming it.
// The default on_failure prints "loom: <message>" and ends the process with exit code 3
// (RuntimeFailure's), even while its main thread is blocked in a collective. finish() is
// the clean end: a barrier after which no one reads a closed connection as a death.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/launcher.h"

namespace loom {

constexpr std::chrono::milliseconds kVerdictMargin{1000};

// Binds a listening TCP socket (close-on-exec) to addr:port, port 0 for any free one;
// returns its fd and sets *bound_port. Throws RuntimeFailure.
int rendezvous_listen(const std::string& addr, int port, int* bound_port);

// Prints "loom: <message>" on stderr and ends the process with exit code 3.
[[noreturn]] void rendezvous_exit_on_failure(const std::string& message);

// What the rendezvous learnt of one rank: the address rank 0 saw its connection come from
// (rank 0's own: MASTER_ADDR, which every rank reached it at), and the bytes it passed as
// `contribution` to join.
struct RendezvousRank {
  std::string address;
  std::vector<uint8_t> contribution;
};

constexpr size_t kMaxRendezvousContribution = 1024;

class Rendezvous {
 public:
  using FailureHandler = std::function<void(const std::string& message)>;

  // Joins the rendezvous of `world` (size > 1) within `timeout`. `payload` (at most
  // 64 KiB) is what rank 0 hands out; the other ranks' is ignored. `contribution` (at most
  // kMaxRendezvousContribution bytes) is this rank's entry of ranks(). The watch starts when
  // this returns; it takes ownership of world.rendezvous_fd on rank 0.
  static std::unique_ptr<Rendezvous> join(const World& world, const std::vector<uint8_t>& payload,
                                          std::chrono::milliseconds timeout,
                                          FailureHandler on_failure = rendezvous_exit_on_failure,
                                          const std::vector<uint8_t>& contribution = {});
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  const std::vector<uint8_t>& payload() const { return payload_; }
  // Every rank's entry, by rank, the same on every rank.
  const std::vector<RendezvousRank>& ranks() const { return ranks_; }

  // Tells every rank that this one failed: they run on_failure("rank R failed: message").
  // This rank's own handler does not run; the caller ends the process as it would anyway.
  void report_failure(const std::string& message);
  // Waits until every rank has called finish (RuntimeFailure after `timeout`), then closes
  // the connections and stops the watch.
  void finish(std::chrono::milliseconds timeout);

  struct State;

 private:
  explicit Rendezvous(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  std::vector<uint8_t> payload_;
  std::vector<RendezvousRank> ranks_;
};

}  // namespace loom
