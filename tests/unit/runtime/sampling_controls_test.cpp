// logit_bias and allowed_token_ids reach the tokens an engine generates: a greedy request is no
// longer the plain device argmax but the host sampler with them applied; prompt_logprobs score
// every prompt token as a one-token request on its prefix would (the qwen3_moe fixture on the
// CPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "base/error.h"
#include "runtime/engine.h"
#include "support/engine_batch.h"

namespace serval::runtime {
namespace {

// The updates of one request of `params` (EOS ignored), waited for up to 60 s.
std::vector<RequestOutput> run(Engine& engine, std::vector<int32_t> prompt, SamplingParams params) {
  params.ignore_eos = true;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<RequestOutput> outputs;
  bool done = false;
  engine.submit(std::move(prompt), params, [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    outputs.push_back(o);
    if (o.finish) done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  return outputs;
}

// The tokens of one request of `params` on a fixed prompt.
std::vector<int32_t> generate(Engine& engine, const SamplingParams& params) {
  std::vector<int32_t> tokens;
  for (const RequestOutput& o : run(engine, {3, 14, 15, 92, 65}, params))
    tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
  return tokens;
}

SamplingParams six_greedy_tokens() {
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 6;
  return greedy;
}

TEST(SamplingControls, LogitBiasAndAllowedTokenIdsSteerGreedyDecoding) {
  auto engine = Engine::create(serval::testing::qwen3_moe_cpu_config());
  const SamplingParams greedy = six_greedy_tokens();
  const std::vector<int32_t> plain = generate(*engine, greedy);
  ASSERT_EQ(plain.size(), 6u);

  // +100 on a token the plain run never chose makes it every greedy pick.
  int32_t forced = 7;
  while (std::find(plain.begin(), plain.end(), forced) != plain.end()) ++forced;
  SamplingParams biased = greedy;
  biased.logit_bias = {{forced, 100.0f}};
  EXPECT_EQ(generate(*engine, biased), std::vector<int32_t>(6, forced));

  // Only the allowed ids come out, and a first pick outside them moves to one of them.
  SamplingParams allowed = greedy;
  allowed.allowed_token_ids = {forced, forced + 1};
  for (int32_t t : generate(*engine, allowed)) EXPECT_TRUE(t == forced || t == forced + 1) << t;

  // −100 on the plain run's first token: the first token changes.
  SamplingParams banned = greedy;
  banned.logit_bias = {{plain[0], -100.0f}};
  EXPECT_NE(generate(*engine, banned).at(0), plain[0]);
}

// bad_words (tokenized): a one-token word never comes out; a two-token word's second token does
// not follow its first.
TEST(SamplingControls, BadWordsAreNotGenerated) {
  auto engine = Engine::create(serval::testing::qwen3_moe_cpu_config());
  const SamplingParams greedy = six_greedy_tokens();
  const std::vector<int32_t> plain = generate(*engine, greedy);
  ASSERT_EQ(plain.size(), 6u);

  SamplingParams one = greedy;
  one.bad_words = {{plain[0]}};
  const std::vector<int32_t> without = generate(*engine, one);
  EXPECT_EQ(std::count(without.begin(), without.end(), plain[0]), 0);

  SamplingParams two = greedy;
  two.bad_words = {{plain[0], plain[1]}};
  const std::vector<int32_t> split = generate(*engine, two);
  EXPECT_EQ(split.at(0), plain[0]);
  EXPECT_NE(split.at(1), plain[1]);
  for (size_t i = 1; i < split.size(); ++i)
    EXPECT_FALSE(split[i - 1] == plain[0] && split[i] == plain[1]) << "at " << i;
}

// Entry k - 1 of prompt_logprobs (prompt token k given tokens 0 .. k - 1) equals the logprob a
// one-token request on that prefix reports when only token k is allowed (the sampler reports raw
// logprobs): the oracle is the engine's own last-position path. The prompt spans several chunks
// (8-token step budget), and a repeat of it (which the prefix cache would otherwise serve) gets
// the same entries.
TEST(SamplingControls, PromptLogprobsMatchOneTokenRequestsOnEachPrefix) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  cfg.max_num_batched_tokens = 8;
  auto engine = Engine::create(cfg);
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43};
  SamplingParams params;
  params.temperature = 0;
  params.max_tokens = 2;
  params.prompt_logprobs = 3;
  const std::vector<RequestOutput> first = run(*engine, prompt, params);
  ASSERT_FALSE(first.empty());
  const std::vector<LogprobEntry>& entries = first[0].prompt_logprobs;
  ASSERT_EQ(entries.size(), prompt.size() - 1);
  for (size_t i = 1; i < first.size(); ++i) EXPECT_TRUE(first[i].prompt_logprobs.empty());

  for (size_t k = 1; k < prompt.size(); ++k) {
    SCOPED_TRACE(::testing::Message() << "prompt token " << k);
    const LogprobEntry& e = entries[k - 1];
    EXPECT_EQ(e.sampled.token_id, prompt[k]);
    ASSERT_EQ(e.top.size(), 3u);
    EXPECT_GE(e.rank, 1);
    if (e.rank <= 3)  // the token is in the top list, at its rank
      EXPECT_EQ(e.top[size_t(e.rank - 1)].logprob, e.sampled.logprob);
    else
      EXPECT_LT(e.sampled.logprob, e.top[2].logprob);

    SamplingParams oracle;
    oracle.temperature = 0;
    oracle.max_tokens = 1;
    oracle.logprobs = 3;
    oracle.allowed_token_ids = {prompt[k]};
    const std::vector<RequestOutput> o =
        run(*engine, std::vector<int32_t>(prompt.begin(), prompt.begin() + long(k)), oracle);
    ASSERT_EQ(o.size(), 1u);
    ASSERT_EQ(o[0].logprobs.size(), 1u);
    const LogprobEntry& want = o[0].logprobs[0];
    EXPECT_EQ(want.sampled.token_id, prompt[k]);
    EXPECT_NEAR(e.sampled.logprob, want.sampled.logprob, 2e-3);
    EXPECT_EQ(e.top[0].token_id, want.top[0].token_id);
    for (size_t j = 0; j < 3; ++j) EXPECT_NEAR(e.top[j].logprob, want.top[j].logprob, 2e-3);
  }

  const std::vector<RequestOutput> again = run(*engine, prompt, params);
  ASSERT_EQ(again[0].prompt_logprobs.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i)
    EXPECT_EQ(again[0].prompt_logprobs[i].sampled.logprob, entries[i].sampled.logprob) << i;
  EXPECT_EQ(again[0].num_cached_tokens, 0);
}

// --scheduling-policy priority: with one sequence slot busy, a request of priority -1 that
// arrives after one of priority 5 is served first; without the policy a priority is refused.
TEST(SamplingControls, PriorityOrdersTheWaitingRequests) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  cfg.max_num_seqs = 1;
  SamplingParams params = six_greedy_tokens();
  params.priority = 5;
  EXPECT_THROW((void)Engine::create(cfg)->submit({1, 2, 3}, params, [](const RequestOutput&) {}),
               InvalidArgument);

  cfg.priority_scheduling = true;
  auto engine = Engine::create(cfg);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> finished;  // tags in finishing order
  bool blocker_started = false;
  const auto submit = [&](int tag, int priority, int max_tokens) {
    SamplingParams p = six_greedy_tokens();
    p.ignore_eos = true;
    p.priority = priority;
    p.max_tokens = max_tokens;
    engine->submit({3, 14, 15, 92, 65}, p, [&, tag](const RequestOutput& o) {
      std::lock_guard lock(mu);
      blocker_started |= tag == 0;
      if (o.finish) finished.push_back(tag);
      cv.notify_all();
    });
  };
  submit(0, 0, 100);  // holds the one slot while the others arrive
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return blocker_started; }));
  }
  submit(1, 5, 4);
  submit(2, -1, 4);
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished.size() == 3; }));
  EXPECT_EQ(finished, (std::vector<int>{0, 2, 1}));
}

}  // namespace
}  // namespace serval::runtime
