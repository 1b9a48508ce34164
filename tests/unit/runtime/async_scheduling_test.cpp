// --async-scheduling: the output queue delivers in push order on its own thread (also when a
// callback throws, and on destruction), and an engine with it generates exactly the greedy
// tokens of one without it, each request's final update last, aborts included.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "runtime/output_queue.h"
#include "support/engine_batch.h"

namespace serval::runtime {
namespace {

RequestOutput update(uint64_t id, int32_t token) {
  RequestOutput o;
  o.request_id = id;
  o.new_token_ids = {token};
  return o;
}

TEST(OutputQueue, DeliversInPushOrderOnAnotherThread) {
  std::vector<std::pair<uint64_t, int32_t>> seen;
  std::vector<std::thread::id> threads;
  auto record = std::make_shared<const OutputCallback>([&](const RequestOutput& o) {
    seen.emplace_back(o.request_id, o.new_token_ids.at(0));
    threads.push_back(std::this_thread::get_id());
  });
  std::vector<std::pair<uint64_t, int32_t>> pushed;
  {
    OutputQueue q;
    for (int i = 0; i < 1000; ++i) {
      pushed.emplace_back(uint64_t(i % 3), int32_t(i));
      q.push(record, update(uint64_t(i % 3), int32_t(i)));
    }
    q.drain();
    EXPECT_EQ(seen, pushed);
    for (int i = 0; i < 10; ++i) q.push(record, update(9, int32_t(1000 + i)));
  }  // the destructor delivers what is still queued
  ASSERT_EQ(seen.size(), 1010u);
  EXPECT_EQ(seen.back(), (std::pair<uint64_t, int32_t>{9, 1009}));
  for (std::thread::id t : threads) EXPECT_NE(t, std::this_thread::get_id());
}

TEST(OutputQueue, AThrowingCallbackLosesOnlyItsOwnUpdate) {
  std::vector<int32_t> seen;
  auto ok = std::make_shared<const OutputCallback>(
      [&](const RequestOutput& o) { seen.push_back(o.new_token_ids.at(0)); });
  auto bad = std::make_shared<const OutputCallback>(
      [](const RequestOutput&) { throw std::runtime_error("client went away"); });
  OutputQueue q;
  q.push(ok, update(1, 1));
  q.push(bad, update(2, 2));
  q.push(ok, update(1, 3));
  q.drain();
  EXPECT_EQ(seen, (std::vector<int32_t>{1, 3}));
}

EngineConfig fixture_config(bool async) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  cfg.async_scheduling = async;
  return cfg;
}

TEST(AsyncScheduling, SameTokensAsWithout) {
  auto sync_engine = Engine::create(fixture_config(false));
  const serval::testing::GreedyBatch ref =
      serval::testing::run_greedy_batch(*sync_engine, 12, 5, 4);
  sync_engine->shutdown();
  auto async_engine = Engine::create(fixture_config(true));
  const serval::testing::GreedyBatch got =
      serval::testing::run_greedy_batch(*async_engine, 12, 5, 4);
  async_engine->shutdown();
  EXPECT_TRUE(ref.finish_was_last);
  EXPECT_TRUE(got.finish_was_last);
  EXPECT_EQ(got.tokens, ref.tokens);
  for (int i = 0; i < int(got.tokens.size()); ++i)
    EXPECT_EQ(int(got.tokens[size_t(i)].size()), 5 + i % 4) << "request " << i;
}

TEST(AsyncScheduling, AbortAndShutdownStillEndEveryRequest) {
  auto engine = Engine::create(fixture_config(true));
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, FinishReason> finished;
  int tokens_of_first = 0;
  auto cb = [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    tokens_of_first += o.request_id == 1 ? int(o.new_token_ids.size()) : 0;
    if (o.finish) finished[o.request_id] = *o.finish;
    cv.notify_all();
  };
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 100;
  sp.ignore_eos = true;
  const uint64_t first = engine->submit({3, 14, 15, 92}, sp, cb);
  ASSERT_EQ(first, 1u);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return tokens_of_first > 0; }));
  }
  engine->abort(first);
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(
        cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished.count(first) > 0; }));
    EXPECT_EQ(finished[first], FinishReason::kAbort);
    EXPECT_LT(tokens_of_first, 100);
  }
  const uint64_t second = engine->submit({3, 14, 15, 93}, sp, cb);
  engine->shutdown();  // every update is delivered before shutdown returns
  std::lock_guard lock(mu);
  ASSERT_EQ(finished.count(second), 1u);
  EXPECT_EQ(finished[second], FinishReason::kAbort);
}

}  // namespace
}  // namespace serval::runtime
