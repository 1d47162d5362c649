// The TCP pieces the rendezvous and SocketComm share: connecting with retries until a
// deadline, and the options every long-lived connection gets.
#pragma once

#include <chrono>
#include <string>

namespace loom {

// Keep-alive probes (10 s idle, then 3 probes 5 s apart), because dead hosts do not close
// their sockets, and no Nagle delay (the frames are small: headers, acks).
void tcp_set_keepalive(int fd);

// A connected socket to host:port, retrying every 50 ms (the peer may not listen yet) until
// the deadline; non-blocking, close-on-exec. -1 when none by the deadline: *error says why
// the last attempt failed.
int tcp_connect_until(const std::string& host, int port, std::chrono::steady_clock::time_point deadline,
                      std::string* error);

}  // namespace loom
