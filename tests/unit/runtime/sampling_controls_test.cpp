// logit_bias and allowed_token_ids reach the tokens an engine generates: a greedy request is no
// longer the plain device argmax but the host sampler with them applied (the qwen3_moe fixture
// on the CPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "runtime/engine.h"
#include "support/engine_batch.h"

namespace serval::runtime {
namespace {

// The tokens of one request of `params` (EOS ignored), waited for up to 60 s.
std::vector<int32_t> generate(Engine& engine, SamplingParams params) {
  params.ignore_eos = true;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  bool done = false;
  engine.submit({3, 14, 15, 92, 65}, params, [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    tokens.insert(tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (o.finish) done = true;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done; }));
  return tokens;
}

TEST(SamplingControls, LogitBiasAndAllowedTokenIdsSteerGreedyDecoding) {
  auto engine = Engine::create(serval::testing::qwen3_moe_cpu_config());
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 6;
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

}  // namespace
}  // namespace serval::runtime
