// The "random" dataset of `serval bench serve`: token-id prompts of sampled lengths.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace serval::clients {

struct BenchRequest {
  std::vector<int> prompt;  // token ids, shared prefix first
  int output_len = 0;       // max_tokens
  std::string text;         // chat runs: the user message (the prompt's text)
};

struct RandomDatasetOptions {
  int num_prompts = 1000;
  int input_len = 1024;  // excluding the prefix
  int output_len = 128;
  double range_ratio = 0;  // lengths uniform in [floor(L(1-r)), ceil(L(1+r))], as vLLM
  int prefix_len = 0;      // tokens shared by every prompt
  uint64_t seed = 0;
};

// Token ids are drawn uniformly from [0, vocab_size) when `pool` is empty, else from `pool`.
// Deterministic in `seed`. Every prompt has at least one token, every output_len is >= 1.
std::vector<BenchRequest> random_requests(const RandomDatasetOptions& o, int vocab_size,
                                          const std::vector<int>& pool);

}  // namespace serval::clients
