// Multi-node launch flags: which node this process is, where node 0 listens, and the hash that
// every node must agree on.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace serval::dist {

// Reads an environment variable; nullptr when unset. Tests pass their own.
using EnvLookup = std::function<const char*(const char*)>;

// The node rank: --node-rank when given, else SLURM_PROCID, else OMPI_COMM_WORLD_RANK, else 0.
// Throws InvalidArgument naming the source when the value is not an integer in [0, nnodes).
int resolve_node_rank(std::optional<int> flag, int nnodes, const EnvLookup& env = nullptr);

struct HostPort {
  std::string host;
  int port = 0;
};
// "HOST:PORT" (--dist-init-addr); HOST non-empty, PORT in 1..65535. "[v6]:PORT" is refused
// because the control channel is IPv4. Throws InvalidArgument quoting the text.
HostPort parse_host_port(std::string_view text);

// 64-bit FNV-1a, chainable through `seed`: the caller hashes config.json, the quantization
// config and the parallel flags (tp, dp, ep, dtype, max-model-len, ...) into
// RendezvousOptions::config_hash so that nodes with different models or flags are refused.
inline constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
uint64_t hash_bytes(std::string_view bytes, uint64_t seed = kFnvOffset);

}  // namespace serval::dist
