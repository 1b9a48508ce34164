// Tensor / expert parallel over several nodes: one process per node, each driving its share of
// the ranks on its own GPUs, all joined in one NCCL group. Node 0 runs the engine and the HTTP
// server; before every step it sends the step plan (runtime/step_plan.h) to the other nodes,
// which run the same step on their ranks (their collectives pair with node 0's). On CUDA the
// ranks of all nodes form one NCCL communicator; on the CPU (development and tests) each node
// sums its ranks in process and the nodes exchange their sums over TCP. The TCP
// rendezvous and control channel are dist::Leader / dist::Follower: node 0 checks that every
// node has the same model and flags (config hash), hands out the NCCL unique id, and heartbeats
// detect a lost node (node 0 then reports unhealthy; a follower exits non-zero).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "io/model_config.h"
#include "model/weight_source.h"
#include "runtime/engine.h"
#include "runtime/parallel_runner.h"

namespace serval::runtime {

// Which global ranks this node holds: the group's world_size() ranks split evenly over nnodes
// (node k holds [k·local, (k+1)·local) on its GPUs first_device..). InvalidArgument when the
// split is uneven, data parallel is combined with several nodes, or --dist-init-addr is missing.
struct NodePlacement {
  int world = 1, local_ranks = 1, first_rank = 0;
};
NodePlacement node_placement(const EngineConfig& cfg, int world_size);

// Hash of everything the nodes must agree on: config.json's text and the engine flags that
// shape the model, its shards and the KV cache.
uint64_t multi_node_config_hash(const EngineConfig& cfg, const std::string& config_json_text);

// Builds this node's ranks of a multi-node group (cfg.nnodes > 1): NCCL across the nodes on
// CUDA, the TCP node exchange (runtime/tcp_node_exchange.h) on the CPU. `options` is filled as
// for one node; `num_blocks` computes the KV block count from node 0's rank 0 (the others
// receive it). Node 0 gets a runner that broadcasts each step's plan before running it; other
// nodes get a runner whose follow() serves node 0's plans.
std::unique_ptr<StepRunner> load_multi_node_runner(
    const EngineConfig& cfg, const io::ModelConfig& mc, const model::WeightSource& weights,
    ParallelLoadOptions options,
    const std::function<int(backend::Backend&, const model::Model&)>& num_blocks);

// `serval serve` on a node other than 0: loads its ranks, then runs node 0's steps until node 0
// shuts the session down (returns 0) or is lost (logs why, returns 1).
int run_follower_node(const EngineConfig& cfg);

}  // namespace serval::runtime
