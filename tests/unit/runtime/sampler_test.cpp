// The host sampler: each truncation rule on hand-made logits, penalties, seeding, logprobs.
#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

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
