// Node r > 0's side of rendezvous.h: connect with retries, hello, the blob, then plans and
// heartbeats.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "base/clock.h"
#include "dist/dist_error.h"
#include "dist/rendezvous.h"

namespace serval::dist {

Follower::Follower(RendezvousOptions opts) : opts_(std::move(opts)) {
  if (opts_.node_rank == 0) throw InvalidArgument("node 0 runs the Leader, not a Follower");
  if (opts_.timeout_s <= 0 || opts_.heartbeat_interval_s <= 0 ||
      opts_.peer_timeout_s <= opts_.heartbeat_interval_s)
    throw InvalidArgument(fmt::format(
        "rendezvous options: timeout {} s > 0, heartbeat {} s > 0 and peer timeout {} s > "
        "heartbeat required",
        opts_.timeout_s, opts_.heartbeat_interval_s, opts_.peer_timeout_s));
  if (opts_.hostname.empty()) opts_.hostname = local_hostname();
  where_ = fmt::format("node 0 at {}:{}", opts_.host, opts_.port);
  const double deadline = now_seconds() + opts_.timeout_s;

  // Node 0 may start later than this node: retry until the deadline.
  std::string why;
  for (;;) {
    if (auto s =
            try_connect_tcp(opts_.host, opts_.port, std::min(deadline, now_seconds() + 2), &why)) {
      sock_ = std::move(*s);
      break;
    }
    if (now_seconds() >= deadline)
      throw DistError(
          fmt::format("node {} could not connect to {} within {:.1f} s (last error: "
                      "{}); is node 0 running with the same --dist-init-addr?",
                      opts_.node_rank, where_, opts_.timeout_s, why));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  Hello hello{kProtocolVersion, opts_.node_rank, opts_.nnodes, opts_.config_hash, opts_.hostname};
  try {
    send_frame(sock_, MsgType::kHello, encode_hello(hello), deadline);
  } catch (const DistError& e) {
    throw DistError(
        fmt::format("node {}: hello to {} failed: {}", opts_.node_rank, where_, e.what()));
  }
  for (;;) {
    auto f = reader_.next();
    if (!f) {
      if (!wait_readable(sock_, deadline))
        throw DistError(fmt::format(
            "node {}: {} did not complete the rendezvous within {:.1f} s (other nodes missing?)",
            opts_.node_rank, where_, opts_.timeout_s));
      if (read_available(sock_, reader_) < 0)
        throw DistError(fmt::format("node {}: {} closed the connection during the rendezvous",
                                    opts_.node_rank, where_));
      continue;
    }
    if (f->type == MsgType::kWelcome) {
      id_ = decode_unique_id(f->payload);
      break;
    }
    if (f->type == MsgType::kReject)
      throw DistError(
          fmt::format("{} rejected node {}: {}", where_, opts_.node_rank, decode_text(f->payload)));
    throw DistError(fmt::format("node {}: unexpected {} frame from {} during the rendezvous",
                                opts_.node_rank, msg_type_name(f->type), where_));
  }
  last_seen_ = now_seconds();
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

Follower::~Follower() {
  {
    std::lock_guard lock(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Follower::heartbeat_loop() {
  auto interval = std::chrono::duration<double>(opts_.heartbeat_interval_s);
  std::unique_lock lock(hb_mu_);
  while (!hb_cv_.wait_for(lock, interval, [this] { return hb_stop_; })) {
    lock.unlock();
    try {
      send_frame(sock_, MsgType::kHeartbeat, {}, now_seconds() + opts_.peer_timeout_s);
    } catch (const DistError&) {
      return;  // recv_plan reports the lost connection
    }
    lock.lock();
  }
}

std::optional<std::vector<uint8_t>> Follower::recv_plan(double timeout_s) {
  if (ended_) return std::nullopt;
  const double deadline = now_seconds() + timeout_s;
  for (;;) {
    while (auto f = reader_.next()) {
      switch (f->type) {
        case MsgType::kPlan:
          return std::move(f->payload);
        case MsgType::kHeartbeat:
          break;
        case MsgType::kShutdown:
          ended_ = true;
          return std::nullopt;
        case MsgType::kAbort:
          throw PeerLost(fmt::format("node {}: {} aborted the group: {}", opts_.node_rank, where_,
                                     decode_text(f->payload)));
        case MsgType::kHello:
        case MsgType::kWelcome:
        case MsgType::kReject:
          throw DistError(fmt::format("node {}: unexpected {} frame from {}", opts_.node_rank,
                                      msg_type_name(f->type), where_));
      }
    }
    long n = read_available(sock_, reader_);
    double now = now_seconds();
    if (n > 0) {
      last_seen_ = now;
      continue;
    }
    if (n < 0)
      throw PeerLost(fmt::format("node {}: {} closed the connection", opts_.node_rank, where_));
    if (now - last_seen_ > opts_.peer_timeout_s)
      throw PeerLost(fmt::format("node {}: no message from {} for {:.1f} s (bound {:.1f} s)",
                                 opts_.node_rank, where_, now - last_seen_, opts_.peer_timeout_s));
    if (now >= deadline)
      throw DistTimeout(fmt::format("node {}: no plan from {} within {:.1f} s", opts_.node_rank,
                                    where_, timeout_s));
    wait_readable(sock_, std::min(deadline, last_seen_ + opts_.peer_timeout_s + 1e-3));
  }
}

}  // namespace serval::dist
