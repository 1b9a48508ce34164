// Thin POSIX TCP helpers for the control channel: every socket is non-blocking and every wait
// has a deadline (seconds on the serval::now_seconds() clock), so no call can hang.
#pragma once
#include <optional>
#include <span>
#include <string>

#include "dist/frame.h"

namespace serval::dist {

// Owns one file descriptor; move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.release()) {}
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void close();

 private:
  int fd_ = -1;
};

// Listens on host:port (port 0: the kernel picks one; see local_port). host "" or "0.0.0.0"
// listens on every IPv4 interface. Throws DistError naming the address (e.g. in use).
Socket listen_tcp(const std::string& host, int port);
int local_port(const Socket& s);
// "a.b.c.d:port" of the other end, for messages.
std::string peer_address(const Socket& s);

// One connection attempt that gives up at `deadline`. Returns nullopt and sets *why when the
// peer is not (yet) there, so callers can retry until their own deadline.
std::optional<Socket> try_connect_tcp(const std::string& host, int port, double deadline,
                                      std::string* why);

// Accepts one pending connection (non-blocking), or nullopt when none is pending.
std::optional<Socket> accept_tcp(const Socket& listener);

// Writes all bytes or throws DistError (peer closed, error, or `deadline` passed). Never raises
// SIGPIPE.
void send_all(const Socket& s, std::span<const uint8_t> bytes, double deadline);
void send_frame(const Socket& s, MsgType type, std::span<const uint8_t> payload, double deadline);

// Reads whatever is available now into `reader`. Returns the number of bytes read (0 when none
// are pending), or -1 when the peer closed the connection. Throws DistError on a socket error
// or a malformed frame header.
long read_available(const Socket& s, FrameReader& reader);

// Waits until s is readable (or closed) or the deadline passes; false on timeout.
bool wait_readable(const Socket& s, double deadline);

std::string local_hostname();

}  // namespace serval::dist
