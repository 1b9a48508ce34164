// The cross-node sum of the CPU backend's multi-node groups (backend::NodeExchange over TCP):
// node 0 listens on a data port of its own (handed to the others in the rendezvous blob), every
// other node connects once and announces its node rank. An all-reduce sends each node's partial
// sum to node 0, which adds them in node order and sends the total back, so every node holds
// the same bits. GPU groups use NCCL instead; this path lets the multi-node logic run (and be
// tested) anywhere.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "backend/communicator.h"
#include "dist/socket.h"

namespace serval::runtime {

class TcpNodeExchange final : public backend::NodeExchange {
 public:
  // Node 0: listens on host (a free port, data_port()); accept_all() then takes nnodes − 1
  // connections, each announcing a distinct node rank, or throws DistError at the deadline.
  static std::unique_ptr<TcpNodeExchange> listen(const std::string& host, int nnodes,
                                                 double op_timeout_s);
  int data_port() const;
  void accept_all(double timeout_s);
  // Node r > 0: connects to node 0's data port (retrying until timeout_s).
  static std::unique_ptr<TcpNodeExchange> connect(const std::string& host, int port, int node_rank,
                                                  int nnodes, double timeout_s,
                                                  double op_timeout_s);

  // Throws dist::PeerLost when a node closed its connection, dist::DistTimeout when one stayed
  // silent past op_timeout_s, DistError on a size mismatch, Error after abort().
  void all_reduce(std::vector<float>& values) override;
  void abort() override;

 private:
  TcpNodeExchange(int node_rank, int nnodes, double op_timeout_s);
  void check_not_aborted() const;

  int node_rank_, nnodes_;
  double op_timeout_s_;
  dist::Socket listener_;            // node 0 until accept_all()
  std::vector<dist::Socket> peers_;  // node 0: index r − 1 = node r; others: [0] = node 0
  std::vector<dist::FrameReader> readers_;
  std::atomic<bool> aborted_{false};
};

}  // namespace serval::runtime
