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

// Candidates in order of logit (ties: lower id first), truncated by top-k, then min-p and top-p
// on probabilities normalized over the top-k set (all tokens without top-k), then one draw.
// Only the sorted prefix the cut-offs need is sorted: a prefix of 256 candidates, grown 8× while
// min-p or top-p have not been decided within it (a full-vocabulary sort cost ~10 ms a row);
// without any truncation the draw runs over the vocabulary in id order.
int32_t sample_truncated(std::span<const float> logits, const SamplingParams& params,
                         std::mt19937_64& rng) {
  // A request's temperature of 1e308 arrives as inf: -inf / inf (a banned token) would be NaN,
  // and NaN weights are undefined in std::discrete_distribution. Past 1e30 every finite logit
  // scales to ~0 (uniform) while banned ones stay at weight 0.
  const float temp = std::min(params.temperature, 1e30f);
  const size_t vocab = logits.size();
  const size_t limit = params.top_k > 0 ? std::min(vocab, size_t(params.top_k)) : vocab;
  auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  const double max_l = *std::max_element(logits.begin(), logits.end()) / temp;
  auto weight = [&](int32_t id) { return std::exp(logits[id] / temp - max_l); };
  if (params.top_k <= 0 && params.min_p <= 0 && params.top_p >= 1.0f) {
    // Nothing truncated: one draw over the whole vocabulary, in id order (no sort at all).
    std::vector<double> w(vocab);
    for (size_t i = 0; i < vocab; ++i) w[i] = weight(int32_t(i));
    std::discrete_distribution<size_t> dist(w.begin(), w.end());
    return int32_t(dist(rng));
  }
  std::vector<int32_t> idx(vocab);
  std::iota(idx.begin(), idx.end(), 0);
  // top-k: the whole set is sorted (normalization runs over it in order); else a prefix.
  size_t sorted = params.top_k > 0 ? limit : std::min(limit, size_t(256));
  std::partial_sort(idx.begin(), idx.begin() + sorted, idx.end(), before);
  double sum = 0;
  if (params.top_k > 0) {
    for (size_t i = 0; i < limit; ++i) sum += weight(idx[i]);
  } else {
    for (size_t i = 0; i < vocab; ++i) sum += weight(int32_t(i));
  }
  std::vector<double> probs;  // probs[i] of sorted candidate i, normalized by `sum`
  size_t keep = limit;
  const double floor = params.min_p > 0 ? params.min_p * (weight(idx[0]) / sum) : 0.0;
  for (;;) {
    for (size_t i = probs.size(); i < sorted; ++i) probs.push_back(weight(idx[i]) / sum);
    // min-p: the first candidate below the floor ends the set (at least one stays).
    size_t cut = limit;
    bool decided = true;
    if (params.min_p > 0) {
      size_t i = 1;
      while (i < sorted && probs[i] >= floor) ++i;
      if (i < sorted) {
        cut = i;
      } else if (sorted < limit) {
        decided = false;
      }
    }
    // top-p: the shortest prefix (of the min-p set) whose probability reaches top_p.
    if (decided && params.top_p < 1.0f) {
      double cum = 0;
      size_t n = 0;
      const size_t bound = std::min(cut, sorted);
      while (n < bound) {
        cum += probs[n++];
        if (cum >= params.top_p) break;
      }
      if (cum >= params.top_p || n == cut) {
        cut = n;
      } else {
        decided = false;
      }
    }
    if (decided && cut <= sorted) {
      keep = cut;
      break;
    }
    sorted = std::min(limit, sorted * 8);
    std::partial_sort(idx.begin(), idx.begin() + sorted, idx.end(), before);
  }
  std::discrete_distribution<size_t> dist(probs.begin(), probs.begin() + keep);
  return idx[dist(rng)];
}

// Bans `banned` and, with a non-empty `allowed` list, every token outside it. When every allowed
// token is banned (an allowed EOS before min_tokens), the ban gives way: the request asked for
// one of those tokens.
void restrict_to_allowed(std::span<float> logits, std::span<const int32_t> allowed,
                         std::span<const int32_t> banned) {
  const int32_t vocab = int32_t(logits.size());
  auto in_vocab = [vocab](int32_t id) { return id >= 0 && id < vocab; };
  if (!allowed.empty()) {
    std::vector<bool> keep(size_t(vocab), false);
    for (int32_t id : allowed)
      if (in_vocab(id)) keep[size_t(id)] = true;
    for (int32_t id = 0; id < vocab; ++id)
      if (!keep[size_t(id)]) logits[id] = -INFINITY;
    const bool all_banned = std::all_of(allowed.begin(), allowed.end(), [&](int32_t id) {
      return std::find(banned.begin(), banned.end(), id) != banned.end();
    });
    if (all_banned) return;
  }
  for (int32_t id : banned)
    if (in_vocab(id)) logits[id] = -INFINITY;
}

}  // namespace

void add_bad_word_bans(const std::vector<std::vector<int32_t>>& bad_words,
                       std::span<const int32_t> output, std::vector<int32_t>& banned) {
  for (const std::vector<int32_t>& word : bad_words) {
    if (word.empty()) continue;
    const size_t before = word.size() - 1;  // tokens that must end the output
    if (before > output.size()) continue;
    if (std::equal(word.begin(), word.end() - 1, output.end() - before))
      banned.push_back(word.back());
  }
}

LogprobEntry prompt_token_logprobs(std::span<const float> logits, int32_t token, int top) {
  LogprobEntry e = make_logprobs(logits, token, top);
  const float l = logits[size_t(token)];
  e.rank = 1 + int(std::count_if(logits.begin(), logits.end(), [l](float v) { return v > l; }));
  return e;
}

SampleResult sample(std::span<float> logits, const SamplingParams& params, SamplerState& state,
                    std::span<const int32_t> prompt, std::span<const int32_t> banned,
                    std::span<const uint8_t> guided) {
  std::optional<std::vector<float>> raw;
  if (params.logprobs >= 0) raw.emplace(logits.begin(), logits.end());
  apply_penalties(logits, params, state, prompt);
  for (const auto& [id, bias] : params.logit_bias)
    if (id >= 0 && id < int32_t(logits.size())) logits[id] += bias;
  restrict_to_allowed(logits, params.allowed_token_ids, banned);
  if (!guided.empty())
    for (size_t id = 0; id < logits.size(); ++id)
      if (id >= guided.size() || !guided[id]) logits[id] = -INFINITY;

  int32_t token;
  if (params.temperature < 1e-5f) {
    token = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  } else {
    token = sample_truncated(logits, params, state.rng);
  }
  ++state.output_counts[token];
  SampleResult r{token, std::nullopt};
  if (raw) r.logprobs = make_logprobs(*raw, token, params.logprobs);
  return r;
}

}  // namespace serval::runtime
