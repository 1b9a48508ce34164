#include "dist/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>

#include "base/clock.h"
#include "dist/dist_error.h"

namespace serval::dist {
namespace {

std::string errno_text(int e) {
  return std::strerror(e);
}

int poll_ms(double deadline) {
  double left = deadline - now_seconds();
  if (left <= 0) return 0;
  return static_cast<int>(std::min(std::ceil(left * 1000.0), double{INT_MAX}));
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw DistError(fmt::format("fcntl(O_NONBLOCK): {}", errno_text(errno)));
}

void set_common_options(int fd) {
  set_nonblocking(fd);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // plans are latency-bound
  fcntl(fd, F_SETFD, FD_CLOEXEC);
}

// IPv4 address of host (numeric or a name) at port; throws DistError when unresolvable.
sockaddr_in resolve_ipv4(const std::string& host, int port) {
  if (port < 0 || port > 65535) throw DistError(fmt::format("port {} out of range", port));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0") {
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    return a;
  }
  if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw DistError(fmt::format("cannot resolve host '{}': {}", host, gai_strerror(rc)));
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return a;
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.release();
  }
  return *this;
}

int Socket::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket listen_tcp(const std::string& host, int port) {
  sockaddr_in a = resolve_ipv4(host, port);
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  if (!s.valid()) throw DistError(fmt::format("socket(): {}", errno_text(errno)));
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw DistError(fmt::format("cannot listen on {}:{}: bind: {}", host, port, errno_text(errno)));
  if (::listen(s.fd(), 128) != 0)
    throw DistError(fmt::format("cannot listen on {}:{}: {}", host, port, errno_text(errno)));
  set_common_options(s.fd());
  return s;
}

int local_port(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw DistError(fmt::format("getsockname: {}", errno_text(errno)));
  return ntohs(a.sin_port);
}

std::string peer_address(const Socket& s) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (getpeername(s.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return fmt::format("{}:{}", buf, ntohs(a.sin_port));
}

std::optional<Socket> try_connect_tcp(const std::string& host, int port, double deadline,
                                      std::string* why) {
  sockaddr_in a = resolve_ipv4(host, port);
  Socket s(::socket(AF_INET, SOCK_STREAM, 0));
  if (!s.valid()) throw DistError(fmt::format("socket(): {}", errno_text(errno)));
  set_common_options(s.fd());
  if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return s;
  if (errno != EINPROGRESS) {
    *why = errno_text(errno);
    return std::nullopt;
  }
  pollfd p{s.fd(), POLLOUT, 0};
  int rc;
  do rc = ::poll(&p, 1, poll_ms(deadline));
  while (rc < 0 && errno == EINTR);
  if (rc == 0) {
    *why = "connect timed out";
    return std::nullopt;
  }
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    *why = errno_text(err);
    return std::nullopt;
  }
  return s;
}

std::optional<Socket> accept_tcp(const Socket& listener) {
  int fd = ::accept(listener.fd(), nullptr, nullptr);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
      return std::nullopt;
    throw DistError(fmt::format("accept: {}", errno_text(errno)));
  }
  Socket s(fd);
  set_common_options(fd);
  return s;
}

void send_all(const Socket& s, std::span<const uint8_t> bytes, double deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::send(s.fd(), bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
      throw DistError(fmt::format("send to {}: {}", peer_address(s), errno_text(errno)));
    if (now_seconds() >= deadline)
      throw DistError(fmt::format("send to {} timed out with {} of {} bytes written",
                                  peer_address(s), done, bytes.size()));
    pollfd p{s.fd(), POLLOUT, 0};
    ::poll(&p, 1, std::min(poll_ms(deadline), 100));
  }
}

void send_frame(const Socket& s, MsgType type, std::span<const uint8_t> payload, double deadline) {
  send_all(s, encode_frame(type, payload), deadline);
}

long read_available(const Socket& s, FrameReader& reader) {
  uint8_t buf[64 * 1024];
  long total = 0;
  for (;;) {
    ssize_t n = ::recv(s.fd(), buf, sizeof buf, 0);
    if (n > 0) {
      reader.feed({buf, static_cast<size_t>(n)});
      total += n;
      if (total >= (1 << 20)) return total;  // let the caller parse; bounded work per call
      continue;
    }
    if (n == 0) return total > 0 ? total : -1;  // EOF is seen again on the next call
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return total;
    if (errno == ECONNRESET) return total > 0 ? total : -1;
    throw DistError(fmt::format("recv from {}: {}", peer_address(s), errno_text(errno)));
  }
}

bool wait_readable(const Socket& s, double deadline) {
  pollfd p{s.fd(), POLLIN, 0};
  for (;;) {
    int rc = ::poll(&p, 1, poll_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw DistError(fmt::format("poll: {}", errno_text(errno)));
  }
}

std::string local_hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown-host";
  return std::string(buf).substr(0, kMaxHostnameBytes);
}

}  // namespace serval::dist
