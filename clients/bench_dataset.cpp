#include "clients/bench_dataset.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "base/error.h"

namespace serval::clients {

std::vector<BenchRequest> random_requests(const RandomDatasetOptions& o, int vocab_size,
                                          const std::vector<int>& pool) {
  if (pool.empty() && vocab_size <= 0)
    throw InvalidArgument("random dataset: no vocabulary size and no token pool");
  if (o.range_ratio < 0 || o.range_ratio >= 1)
    throw InvalidArgument("--random-range-ratio must be in [0, 1)");
  std::mt19937_64 rng(o.seed);
  auto token = [&]() -> int {
    if (pool.empty()) return std::uniform_int_distribution<int>(0, vocab_size - 1)(rng);
    return pool[std::uniform_int_distribution<size_t>(0, pool.size() - 1)(rng)];
  };
  auto length = [&](int mean) {
    int lo = static_cast<int>(std::floor(mean * (1 - o.range_ratio)));
    int hi = static_cast<int>(std::ceil(mean * (1 + o.range_ratio)));
    return std::uniform_int_distribution<int>(lo, std::max(lo, hi))(rng);
  };
  std::vector<int> prefix(std::max(0, o.prefix_len));
  for (int& t : prefix) t = token();
  std::vector<BenchRequest> out(std::max(0, o.num_prompts));
  for (BenchRequest& r : out) {
    int n = std::max(prefix.empty() ? 1 : 0, length(o.input_len));
    r.prompt = prefix;
    for (int i = 0; i < n; ++i) r.prompt.push_back(token());
    r.output_len = std::max(1, length(o.output_len));
  }
  return out;
}

}  // namespace serval::clients
