// The multi-node rendezvous over 127.0.0.1 with real processes (fork): the parent is node 0
// (or a follower when node 0 itself must die), children report through exit codes and a pipe.
#include "dist/rendezvous.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "dist/dist_error.h"

namespace serval::dist {
namespace {

constexpr int kOk = 0, kDistError = 10, kPeerLost = 11, kTimeout = 12, kOther = 13, kWrong = 20;
constexpr uint64_t kHash = 0x5e2a1c0ffee12345ULL;

// A forked process running `body`. The parent sends it one line (a port) and reads its lines;
// the exit code says how it ended, and the text carries its error message or findings.
class Child {
 public:
  using Body = std::function<int(Child& self, std::string& report)>;
  explicit Child(const Body& body) {
    int down[2], up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) std::abort();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(down[1]);
      ::close(up[0]);
      in_ = down[0];
      out_ = up[1];
      std::string report;
      int code;
      try {
        code = body(*this, report);
      } catch (const PeerLost& e) {
        report += e.what(), code = kPeerLost;
      } catch (const DistTimeout& e) {
        report += e.what(), code = kTimeout;
      } catch (const DistError& e) {
        report += e.what(), code = kDistError;
      } catch (const std::exception& e) {
        report += e.what(), code = kOther;
      }
      send_line(report);
      ::_exit(code);
    }
    ::close(down[0]);
    ::close(up[1]);
    in_ = up[0];
    out_ = down[1];
  }
  ~Child() {
    if (!reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(in_);
    ::close(out_);
  }

  void send_line(const std::string& s) {
    std::string line = s + "\n";
    for (size_t at = 0; at < line.size();) {
      ssize_t n = ::write(out_, line.data() + at, line.size() - at);
      if (n <= 0) return;
      at += static_cast<size_t>(n);
    }
  }
  // The next line from the other side, or "" after timeout_s or at end of stream.
  std::string read_line(double timeout_s = 10) {
    double deadline = now_seconds() + timeout_s;
    for (;;) {
      if (size_t nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      pollfd p{in_, POLLIN, 0};
      int ms = static_cast<int>((deadline - now_seconds()) * 1000);
      if (ms <= 0 || ::poll(&p, 1, ms) <= 0) return "";
      char tmp[4096];
      ssize_t n = ::read(in_, tmp, sizeof tmp);
      if (n <= 0) return "";
      buf_.append(tmp, static_cast<size_t>(n));
    }
  }
  int read_int() { return std::stoi(read_line()); }

  // Exit code (or 128 + signal); the last line it wrote is in `report`. Kills it at timeout.
  int wait(std::string* report = nullptr, double timeout_s = 10) {
    double deadline = now_seconds() + timeout_s;
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (now_seconds() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    reaped_ = true;
    std::string last, line;
    while (!(line = read_line(0.5)).empty() || !buf_.empty()) {
      last = line;
      if (line.empty()) break;
    }
    if (report) *report = last;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void signal(int sig) { ::kill(pid_, sig); }

 private:
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1;
  std::string buf_;
  bool reaped_ = false;
};

RendezvousOptions options(int rank, int nnodes, int port = 0) {
  RendezvousOptions o;
  o.host = "127.0.0.1";
  o.port = port;
  o.node_rank = rank;
  o.nnodes = nnodes;
  o.config_hash = kHash;
  o.hostname = "host" + std::to_string(rank);
  o.timeout_s = 5;
  o.heartbeat_interval_s = 0.1;
  o.peer_timeout_s = 1.0;
  return o;
}

// Plan i: sizes 0, 37·i bytes and one of 1 MiB, with content that depends on i and position.
std::vector<uint8_t> make_plan(int i) {
  size_t n = i == 0 ? 0 : i == 3 ? (1u << 20) : 37u * i;
  std::vector<uint8_t> p(n);
  for (size_t k = 0; k < n; ++k) p[k] = static_cast<uint8_t>(i * 131 + k * 7);
  return p;
}

UniqueId random_id(uint32_t seed) {
  std::mt19937 rng(seed);
  UniqueId id;
  for (auto& b : id) b = static_cast<uint8_t>(rng());
  return id;
}

std::string hex(const UniqueId& id) {
  std::string s;
  for (uint8_t b : id) s += fmt::format("{:02x}", b);
  return s;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A follower child: takes the port from the parent, reports the blob, checks `num_plans` plans
// in order, then expects a clean shutdown.
Child::Body follower(int rank, int nnodes, int num_plans, uint64_t hash = kHash) {
  return [=](Child& self, std::string& report) {
    RendezvousOptions o = options(rank, nnodes, self.read_int());
    o.config_hash = hash;
    Follower f(o);
    self.send_line(hex(f.unique_id()));
    for (int i = 0; i < num_plans; ++i) {
      auto plan = f.recv_plan(5);
      if (!plan || *plan != make_plan(i)) {
        report = fmt::format("plan {} missing or wrong ({} bytes)", i, plan ? plan->size() : 0);
        return kWrong;
      }
    }
    if (num_plans >= 0 && f.recv_plan(5)) {
      report = "expected shutdown, got another plan";
      return kWrong;
    }
    return kOk;
  };
}

class RendezvousN : public ::testing::TestWithParam<int> {};

TEST_P(RendezvousN, EveryNodeGetsTheBlobAndThePlansInOrder) {
  const int nnodes = GetParam(), num_plans = 12;
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 1; r < nnodes; ++r)
    children.push_back(std::make_unique<Child>(follower(r, nnodes, num_plans)));
  Leader leader(options(0, nnodes));
  for (auto& c : children) c->send_line(std::to_string(leader.port()));
  UniqueId id = random_id(nnodes);
  leader.rendezvous(id);
  ASSERT_EQ(leader.peers().size(), static_cast<size_t>(nnodes - 1));
  for (int r = 1; r < nnodes; ++r) {
    EXPECT_EQ(leader.peers()[r - 1].node_rank, r);
    EXPECT_EQ(leader.peers()[r - 1].hostname, "host" + std::to_string(r));
  }
  for (int i = 0; i < num_plans; ++i) leader.send_plan(make_plan(i));
  EXPECT_TRUE(leader.healthy());
  leader.shutdown();
  for (int r = 1; r < nnodes; ++r) {
    Child& c = *children[r - 1];
    EXPECT_EQ(c.read_line(), hex(id)) << "node " << r;
    std::string report;
    EXPECT_EQ(c.wait(&report), kOk) << "node " << r << ": " << report;
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, RendezvousN, ::testing::Values(3, 4));

TEST(Rendezvous, SingleNodeNeedsNoPeers) {
  Leader leader(options(0, 1));
  leader.rendezvous(random_id(1));
  leader.send_plan(make_plan(2));
  EXPECT_TRUE(leader.healthy());
}

TEST(Rendezvous, ConfigHashMismatchNamesTheNodeAndBothHashes) {
  const uint64_t other = 0x00000000deadbeefULL;
  Child good(follower(1, 3, 0)), bad(follower(2, 3, 0, other));
  Leader leader(options(0, 3));
  good.send_line(std::to_string(leader.port()));
  // Node 1 connects first: a node that connects only after node 0 gave up cannot be told why.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  bad.send_line(std::to_string(leader.port()));
  try {
    leader.rendezvous(random_id(7));
    FAIL() << "mismatch accepted";
  } catch (const DistError& e) {
    std::string m = e.what();
    EXPECT_TRUE(contains(m, "node 2 (host2")) << m;
    EXPECT_TRUE(contains(m, "0x00000000deadbeef")) << m;
    EXPECT_TRUE(contains(m, "0x5e2a1c0ffee12345")) << m;
  }
  std::string report;
  EXPECT_EQ(bad.wait(&report), kDistError);
  EXPECT_TRUE(contains(report, "rejected node 2")) << report;
  EXPECT_TRUE(contains(report, "0x00000000deadbeef") && contains(report, "0x5e2a1c0ffee12345"))
      << report;
  // node 1 arrived first or second; either way it learns why the group failed.
  int code = good.wait(&report);
  EXPECT_TRUE(code == kDistError && contains(report, "config hash")) << code << ": " << report;
}

TEST(Rendezvous, NodeThatNeverArrivesIsNamedAfterTheTimeout) {
  Child n1(follower(1, 4, 0)), n2(follower(2, 4, 0));
  RendezvousOptions o = options(0, 4);
  o.timeout_s = 1.0;
  Leader leader(o);
  n1.send_line(std::to_string(leader.port()));
  n2.send_line(std::to_string(leader.port()));
  double start = now_seconds();
  try {
    leader.rendezvous(random_id(3));
    FAIL() << "rendezvous completed without node 3";
  } catch (const DistError& e) {
    EXPECT_TRUE(contains(e.what(), "node(s) 3 never arrived (arrived: 1, 2)")) << e.what();
  }
  double took = now_seconds() - start;
  EXPECT_GE(took, 0.95);
  EXPECT_LT(took, 3.0);
  for (Child* c : {&n1, &n2}) {
    std::string report;
    EXPECT_EQ(c->wait(&report), kDistError) << report;
    EXPECT_TRUE(contains(report, "never arrived")) << report;
  }
}

TEST(Rendezvous, DuplicateRankIsRefused) {
  Child a(follower(1, 3, 0)), b(follower(1, 3, 0));
  Leader leader(options(0, 3));
  a.send_line(std::to_string(leader.port()));
  b.send_line(std::to_string(leader.port()));
  try {
    leader.rendezvous(random_id(5));
    FAIL() << "duplicate accepted";
  } catch (const DistError& e) {
    EXPECT_TRUE(contains(e.what(), "node rank 1 claimed twice")) << e.what();
  }
  for (Child* c : {&a, &b}) {
    std::string report;
    EXPECT_EQ(c->wait(&report), kDistError) << report;
    EXPECT_TRUE(contains(report, "claimed twice")) << report;
  }
}

TEST(Rendezvous, RankOutOfRangeAndNnodesMismatch) {
  struct Case {
    int rank, nnodes;
    std::string want;
  };
  for (const Case& k : {Case{5, 2, "node rank 5, outside 1..1"},
                        Case{1, 3, "has --nnodes 3, node 0 has --nnodes 2"}}) {
    Child c(follower(k.rank, k.nnodes, 0));
    Leader leader(options(0, 2));
    c.send_line(std::to_string(leader.port()));
    try {
      leader.rendezvous(random_id(9));
      FAIL() << k.want;
    } catch (const DistError& e) {
      EXPECT_TRUE(contains(e.what(), k.want)) << e.what();
    }
    std::string report;
    EXPECT_EQ(c.wait(&report), kDistError);
    EXPECT_TRUE(contains(report, k.want)) << report;
  }
}

TEST(Rendezvous, GarbageConnectionsAreIgnored) {
  Child noise([](Child& self, std::string&) {
    int port = self.read_int();
    std::string why;
    auto s = try_connect_tcp("127.0.0.1", port, now_seconds() + 2, &why);
    if (!s) return kWrong;
    std::vector<uint8_t> junk(300, 0xab);
    send_all(*s, junk, now_seconds() + 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return kOk;
  });
  Child good(follower(1, 2, 1));
  Leader leader(options(0, 2));
  noise.send_line(std::to_string(leader.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the junk arrive first
  good.send_line(std::to_string(leader.port()));
  leader.rendezvous(random_id(11));
  leader.send_plan(make_plan(0));
  leader.shutdown();
  std::string report;
  EXPECT_EQ(good.wait(&report), kOk) << report;
  EXPECT_EQ(noise.wait(), kOk);
}

// Followers that wait for plans until node 0 aborts the group.
Child::Body waiting_follower(int rank, int nnodes) {
  return [=](Child& self, std::string& report) {
    Follower f(options(rank, nnodes, self.read_int()));
    auto first = f.recv_plan(5);
    if (!first || *first != make_plan(1)) return kWrong;
    self.send_line("got plan");
    f.recv_plan(10);  // throws PeerLost once node 0 aborts
    report = "recv_plan returned";
    return kWrong;
  };
}

void lose_a_peer(int nnodes, int victim, int sig, const std::string& want, double bound_s) {
  std::vector<std::unique_ptr<Child>> children;
  for (int r = 1; r < nnodes; ++r)
    children.push_back(std::make_unique<Child>(waiting_follower(r, nnodes)));
  RendezvousOptions o = options(0, nnodes);
  o.peer_timeout_s = 0.5;
  Leader leader(o);
  std::mutex mu;
  int callbacks = 0;
  std::string callback_reason;
  leader.set_on_peer_lost([&](const std::string& why) {
    std::lock_guard lock(mu);
    callback_reason = why;
    ++callbacks;
  });
  for (auto& c : children) c->send_line(std::to_string(leader.port()));
  leader.rendezvous(random_id(13));
  leader.send_plan(make_plan(1));
  for (auto& c : children) ASSERT_EQ(c->read_line(), "got plan");

  double start = now_seconds();
  children[victim - 1]->signal(sig);
  while (leader.healthy() && now_seconds() - start < 5)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  double took = now_seconds() - start;
  ASSERT_FALSE(leader.healthy()) << "node 0 did not notice within 5 s";
  EXPECT_LT(took, bound_s);
  std::string reason = leader.lost_reason();
  EXPECT_TRUE(contains(reason, fmt::format("node {} (host{}", victim, victim))) << reason;
  EXPECT_TRUE(contains(reason, want)) << reason;
  EXPECT_THROW(leader.send_plan(make_plan(2)), PeerLost);
  // The callback runs right after healthy() turns false (after the aborts are sent).
  for (double t0 = now_seconds(); now_seconds() - t0 < 2;) {
    std::lock_guard lock(mu);
    if (callbacks > 0) break;
  }
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(callbacks, 1);
    EXPECT_EQ(callback_reason, reason);
  }
  children[victim - 1]->signal(SIGKILL);
  for (int r = 1; r < nnodes; ++r) {
    if (r == victim) continue;
    std::string report;
    EXPECT_EQ(children[r - 1]->wait(&report), kPeerLost) << report;
    EXPECT_TRUE(contains(report, fmt::format("node {} (host{}", victim, victim))) << report;
  }
}

TEST(Rendezvous, KilledPeerIsNoticedAtOnce) {
  // The kernel closes a killed process's socket: node 0 sees end of stream immediately.
  lose_a_peer(4, 2, SIGKILL, "closed the connection", 0.5);
}

TEST(Rendezvous, FrozenPeerIsNoticedWithinTheHeartbeatBound) {
  // A stopped process keeps its socket open but sends no heartbeats (peer_timeout 0.5 s).
  lose_a_peer(3, 1, SIGSTOP, "no heartbeat", 1.5);
}

// The parent is node 1; a child is node 0, which then dies (SIGKILL) or freezes (SIGSTOP).
void lose_the_leader(int sig, const std::string& want, double bound_s) {
  Child leader_proc([](Child& self, std::string&) {
    RendezvousOptions o = options(0, 2);
    o.peer_timeout_s = 0.5;
    Leader leader(o);
    self.send_line(std::to_string(leader.port()));
    leader.rendezvous(random_id(17));
    leader.send_plan(make_plan(1));
    std::this_thread::sleep_for(std::chrono::seconds(30));  // killed long before
    return kOk;
  });
  RendezvousOptions o = options(1, 2, leader_proc.read_int());
  o.peer_timeout_s = 0.5;
  Follower f(o);
  EXPECT_EQ(f.unique_id(), random_id(17));
  auto plan = f.recv_plan(5);
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(*plan, make_plan(1));
  double start = now_seconds();
  leader_proc.signal(sig);
  try {
    f.recv_plan(5);
    FAIL() << "recv_plan returned after node 0 was lost";
  } catch (const PeerLost& e) {
    EXPECT_TRUE(contains(e.what(), want)) << e.what();
    EXPECT_TRUE(contains(e.what(), "node 0 at 127.0.0.1")) << e.what();
  }
  EXPECT_LT(now_seconds() - start, bound_s);
  leader_proc.signal(SIGKILL);
}

TEST(Rendezvous, FollowerNoticesKilledLeader) {
  lose_the_leader(SIGKILL, "closed", 0.5);
}

TEST(Rendezvous, FollowerNoticesFrozenLeader) {
  lose_the_leader(SIGSTOP, "no message from node 0", 1.5);
}

TEST(Rendezvous, FollowerTimesOutWithoutALeader) {
  int port;
  {
    Socket probe = listen_tcp("127.0.0.1", 0);
    port = local_port(probe);
  }  // closed: nobody listens there now
  RendezvousOptions o = options(1, 2, port);
  o.timeout_s = 0.3;
  double start = now_seconds();
  try {
    Follower f(o);
    FAIL() << "connected to nothing";
  } catch (const DistError& e) {
    EXPECT_TRUE(
        contains(e.what(), fmt::format("could not connect to node 0 at 127.0.0.1:{}", port)))
        << e.what();
  }
  EXPECT_LT(now_seconds() - start, 2.0);
}

TEST(Rendezvous, PlanTimeoutWhileTheLeaderIsAlive) {
  Child leader_proc([](Child& self, std::string&) {
    Leader leader(options(0, 2));
    self.send_line(std::to_string(leader.port()));
    leader.rendezvous(random_id(19));
    self.read_line(10);  // until the parent is done
    return kOk;
  });
  Follower f(options(1, 2, leader_proc.read_int()));
  EXPECT_THROW(f.recv_plan(0.3), DistTimeout);  // heartbeats keep arriving: not PeerLost
  leader_proc.send_line("done");
  EXPECT_EQ(leader_proc.wait(), kOk);
  EXPECT_EQ(f.recv_plan(2), std::nullopt);  // the leader's destructor shut down cleanly
}

}  // namespace
}  // namespace serval::dist
