// The host sampler: each truncation rule on hand-made logits, penalties, seeding, logprobs.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

namespace serval::runtime {
namespace {

// Samples `n` times from fresh copies of `logits`; returns how often each id came out.
std::map<int32_t, int> histogram(const std::vector<float>& logits, SamplingParams p, int n,
                                 uint64_t seed = 7) {
  SamplerState state;
  state.rng.seed(seed);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    ++counts[sample(l, p, state, {}, {}).token];
    state.output_counts.clear();  // no penalties in play
  }
  return counts;
}

// ln of probabilities 0.5, 0.25, 0.15, 0.1 (ids 0..3).
const std::vector<float> kLogits = {std::log(0.5f), std::log(0.25f), std::log(0.15f),
                                    std::log(0.1f)};

// bad_words: a word's last token is banned where the output ends with its other tokens; a
// one-token word always.
TEST(Sampler, BadWordBansFollowTheOutputsTail) {
  const std::vector<std::vector<int32_t>> words = {{5}, {1, 2, 3}, {2, 4}, {9, 9}};
  const auto bans = [&](std::vector<int32_t> output) {
    std::vector<int32_t> banned = {77};  // what was banned before stays
    add_bad_word_bans(words, output, banned);
    return banned;
  };
  EXPECT_EQ(bans({}), (std::vector<int32_t>{77, 5}));
  EXPECT_EQ(bans({1}), (std::vector<int32_t>{77, 5}));
  EXPECT_EQ(bans({0, 1, 2}), (std::vector<int32_t>{77, 5, 3, 4}));
  EXPECT_EQ(bans({1, 2, 0}), (std::vector<int32_t>{77, 5}));
  EXPECT_EQ(bans({9}), (std::vector<int32_t>{77, 5, 9}));
}

TEST(Sampler, GreedyTakesTheLowestIndexOfTheMaximum) {
  SamplingParams p;
  p.temperature = 0;
  SamplerState s;
  std::vector<float> l = {1, 3, 3, 2};
  EXPECT_EQ(sample(l, p, s, {}, {}).token, 1);
}

TEST(Sampler, TemperatureOneFollowsTheDistribution) {
  SamplingParams p;
  auto h = histogram(kLogits, p, 20000);
  EXPECT_NEAR(h[0] / 20000.0, 0.5, 0.02);
  EXPECT_NEAR(h[1] / 20000.0, 0.25, 0.02);
  EXPECT_NEAR(h[2] / 20000.0, 0.15, 0.02);
  EXPECT_NEAR(h[3] / 20000.0, 0.10, 0.02);
}

// A temperature past float's range (a request's 1e308 becomes inf) is uniform over the tokens
// that are not banned: -inf / inf was NaN, and NaN weights are undefined behaviour in
// std::discrete_distribution (a banned token, e.g. EOS under min_tokens, could come out).
TEST(Sampler, InfiniteTemperatureIsUniformOverAllowedTokens) {
  for (const bool truncated : {false, true}) {
    SamplingParams p;
    p.temperature = std::numeric_limits<float>::infinity();
    if (truncated) p.top_k = 2;  // ids 1 and 2 (the banned 0 sorts last)
    SamplerState state;
    state.rng.seed(3);
    std::map<int32_t, int> counts;
    const int32_t banned[] = {0};
    for (int i = 0; i < 6000; ++i) {
      std::vector<float> l = kLogits;
      ++counts[sample(l, p, state, {}, banned).token];
      state.output_counts.clear();
    }
    EXPECT_EQ(counts.count(0), 0u) << "banned token sampled (truncated " << truncated << ")";
    for (int32_t id = 1; id < (truncated ? 3 : 4); ++id)
      EXPECT_NEAR(counts[id] / 6000.0, truncated ? 0.5 : 1.0 / 3, 0.03) << id;
  }
}

TEST(Sampler, TopKTopPAndMinPTruncate) {
  SamplingParams k;
  k.top_k = 2;
  auto hk = histogram(kLogits, k, 5000);
  EXPECT_EQ(hk.count(2) + hk.count(3), 0u);
  EXPECT_NEAR(hk[0] / 5000.0, 2.0 / 3, 0.03);  // renormalized over the two kept

  SamplingParams tp;
  tp.top_p = 0.7f;  // 0.5 + 0.25 reaches 0.7: ids 0 and 1
  auto hp = histogram(kLogits, tp, 5000);
  EXPECT_EQ(hp.count(2) + hp.count(3), 0u);
  EXPECT_GT(hp[1], 0);

  SamplingParams mp;
  mp.min_p = 0.25f;  // keeps p ≥ 0.125: ids 0, 1, 2
  auto hm = histogram(kLogits, mp, 5000);
  EXPECT_EQ(hm.count(3), 0u);
  EXPECT_GT(hm[2], 0);
}

// The plain definition of the truncated draw: sort the whole vocabulary (logit descending, ties
// to the lower id), normalize over the top-k set, trim by min-p then top-p, draw in that order.
int32_t reference_truncated(const std::vector<float>& logits, const SamplingParams& params,
                            std::mt19937_64& rng) {
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
  return idx[dist(rng)];
}

// On a 50k vocabulary, where the sampler sorts only the prefix the cut-offs need (growing it from
// 256), every truncated draw equals the full-sort definition for the same seed: flat and peaked
// logits, top-k, min-p, top-p and their combinations, cut-offs inside and beyond the first prefix.
TEST(Sampler, PrefixSortEqualsFullSortOnALargeVocabulary) {
  std::mt19937 gen(9);
  struct Params {
    int top_k;
    float min_p, top_p, temperature;
  };
  const Params cases[] = {{0, 0.0f, 0.9f, 1.0f},    {0, 0.0f, 0.999f, 1.0f}, {0, 0.05f, 1.0f, 0.7f},
                          {0, 0.001f, 1.0f, 1.3f},  {0, 0.01f, 0.95f, 0.8f}, {50, 0.0f, 1.0f, 1.0f},
                          {2000, 0.0f, 0.9f, 1.0f}, {40, 0.1f, 0.8f, 0.6f},  {1, 0.0f, 1.0f, 1.0f}};
  int draws = 0;
  for (float spread : {0.3f, 3.0f, 12.0f}) {  // nearly flat to peaked distributions
    std::vector<float> logits(50000);
    std::normal_distribution<float> normal(0.0f, spread);
    for (float& l : logits) l = normal(gen);
    for (int i = 0; i < 50; ++i) logits[size_t(gen() % logits.size())] = logits[0];  // ties
    for (const Params& c : cases) {
      SamplingParams p;
      p.top_k = c.top_k;
      p.min_p = c.min_p;
      p.top_p = c.top_p;
      p.temperature = c.temperature;
      for (uint64_t seed = 1; seed <= 8; ++seed, ++draws) {
        SamplerState state;
        state.rng.seed(seed);
        std::vector<float> copy = logits;
        const int32_t got = sample(copy, p, state, {}, {}).token;
        std::mt19937_64 rng(seed);
        EXPECT_EQ(got, reference_truncated(logits, p, rng))
            << "spread " << spread << " top_k " << c.top_k << " min_p " << c.min_p << " top_p "
            << c.top_p << " seed " << seed;
      }
    }
  }
  EXPECT_EQ(draws, 3 * 9 * 8);
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;
  auto a = histogram(kLogits, p, 300, 42), b = histogram(kLogits, p, 300, 42);
  EXPECT_EQ(a, b);
  auto c = histogram(kLogits, p, 300, 43);
  EXPECT_NE(a, c);
}

TEST(Sampler, PenaltiesAndBannedIds) {
  SamplingParams p;
  p.temperature = 0;
  SamplerState s;
  s.output_counts[0] = 3;
  p.frequency_penalty = 0.5f;  // logit 0: ln 0.5 − 1.5 < ln 0.25
  std::vector<float> l = kLogits;
  EXPECT_EQ(sample(l, p, s, {}, {}).token, 1);

  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 3.0f;  // prompt id 0 (negative logit) is multiplied: 3 · ln 0.5 < ln 0.25
  SamplerState s2;
  std::vector<int32_t> prompt = {0};
  std::vector<float> l2 = kLogits;
  EXPECT_EQ(sample(l2, r, s2, prompt, {}).token, 1);

  SamplingParams g;
  g.temperature = 0;
  SamplerState s3;
  std::vector<int32_t> banned = {0};
  std::vector<float> l3 = kLogits;
  EXPECT_EQ(sample(l3, g, s3, {}, banned).token, 1);
}

TEST(Sampler, LogitBiasShiftsTheDistribution) {
  SamplingParams p;
  p.temperature = 0;
  SamplerState s;
  std::vector<float> l = kLogits;
  p.logit_bias = {{3, 1.0f}};  // ln 0.1 + 1 < ln 0.5: still id 0
  EXPECT_EQ(sample(l, p, s, {}, {}).token, 0);
  l = kLogits;
  p.logit_bias = {{3, 2.0f}, {0, -100.0f}};  // ln 0.1 + 2 > ln 0.25
  EXPECT_EQ(sample(l, p, s, {}, {}).token, 3);
  // Sampled: +ln 2 on id 3 doubles its weight: 0.2 / 1.1 of the mass.
  SamplingParams q;
  q.logit_bias = {{3, std::log(2.0f)}};
  auto h = histogram(kLogits, q, 20000);
  EXPECT_NEAR(h[3] / 20000.0, 0.2 / 1.1, 0.02);
}

TEST(Sampler, AllowedTokenIdsRestrictTheDraw) {
  SamplingParams p;
  p.allowed_token_ids = {1, 3};
  auto h = histogram(kLogits, p, 20000);
  EXPECT_EQ(h[0] + h[2], 0);
  EXPECT_NEAR(h[1] / 20000.0, 0.25 / 0.35, 0.02);
  p.temperature = 0;
  SamplerState s;
  std::vector<float> l = kLogits;
  EXPECT_EQ(sample(l, p, s, {}, {}).token, 1);
  // Banned (EOS before min_tokens): the other allowed token; all allowed banned: the ban yields.
  l = kLogits;
  const std::vector<int32_t> banned = {1};
  EXPECT_EQ(sample(l, p, s, {}, banned).token, 3);
  l = kLogits;
  p.allowed_token_ids = {1};
  EXPECT_EQ(sample(l, p, s, {}, banned).token, 1);
}

TEST(Sampler, LogprobsAreOfTheRawDistribution) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  p.presence_penalty = 10;  // must not change the reported logprobs
  SamplerState s;
  s.output_counts[0] = 1;
  std::vector<float> l = kLogits;
  SampleResult r = sample(l, p, s, {}, {});
  ASSERT_TRUE(r.logprobs);
  EXPECT_EQ(r.token, 1);
  EXPECT_NEAR(r.logprobs->sampled.logprob, std::log(0.25f), 1e-5);
  ASSERT_EQ(r.logprobs->top.size(), 2u);
  EXPECT_EQ(r.logprobs->top[0].token_id, 0);
  EXPECT_NEAR(r.logprobs->top[0].logprob, std::log(0.5f), 1e-5);
}

}  // namespace
}  // namespace serval::runtime
