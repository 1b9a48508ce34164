#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_set>

namespace serval::runtime {

namespace {

// log-softmax of the raw logits, for the logprobs the API reports.
LogprobEntry make_logprobs(std::span<const float> logits, int32_t sampled, int top) {
  float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l) - max_logit);
  const float log_z = max_logit + float(std::log(sum));
  LogprobEntry e;
  e.sampled = {sampled, logits[sampled] - log_z};
  if (top > 0) {
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    top = std::min<int>(top, int(idx.size()));
    std::partial_sort(idx.begin(), idx.begin() + top, idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    for (int i = 0; i < top; ++i) e.top.push_back({idx[i], logits[idx[i]] - log_z});
  }
  return e;
}

void apply_penalties(std::span<float> logits, const SamplingParams& p, const SamplerState& s,
                     std::span<const int32_t> prompt) {
  if (p.repetition_penalty != 1.0f) {
    std::unordered_set<int32_t> seen(prompt.begin(), prompt.end());
    for (const auto& [tok, count] : s.output_counts) seen.insert(tok);
    for (int32_t tok : seen) {
      float& l = logits[tok];
      l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    }
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    for (const auto& [tok, count] : s.output_counts)
      logits[tok] -= p.frequency_penalty * float(count) + p.presence_penalty;
  }
}

}  // namespace

SampleResult sample(std::span<float> logits, const SamplingParams& params, SamplerState& state,
                    std::span<const int32_t> prompt, std::span<const int32_t> banned) {
  std::optional<std::vector<float>> raw;
  if (params.logprobs >= 0) raw.emplace(logits.begin(), logits.end());
  apply_penalties(logits, params, state, prompt);
  for (int32_t id : banned)
    if (id >= 0 && id < int32_t(logits.size())) logits[id] = -INFINITY;

  int32_t token;
  if (params.temperature < 1e-5f) {
    token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    // Candidates sorted by logit (ties: lower id first), then truncated by top-k, min-p, top-p.
    std::vector<int32_t> idx(logits.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    size_t keep = idx.size();
    if (params.top_k > 0) keep = std::min<size_t>(keep, size_t(params.top_k));
    std::vector<double> probs(keep);
    const double max_l = logits[idx[0]] / params.temperature;
    double sum = 0;
    for (size_t i = 0; i < keep; ++i)
      sum += probs[i] = std::exp(logits[idx[i]] / params.temperature - max_l);
    for (double& p : probs) p /= sum;
    if (params.min_p > 0) {
      const double floor = params.min_p * probs[0];
      while (keep > 1 && probs[keep - 1] < floor) --keep;
    }
    if (params.top_p < 1.0f) {
      double cum = 0;
      size_t n = 0;
      while (n < keep) {
        cum += probs[n++];
        if (cum >= params.top_p) break;
      }
      keep = n;
    }
    std::discrete_distribution<size_t> dist(probs.begin(), probs.begin() + keep);
    token = idx[dist(state.rng)];
  }
  ++state.output_counts[token];
  SampleResult r{token, std::nullopt};
  if (raw) r.logprobs = make_logprobs(*raw, token, params.logprobs);
  return r;
}

}  // namespace serval::runtime
