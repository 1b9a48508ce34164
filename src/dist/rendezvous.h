// Multi-node rendezvous and control channel over TCP. Node 0 (the Leader) listens on
// --dist-init-addr; nodes 1..N-1 (Followers) connect, say hello (protocol version, node rank,
// nnodes, config hash, hostname), and node 0 checks them all before handing every node the same
// 128-byte blob (the ncclUniqueId). Afterwards node 0 sends framed per-step plans to every node,
// and heartbeats both ways detect a lost peer within peer_timeout_s: calls fail with PeerLost
// instead of hanging.
#pragma once
#include <atomic>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "dist/frame.h"
#include "dist/socket.h"

namespace serval::dist {

struct RendezvousOptions {
  std::string host = "127.0.0.1";  // node 0's address; the Leader binds it ("0.0.0.0": all)
  int port = 0;                    // the Leader may bind 0 and publish Leader::port()
  int node_rank = 0, nnodes = 1;
  uint64_t config_hash = 0;  // caller's hash of model config + parallel flags (see launch.h)
  std::string hostname;      // empty: gethostname()
  double timeout_s = 300;    // the whole rendezvous, from construction to the blob
  double heartbeat_interval_s = 1.0;
  double peer_timeout_s = 10.0;  // silence (or an unsendable frame) this long = peer lost
};

struct PeerInfo {
  int node_rank = 0;
  std::string hostname, address;
};

// Node 0. Construction binds and listens; rendezvous() waits for the others.
class Leader {
 public:
  explicit Leader(RendezvousOptions opts);
  ~Leader();  // sends shutdown to the followers that are still there, then closes
  Leader(const Leader&) = delete;
  Leader& operator=(const Leader&) = delete;

  int port() const { return port_; }

  // Waits until nodes 1..nnodes-1 have all said hello and been validated, then sends each one
  // `id` and starts heartbeats. On a bad hello (protocol version, rank out of range or taken
  // twice, nnodes or config hash different from node 0's), a node that disconnects, or
  // timeout_s passing with ranks missing, every connected node gets the reason and this throws
  // DistError with it (naming the nodes, hosts and hashes, or the missing ranks).
  void rendezvous(const UniqueId& id);

  // Sends one plan to every follower, in rank order; plans arrive in the order sent. Throws
  // PeerLost once any peer was lost (the group is then broken: followers got an abort).
  // Called from one thread at a time.
  void send_plan(std::span<const uint8_t> plan);

  // False once a peer was lost; lost_reason() says which and why.
  bool healthy() const;
  std::string lost_reason() const;
  // Called once, from the monitor thread or send_plan's thread, when the first peer is lost
  // (e.g. to mark the server unhealthy). Set before rendezvous().
  void set_on_peer_lost(std::function<void(const std::string&)> cb) { on_lost_ = std::move(cb); }

  const std::vector<PeerInfo>& peers() const { return infos_; }

  // Tells the followers the session ended (their recv_plan returns nullopt) and closes.
  void shutdown();

 private:
  struct Peer;
  void monitor_loop();
  void mark_lost(Peer& p, const std::string& why);
  [[noreturn]] void abort_rendezvous(const std::string& why, std::vector<Socket*> extra);

  RendezvousOptions opts_;
  Socket listener_;
  int port_ = 0;
  std::vector<std::unique_ptr<Peer>> peers_;  // index node_rank - 1, after rendezvous()
  std::vector<PeerInfo> infos_;
  std::function<void(const std::string&)> on_lost_;
  mutable std::mutex mu_;
  std::string lost_reason_;  // guarded by mu_; non-empty once broken
  std::atomic<bool> broken_{false}, stop_{false}, shut_down_{false};
  int wake_[2] = {-1, -1};  // self-pipe that wakes the monitor for shutdown
  std::thread monitor_;
};

// Node r > 0. Construction connects (retrying until timeout_s), says hello and waits for the
// blob; it throws DistError with node 0's reason on rejection, or on timeout naming host:port.
class Follower {
 public:
  explicit Follower(RendezvousOptions opts);
  ~Follower();
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;

  const UniqueId& unique_id() const { return id_; }

  // The next plan from node 0; nullopt after node 0 shut the session down cleanly. Throws
  // PeerLost when node 0 closed the connection, went silent for peer_timeout_s, or aborted the
  // group (the message says why), and DistTimeout when timeout_s passes with node 0 alive.
  // Called from one thread at a time.
  std::optional<std::vector<uint8_t>> recv_plan(
      double timeout_s = std::numeric_limits<double>::infinity());

 private:
  void heartbeat_loop();

  RendezvousOptions opts_;
  std::string where_;  // "node 0 at host:port"
  Socket sock_;
  FrameReader reader_;
  UniqueId id_{};
  double last_seen_ = 0;
  bool ended_ = false;
  std::mutex hb_mu_;
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;
  std::thread heartbeat_;
};

}  // namespace serval::dist
