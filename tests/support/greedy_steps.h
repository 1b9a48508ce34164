// Step-level runs the runtime tests share, straight on a StepRunner (no engine): a prefill of
// every prompt with all logits rows, then greedy decode steps; and greedy decoding with the
// tokens fed back on the device (token feedback).
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
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

// Greedy decoding of prompts[s] (KV blocks tables[s]) for `steps` steps whose sequence order is
// reversed every other step: sequence 0 stops after step 2 and the last sequence joins at step 2
// (its prefill then shares a step with decodes). With `feedback`, each step is launched
// (launch_greedy) before the one before it is collected, its decode inputs the previous step's
// ids as pending tokens −(row + 1); otherwise each step runs through execute_greedy, the
// reference. Returns each sequence's prompt and generated tokens.
inline std::vector<std::vector<int32_t>> reordered_greedy_decode(
    runtime::StepRunner& runner, std::vector<std::vector<int32_t>> prompts,
    const std::vector<std::vector<int32_t>>& tables, int steps, bool feedback) {
  using runtime::SeqChunk;
  std::vector<std::vector<int32_t>> tokens = std::move(prompts);
  const size_t seqs = tokens.size(), last = seqs - 1;
  std::vector<std::deque<size_t>> pending(seqs);  // positions of each sequence's placeholders
  std::vector<size_t> queued;                     // the queued step's sequence of each row
  auto resolve = [&](const std::vector<int32_t>& ids, const std::vector<size_t>& order) {
    for (size_t row = 0; row < order.size(); ++row) {
      const size_t s = order[row];
      tokens[s][pending[s].front()] = ids.at(row);
      pending[s].pop_front();
    }
  };
  for (int step = 0; step < steps; ++step) {
    std::vector<size_t> order;
    for (size_t s = 0; s < seqs; ++s)
      if ((s != 0 || step <= 2) && (s != last || step >= 2)) order.push_back(s);
    if (step % 2 == 1) std::reverse(order.begin(), order.end());
    std::vector<SeqChunk> chunks;
    for (size_t s : order) {
      const bool prefill = step == 0 || (s == last && step == 2);
      const int start = prefill ? 0 : int(tokens[s].size()) - 1;
      chunks.push_back({tokens[s], start, int(tokens[s].size()) - start, tables[s]});
    }
    if (!feedback) {
      const std::vector<int32_t> ids = runner.execute_greedy(chunks);
      for (size_t row = 0; row < order.size(); ++row) tokens[order[row]].push_back(ids.at(row));
      continue;
    }
    runner.launch_greedy(chunks);
    for (size_t row = 0; row < order.size(); ++row) {
      const size_t s = order[row];
      pending[s].push_back(tokens[s].size());
      tokens[s].push_back(-int32_t(row) - 1);
    }
    if (!queued.empty()) resolve(runner.collect_greedy(), queued);
    queued = order;
  }
  if (!queued.empty()) resolve(runner.collect_greedy(), queued);
  return tokens;
}

}  // namespace serval::testing
