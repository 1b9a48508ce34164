// How long the fuzz tests run: a fixed, quick budget by default (CI), more on request for a
// local hunt: SERVAL_FUZZ_ITERATIONS replaces the iteration count, SERVAL_FUZZ_SEED offsets the
// fixed seeds.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>

namespace serval::testing {

inline int fuzz_iterations(int fallback) {
  const char* env = std::getenv("SERVAL_FUZZ_ITERATIONS");
  return env ? std::max(1, std::atoi(env)) : fallback;
}

inline uint32_t fuzz_seed(uint32_t base) {
  const char* env = std::getenv("SERVAL_FUZZ_SEED");
  return base + (env ? uint32_t(std::strtoul(env, nullptr, 10)) : 0u);
}

}  // namespace serval::testing
