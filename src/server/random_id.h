// Identifiers of responses, messages and tool calls: a prefix and 128 random bits in hex.
#pragma once
#include <fmt/format.h>

#include <random>
#include <string>

namespace serval::server {

inline std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:016x}", prefix, rng(), rng());
}

}  // namespace serval::server
