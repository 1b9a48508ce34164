#include "runtime/tcp_node_exchange.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <cstring>
#include <span>

#include "base/clock.h"
#include "dist/dist_error.h"

namespace serval::runtime {
namespace {

std::span<const uint8_t> as_bytes(const std::vector<float>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)};
}

// The next frame from `s`, waiting until `deadline`. `who` names the peer in errors.
dist::Frame recv_frame(const dist::Socket& s, dist::FrameReader& reader, double deadline,
                       const std::string& who) {
  for (;;) {
    if (auto f = reader.next()) return std::move(*f);
    if (!dist::wait_readable(s, deadline))
      throw dist::DistTimeout(fmt::format("no data from {} in time", who));
    if (dist::read_available(s, reader) < 0)
      throw dist::PeerLost(fmt::format("{} closed its data connection", who));
  }
}

}  // namespace

TcpNodeExchange::TcpNodeExchange(int node_rank, int nnodes, double op_timeout_s)
    : node_rank_(node_rank), nnodes_(nnodes), op_timeout_s_(op_timeout_s) {}

std::unique_ptr<TcpNodeExchange> TcpNodeExchange::listen(const std::string& host, int nnodes,
                                                         double op_timeout_s) {
  std::unique_ptr<TcpNodeExchange> x(new TcpNodeExchange(0, nnodes, op_timeout_s));
  x->listener_ = dist::listen_tcp(host, 0);
  return x;
}

int TcpNodeExchange::data_port() const {
  return dist::local_port(listener_);
}

void TcpNodeExchange::accept_all(double timeout_s) {
  const double deadline = now_seconds() + timeout_s;
  peers_.resize(size_t(nnodes_ - 1));
  readers_.resize(size_t(nnodes_ - 1));
  for (int joined = 0; joined < nnodes_ - 1;) {
    std::optional<dist::Socket> s = dist::accept_tcp(listener_);
    if (!s) {
      if (!dist::wait_readable(listener_, deadline))
        throw dist::DistTimeout(fmt::format("{} of {} nodes opened their data connection in time",
                                            joined, nnodes_ - 1));
      continue;
    }
    dist::FrameReader reader;
    dist::Frame hello = recv_frame(*s, reader, deadline, dist::peer_address(*s));
    int32_t rank = -1;
    if (hello.payload.size() == sizeof(rank))
      std::memcpy(&rank, hello.payload.data(), sizeof(rank));
    if (rank < 1 || rank >= nnodes_ || peers_[size_t(rank - 1)].valid())
      throw dist::DistError(fmt::format("data connection from {} announced node rank {}",
                                        dist::peer_address(*s), rank));
    peers_[size_t(rank - 1)] = std::move(*s);
    readers_[size_t(rank - 1)] = std::move(reader);
    ++joined;
  }
  listener_.close();
}

std::unique_ptr<TcpNodeExchange> TcpNodeExchange::connect(const std::string& host, int port,
                                                          int node_rank, int nnodes,
                                                          double timeout_s, double op_timeout_s) {
  std::unique_ptr<TcpNodeExchange> x(new TcpNodeExchange(node_rank, nnodes, op_timeout_s));
  const double deadline = now_seconds() + timeout_s;
  std::string why;
  for (;;) {
    if (auto s = dist::try_connect_tcp(host, port, deadline, &why)) {
      x->peers_.push_back(std::move(*s));
      break;
    }
    if (now_seconds() >= deadline)
      throw dist::DistTimeout(
          fmt::format("cannot open the data connection to node 0 at {}:{}: {}", host, port, why));
  }
  x->readers_.resize(1);
  const int32_t rank = node_rank;
  std::vector<uint8_t> hello(sizeof(rank));
  std::memcpy(hello.data(), &rank, sizeof(rank));
  dist::send_frame(x->peers_[0], dist::MsgType::kPlan, hello, deadline);
  return x;
}

void TcpNodeExchange::check_not_aborted() const {
  if (aborted_) throw Error("cross-node all-reduce aborted: another rank failed");
}

void TcpNodeExchange::all_reduce(std::vector<float>& values) {
  check_not_aborted();
  const double deadline = now_seconds() + op_timeout_s_;
  const size_t bytes = values.size() * sizeof(float);
  if (node_rank_ != 0) {
    dist::send_frame(peers_[0], dist::MsgType::kPlan, as_bytes(values), deadline);
    dist::Frame total = recv_frame(peers_[0], readers_[0], deadline, "node 0");
    if (total.payload.size() != bytes)
      throw dist::DistError(
          fmt::format("node 0 sent a total of {} bytes, expected {}", total.payload.size(), bytes));
    std::memcpy(values.data(), total.payload.data(), bytes);
    return;
  }
  for (int r = 1; r < nnodes_; ++r) {  // node order: the same sum on every node
    const std::string who = fmt::format("node {}", r);
    dist::Frame part = recv_frame(peers_[size_t(r - 1)], readers_[size_t(r - 1)], deadline, who);
    if (part.payload.size() != bytes)
      throw dist::DistError(
          fmt::format("{} sent {} bytes for a sum of {}", who, part.payload.size(), bytes));
    const float* p = reinterpret_cast<const float*>(part.payload.data());
    for (size_t i = 0; i < values.size(); ++i) values[i] += p[i];
  }
  for (const dist::Socket& s : peers_)
    dist::send_frame(s, dist::MsgType::kPlan, as_bytes(values), deadline);
}

void TcpNodeExchange::abort() {
  aborted_ = true;
  // Wakes a thread blocked on these sockets; the descriptors close with the object.
  for (const dist::Socket& s : peers_)
    if (s.valid()) ::shutdown(s.fd(), SHUT_RDWR);
}

}  // namespace serval::runtime
