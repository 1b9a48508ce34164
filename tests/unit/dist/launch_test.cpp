#include "dist/launch.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "base/error.h"

namespace serval::dist {
namespace {

EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(Launch, NodeRankPrecedence) {
  auto both = fake_env({{"SLURM_PROCID", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}});
  EXPECT_EQ(resolve_node_rank(3, 4, both), 3);
  EXPECT_EQ(resolve_node_rank(std::nullopt, 4, both), 2);
  EXPECT_EQ(resolve_node_rank(std::nullopt, 4, fake_env({{"OMPI_COMM_WORLD_RANK", "1"}})), 1);
  EXPECT_EQ(resolve_node_rank(std::nullopt, 4, fake_env({})), 0);
}

TEST(Launch, NodeRankErrorsNameTheSource) {
  try {
    resolve_node_rank(std::nullopt, 2, fake_env({{"SLURM_PROCID", "5"}}));
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("SLURM_PROCID"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--nnodes 2"), std::string::npos) << e.what();
  }
  try {
    resolve_node_rank(std::nullopt, 2, fake_env({{"OMPI_COMM_WORLD_RANK", "1x"}}));
    FAIL() << "no throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("OMPI_COMM_WORLD_RANK='1x'"), std::string::npos);
  }
  EXPECT_THROW(resolve_node_rank(-1, 2, fake_env({})), InvalidArgument);
  EXPECT_THROW(resolve_node_rank(0, 0, fake_env({})), InvalidArgument);
}

TEST(Launch, ParseHostPort) {
  HostPort hp = parse_host_port("10.1.2.3:29500");
  EXPECT_EQ(hp.host, "10.1.2.3");
  EXPECT_EQ(hp.port, 29500);
  EXPECT_EQ(parse_host_port("node-a.cluster:1").host, "node-a.cluster");
  for (const char* bad :
       {"10.1.2.3", ":29500", "h:0", "h:65536", "h:12ab", "h:", "[::1]:5", "::1:5"})
    EXPECT_THROW(parse_host_port(bad), InvalidArgument) << bad;
}

TEST(Launch, HashIsFnv1a64) {
  // Published FNV-1a 64-bit test vectors.
  EXPECT_EQ(hash_bytes(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(hash_bytes("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(hash_bytes("foobar"), 0x85944171f73967e8ULL);
  EXPECT_EQ(hash_bytes("bar", hash_bytes("foo")), hash_bytes("foobar"));  // chainable
}

}  // namespace
}  // namespace serval::dist
