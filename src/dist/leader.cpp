// Node 0's side of rendezvous.h: validation of every hello, the blob broadcast, plan sends and
// the heartbeat monitor.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "base/clock.h"
#include "dist/dist_error.h"
#include "dist/rendezvous.h"

namespace serval::dist {

struct Leader::Peer {
  int rank = 0;
  std::string hostname, address;
  Socket sock;
  FrameReader reader;
  double last_seen = 0;  // monitor thread only
  std::mutex send_mu;    // one frame at a time on the socket

  std::string name() const { return fmt::format("node {} ({}, {})", rank, hostname, address); }
};

namespace {

constexpr double kRejectGraceS = 0.5;

// Sends the reason, then waits briefly for the peer to close first, so our close does not
// reset the connection before the peer has read the reason.
void reject_and_close(Socket& s, const std::string& why) {
  if (!s.valid()) return;
  double deadline = now_seconds() + kRejectGraceS;
  try {
    send_all(s, encode_text_frame(MsgType::kReject, why), deadline);
    ::shutdown(s.fd(), SHUT_WR);
    FrameReader sink;
    while (wait_readable(s, deadline) && read_available(s, sink) >= 0) {
    }
  } catch (const DistError&) {
    // Best effort: the peer may already be gone, and node 0 reports the reason anyway.
  }
  s.close();
}

std::string hex64(uint64_t v) {
  return fmt::format("0x{:016x}", v);
}

}  // namespace

Leader::Leader(RendezvousOptions opts) : opts_(std::move(opts)) {
  if (opts_.node_rank != 0)
    throw InvalidArgument(fmt::format("Leader is node 0, not node {}", opts_.node_rank));
  if (opts_.nnodes < 1 || opts_.timeout_s <= 0 || opts_.heartbeat_interval_s <= 0 ||
      opts_.peer_timeout_s <= opts_.heartbeat_interval_s)
    throw InvalidArgument(fmt::format(
        "rendezvous options: nnodes {} >= 1, timeout {} s > 0, heartbeat {} s > 0 and peer "
        "timeout {} s > heartbeat required",
        opts_.nnodes, opts_.timeout_s, opts_.heartbeat_interval_s, opts_.peer_timeout_s));
  listener_ = listen_tcp(opts_.host, opts_.port);
  port_ = local_port(listener_);
  if (::pipe(wake_) != 0) throw DistError("pipe() for the rendezvous monitor failed");
}

Leader::~Leader() {
  shutdown();
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

[[noreturn]] void Leader::abort_rendezvous(const std::string& why, std::vector<Socket*> targets) {
  for (Socket* s : targets) reject_and_close(*s, why);
  throw DistError(why);
}

void Leader::rendezvous(const UniqueId& id) {
  if (!listener_.valid()) throw DistError("Leader::rendezvous called twice or after shutdown");
  const double start = now_seconds(), deadline = start + opts_.timeout_s;
  const int n_followers = opts_.nnodes - 1;
  struct Pending {
    Socket sock;
    FrameReader reader;
    std::string address;
  };
  std::vector<std::unique_ptr<Peer>> arrived(n_followers);
  std::vector<Pending> pending;
  int count = 0;
  auto arrived_sockets = [&] {
    std::vector<Socket*> out;
    for (auto& p : arrived)
      if (p) out.push_back(&p->sock);
    return out;
  };
  // Every node connected so far learns the reason: arrived, offender, and those whose hello is
  // not read yet (including connections still queued on the listener).
  auto fail = [&](const std::string& why, Socket* offender = nullptr) {
    auto targets = arrived_sockets();
    if (offender) targets.push_back(offender);
    try {
      while (auto s = accept_tcp(listener_)) pending.push_back({std::move(*s), FrameReader{}, ""});
    } catch (const DistError&) {
    }
    for (auto& p : pending)
      if (&p.sock != offender) targets.push_back(&p.sock);
    abort_rendezvous(why, targets);
  };
  // Validates one hello; returns the reason it is refused, or "" to accept.
  auto check_hello = [&](const Hello& h, const std::string& who) -> std::string {
    if (h.nnodes != opts_.nnodes)
      return fmt::format("{} has --nnodes {}, node 0 has --nnodes {}", who, h.nnodes, opts_.nnodes);
    if (h.node_rank < 1 || h.node_rank >= opts_.nnodes)
      return fmt::format("{} has node rank {}, outside 1..{} (--nnodes {}; rank 0 is node 0)", who,
                         h.node_rank, opts_.nnodes - 1, opts_.nnodes);
    if (const auto& first = arrived[h.node_rank - 1])
      return fmt::format("node rank {} claimed twice: by {} and by {}", h.node_rank, first->name(),
                         who);
    if (h.config_hash != opts_.config_hash)
      return fmt::format(
          "{} has config hash {} but node 0 has {}: every node must run the same model, "
          "config and parallel flags",
          who, hex64(h.config_hash), hex64(opts_.config_hash));
    return "";
  };

  while (count < n_followers) {
    double now = now_seconds();
    if (now >= deadline) {
      std::vector<int> missing, present;
      for (int r = 1; r <= n_followers; ++r) (arrived[r - 1] ? present : missing).push_back(r);
      fail(
          fmt::format("rendezvous at {}:{} timed out after {:.1f} s: node(s) {} never arrived "
                      "(arrived: {})",
                      opts_.host, port_, opts_.timeout_s, fmt::join(missing, ", "),
                      present.empty() ? "none" : fmt::format("{}", fmt::join(present, ", "))));
    }
    std::vector<pollfd> fds{{listener_.fd(), POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.sock.fd(), POLLIN, 0});
    for (auto& p : arrived)
      if (p) fds.push_back({p->sock.fd(), POLLIN, 0});
    int wait_ms = static_cast<int>(std::clamp((deadline - now) * 1000.0, 1.0, 100.0));
    if (::poll(fds.data(), fds.size(), wait_ms) <= 0) continue;

    // Followers that already arrived must stay connected and silent until the welcome.
    size_t fi = 1 + pending.size();
    for (auto& p : arrived) {
      if (!p) continue;
      if (fds[fi++].revents == 0) continue;
      long n = -1;
      try {
        n = read_available(p->sock, p->reader);
        if (n >= 0 && p->reader.next()) n = -2;
      } catch (const DistError&) {
        n = -2;
      }
      if (n < 0) {
        std::string why = n == -1 ? "disconnected" : "sent an unexpected frame";
        p->sock.close();
        fail(fmt::format("{} {} before the rendezvous completed", p->name(), why));
      }
    }

    // Pending connections: wait for a hello. Garbage from a non-serval client is dropped.
    for (size_t i = pending.size(); i-- > 0;) {
      Pending& c = pending[i];
      if (fds[1 + i].revents == 0) continue;
      std::optional<Frame> f;
      bool drop = false;
      try {
        drop = read_available(c.sock, c.reader) < 0;
        if (!drop) f = c.reader.next();
      } catch (const DistError&) {
        drop = true;
      }
      if (f && f->type != MsgType::kHello) drop = true;
      if (drop) {
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
        continue;
      }
      if (!f) continue;
      std::string who = fmt::format("the node at {}", c.address);
      Hello h;
      try {
        h = decode_hello(f->payload);
      } catch (const DistError& e) {
        fail(fmt::format("{} sent a bad hello: {}", who, e.what()), &c.sock);
      }
      who = fmt::format("node {} ({}, {})", h.node_rank, h.hostname, c.address);
      if (std::string why = check_hello(h, who); !why.empty()) fail(why, &c.sock);
      auto p = std::make_unique<Peer>();
      p->rank = h.node_rank;
      p->hostname = h.hostname;
      p->address = c.address;
      p->sock = std::move(c.sock);
      p->reader = std::move(c.reader);
      arrived[h.node_rank - 1] = std::move(p);
      ++count;
      pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
    }

    if (fds[0].revents != 0) {
      while (auto s = accept_tcp(listener_)) {
        std::string addr = peer_address(*s);
        pending.push_back({std::move(*s), FrameReader{}, addr});
      }
    }
  }

  for (auto& p : arrived) {
    try {
      send_frame(p->sock, MsgType::kWelcome, id, now_seconds() + opts_.peer_timeout_s);
    } catch (const DistError& e) {
      fail(fmt::format("sending the unique id to {} failed: {}", p->name(), e.what()));
    }
  }
  listener_.close();  // late joiners get "connection refused" until their own timeout
  double now = now_seconds();
  for (auto& p : arrived) {
    p->last_seen = now;
    infos_.push_back({p->rank, p->hostname, p->address});
  }
  peers_ = std::move(arrived);
  if (!peers_.empty()) monitor_ = std::thread([this] { monitor_loop(); });
}

void Leader::send_plan(std::span<const uint8_t> plan) {
  if (broken_) throw PeerLost(lost_reason());
  if (shut_down_ || static_cast<int>(peers_.size()) != opts_.nnodes - 1)
    throw DistError("send_plan before rendezvous() or after shutdown()");
  std::vector<uint8_t> frame = encode_frame(MsgType::kPlan, plan);
  for (auto& p : peers_) {
    std::string why;
    {
      std::lock_guard lock(p->send_mu);
      try {
        send_all(p->sock, frame, now_seconds() + opts_.peer_timeout_s);
      } catch (const DistError& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      mark_lost(*p, why);
      throw PeerLost(lost_reason());
    }
    if (broken_) throw PeerLost(lost_reason());
  }
}

bool Leader::healthy() const {
  return !broken_;
}

std::string Leader::lost_reason() const {
  std::lock_guard lock(mu_);
  return lost_reason_;
}

void Leader::mark_lost(Peer& lost, const std::string& why) {
  std::string reason;
  {
    std::lock_guard lock(mu_);
    if (broken_) return;
    lost_reason_ = fmt::format("{} lost: {}", lost.name(), why);
    reason = lost_reason_;
    broken_ = true;
  }
  for (auto& p : peers_) {
    if (p.get() == &lost) continue;
    std::lock_guard lock(p->send_mu);
    try {
      send_all(p->sock, encode_text_frame(MsgType::kAbort, reason), now_seconds() + kRejectGraceS);
    } catch (const DistError&) {
    }
  }
  if (on_lost_) on_lost_(reason);
}

void Leader::monitor_loop() {
  const double interval = opts_.heartbeat_interval_s, limit = opts_.peer_timeout_s;
  double next_beat = now_seconds();
  while (!stop_ && !broken_) {
    double now = now_seconds();
    if (now >= next_beat) {
      for (auto& p : peers_) {
        std::unique_lock lock(p->send_mu, std::try_to_lock);
        if (!lock.owns_lock()) continue;  // a plan is being sent: that is traffic enough
        try {
          send_frame(p->sock, MsgType::kHeartbeat, {}, now + limit);
        } catch (const DistError& e) {
          lock.unlock();
          mark_lost(*p, e.what());
          return;
        }
      }
      next_beat = now + interval;
    }
    for (auto& p : peers_) {
      if (now - p->last_seen > limit) {
        mark_lost(*p, fmt::format("no heartbeat for {:.1f} s (bound {:.1f} s)", now - p->last_seen,
                                  limit));
        return;
      }
    }
    std::vector<pollfd> fds{{wake_[0], POLLIN, 0}};
    for (auto& p : peers_) fds.push_back({p->sock.fd(), POLLIN, 0});
    int wait_ms = static_cast<int>(std::max(1.0, (next_beat - now_seconds()) * 1000.0));
    if (::poll(fds.data(), fds.size(), wait_ms) <= 0) continue;
    if (fds[0].revents != 0) return;  // shutdown
    for (size_t i = 0; i < peers_.size(); ++i) {
      if (fds[1 + i].revents == 0) continue;
      Peer& p = *peers_[i];
      std::string why;
      try {
        long n = read_available(p.sock, p.reader);
        if (n < 0) why = "closed the connection";
        if (n > 0) p.last_seen = now_seconds();
        while (why.empty()) {
          auto f = p.reader.next();
          if (!f) break;
          if (f->type != MsgType::kHeartbeat)
            why = fmt::format("sent an unexpected {} frame", msg_type_name(f->type));
        }
      } catch (const DistError& e) {
        why = e.what();
      }
      if (!why.empty()) {
        mark_lost(p, why);
        return;
      }
    }
  }
}

void Leader::shutdown() {
  if (shut_down_.exchange(true)) return;
  stop_ = true;
  if (wake_[1] >= 0) {
    char c = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &c, 1);
  }
  if (monitor_.joinable()) monitor_.join();
  if (!broken_) {
    for (auto& p : peers_) {
      std::lock_guard lock(p->send_mu);
      try {
        send_frame(p->sock, MsgType::kShutdown, {}, now_seconds() + kRejectGraceS);
      } catch (const DistError&) {
      }
    }
  }
  for (auto& p : peers_) p->sock.close();
  listener_.close();
}

}  // namespace serval::dist
