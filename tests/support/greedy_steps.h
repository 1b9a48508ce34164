// Step-level runs the runtime tests share: a prefill of every prompt with all logits rows, then
// greedy decode steps, straight on a StepRunner (no engine).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/model_runner.h"

namespace serval::testing {

struct GreedySteps {
  std::vector<float> prompt_logits;          // [prompt tokens of all sequences, vocab]
  std::vector<std::vector<int32_t>> tokens;  // per sequence: prompt + `steps` greedy tokens
};

// Sequence s (prompts[s], KV blocks tables[s]) is prefilled in one step with every logits row;
// its first token comes from its last prompt row, the other steps − 1 from greedy decode steps.
inline GreedySteps prefill_and_decode(runtime::StepRunner& runner, int vocab,
                                      std::vector<std::vector<int32_t>> prompts,
                                      const std::vector<std::vector<int32_t>>& tables, int steps) {
  using runtime::SeqChunk;
  GreedySteps r;
  r.tokens = std::move(prompts);
  const size_t seqs = r.tokens.size();
  std::vector<SeqChunk> chunks;
  for (size_t s = 0; s < seqs; ++s)
    chunks.push_back({r.tokens[s], 0, int(r.tokens[s].size()), tables[s], SeqChunk::Logits::kAll});
  r.prompt_logits = runner.execute(chunks);
  size_t row = 0;
  for (size_t s = 0; s < seqs; ++s) {
    row += r.tokens[s].size();
    const float* last = &r.prompt_logits[(row - 1) * size_t(vocab)];
    r.tokens[s].push_back(int32_t(std::max_element(last, last + vocab) - last));
  }
  for (int step = 1; step < steps; ++step) {
    chunks.clear();
    for (size_t s = 0; s < seqs; ++s)
      chunks.push_back({r.tokens[s], int(r.tokens[s].size()) - 1, 1, tables[s]});
    const std::vector<int32_t> next = runner.execute_greedy(chunks);
    for (size_t s = 0; s < seqs; ++s) r.tokens[s].push_back(next[s]);
  }
  return r;
}

}  // namespace serval::testing
