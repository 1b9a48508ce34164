#include "dist/launch.h"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>

#include "base/error.h"

namespace serval::dist {
namespace {

std::optional<long> parse_int(std::string_view s) {
  long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

}  // namespace

int resolve_node_rank(std::optional<int> flag, int nnodes, const EnvLookup& env) {
  if (nnodes < 1) throw InvalidArgument(fmt::format("--nnodes {} must be >= 1", nnodes));
  auto in_range = [&](long rank, const std::string& source) {
    if (rank < 0 || rank >= nnodes)
      throw InvalidArgument(fmt::format("node rank {} from {} is outside 0..{} (--nnodes {})", rank,
                                        source, nnodes - 1, nnodes));
    return static_cast<int>(rank);
  };
  if (flag) return in_range(*flag, "--node-rank");
  for (const char* var : {"SLURM_PROCID", "OMPI_COMM_WORLD_RANK"}) {
    const char* value = env ? env(var) : std::getenv(var);
    if (value == nullptr) continue;
    auto rank = parse_int(value);
    if (!rank)
      throw InvalidArgument(fmt::format("{}='{}' is not an integer node rank", var, value));
    return in_range(*rank, var);
  }
  return in_range(0, "the default (no --node-rank, SLURM_PROCID or OMPI_COMM_WORLD_RANK)");
}

HostPort parse_host_port(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument(fmt::format(
        "--dist-init-addr '{}': {} (expected HOST:PORT, e.g. 10.0.0.1:29500)", text, why));
  };
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) throw bad("no ':PORT'");
  std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  if (host.empty()) throw bad("empty HOST");
  if (host.find(':') != std::string_view::npos || host.front() == '[')
    throw bad("IPv6 addresses are not supported");
  auto p = parse_int(port);
  if (!p || *p < 1 || *p > 65535) throw bad("PORT must be an integer in 1..65535");
  return {std::string(host), static_cast<int>(*p)};
}

uint64_t hash_bytes(std::string_view bytes, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace serval::dist
