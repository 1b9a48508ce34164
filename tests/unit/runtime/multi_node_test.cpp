// Multi-node placement (which global ranks a node holds) and the config hash the nodes compare.
// The processes themselves are exercised end to end by tests/e2e/multi_node_test.sh.
#include <gtest/gtest.h>

#include "base/error.h"
#include "runtime/multi_node.h"

namespace serval::runtime {
namespace {

EngineConfig config(int nnodes, int node_rank) {
  EngineConfig c;
  c.nnodes = nnodes;
  c.node_rank = node_rank;
  c.dist_init_addr = "127.0.0.1:29500";
  c.tensor_parallel_size = 8;
  return c;
}

TEST(MultiNode, SplitsRanksEvenlyOverNodes) {
  for (int node = 0; node < 4; ++node) {
    const NodePlacement p = node_placement(config(4, node), 8);
    EXPECT_EQ(p.world, 8);
    EXPECT_EQ(p.local_ranks, 2);
    EXPECT_EQ(p.first_rank, 2 * node);
  }
  const NodePlacement one = node_placement(config(1, 0), 8);
  EXPECT_EQ(one.local_ranks, 8);
  EXPECT_EQ(one.first_rank, 0);
}

TEST(MultiNode, RejectsLayoutsThatDoNotSplit) {
  EXPECT_THROW(node_placement(config(3, 0), 8), InvalidArgument);  // 8 ranks over 3 nodes
  EXPECT_THROW(node_placement(config(2, 2), 8), InvalidArgument);  // rank outside 0..1
  EngineConfig no_addr = config(2, 0);
  no_addr.dist_init_addr.clear();
  EXPECT_THROW(node_placement(no_addr, 8), InvalidArgument);
  EngineConfig dp = config(2, 0);
  dp.data_parallel_size = 2;
  EXPECT_THROW(node_placement(dp, 8), InvalidArgument);
}

TEST(MultiNode, ConfigHashCoversModelAndFlags) {
  const EngineConfig base = config(2, 0);
  const uint64_t h = multi_node_config_hash(base, "{\"hidden_size\": 64}");
  EXPECT_EQ(h, multi_node_config_hash(config(2, 1), "{\"hidden_size\": 64}"))
      << "the node rank is not part of the hash";
  EXPECT_NE(h, multi_node_config_hash(base, "{\"hidden_size\": 128}"));
  EngineConfig len = base;
  len.max_model_len = 128;
  EXPECT_NE(h, multi_node_config_hash(len, "{\"hidden_size\": 64}"));
  EngineConfig kv = base;
  kv.kv_cache_dtype = "fp8";
  EXPECT_NE(h, multi_node_config_hash(kv, "{\"hidden_size\": 64}"));
  EngineConfig ep = base;
  ep.enable_expert_parallel = true;
  EXPECT_NE(h, multi_node_config_hash(ep, "{\"hidden_size\": 64}"));
}

}  // namespace
}  // namespace serval::runtime
