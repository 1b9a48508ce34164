// Token sampling on the host from one row of logits: penalties, temperature, top-k, top-p,
// min-p, seeded randomness, and logprobs of the raw distribution.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/engine.h"

namespace serval::runtime {

// Per-sequence state the sampler needs between steps.
struct SamplerState {
  std::mt19937_64 rng;
  std::unordered_map<int32_t, int> output_counts;  // generated token → occurrences
};

struct SampleResult {
  int32_t token;
  std::optional<LogprobEntry> logprobs;
};

// `logits` [vocab] is modified in place. `prompt` and the counts in `state` drive the penalties.
// After the penalties, params.logit_bias is added; `banned` ids (EOS and stop ids while fewer
// than min_tokens were generated) and, with params.allowed_token_ids, every other id get -inf
// (the ban yields when it would leave no allowed token).
// `guided` (guided decoding; empty: none) marks the ids that may follow, 1 for allowed: the others
// get -inf after everything above (the logprobs stay those of the raw logits).
SampleResult sample(std::span<float> logits, const SamplingParams& params, SamplerState& state,
                    std::span<const int32_t> prompt, std::span<const int32_t> banned,
                    std::span<const uint8_t> guided = {});

// Appends to `banned` the last token of every bad word (SamplingParams::bad_words) whose other
// tokens end `output` (the tokens generated so far).
void add_bad_word_bans(const std::vector<std::vector<int32_t>>& bad_words,
                       std::span<const int32_t> output, std::vector<int32_t>& banned);

// The log-softmax of raw `logits` [vocab] at `token`, its 1-based rank (ties count for it) and the
// `top` most likely ids: a prompt token's entry for prompt_logprobs.
LogprobEntry prompt_token_logprobs(std::span<const float> logits, int32_t token, int top);

}  // namespace serval::runtime
