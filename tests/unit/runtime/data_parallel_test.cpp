// Data parallel: least-loaded routing (hand-computed on fake replicas), global request ids
// routing aborts and outputs, and two CPU replicas of the qwen3_moe fixture generating the
// greedy tokens of one engine under 20 concurrent requests.
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "runtime/data_parallel_engine.h"
#include "runtime/engine.h"
#include "support/engine_batch.h"

namespace serval::runtime {
namespace {

// A replica that records submits and aborts; the test drives its outputs by hand.
class FakeEngine final : public Engine {
 public:
  explicit FakeEngine(int64_t kv_tokens) { info_.kv_cache_tokens = kv_tokens; }
  const ModelInfo& info() const override { return info_; }
  const tokenizer::Tokenizer* tokenizer() const override { return nullptr; }
  const tokenizer::ChatTemplate* chat_template() const override { return nullptr; }
  uint64_t submit(std::vector<int32_t> prompt, const SamplingParams& p,
                  OutputCallback cb) override {
    if (p.max_tokens < 1) throw InvalidArgument("max_tokens");
    callbacks[++next_id] = std::move(cb);
    prompt_sizes.push_back(int(prompt.size()));
    return next_id;
  }
  void abort(uint64_t id) override { aborted.push_back(id); }
  EngineStats stats() const override {
    EngineStats s;
    s.num_running = int(callbacks.size());
    s.num_total_blocks = 10;
    return s;
  }
  bool healthy() const override { return true; }
  void shutdown() override {}
  // Sends `tokens` new tokens (and a finish) for local request `id`.
  void emit(uint64_t id, int tokens, bool finish) {
    RequestOutput o;
    o.request_id = id;
    o.new_token_ids.assign(size_t(tokens), 7);
    if (finish) o.finish = FinishReason::kLength;
    callbacks.at(id)(o);
  }

  ModelInfo info_;
  uint64_t next_id = 0;
  std::map<uint64_t, OutputCallback> callbacks;
  std::vector<int> prompt_sizes;
  std::vector<uint64_t> aborted;
};

TEST(DataParallel, LeastLoadedPrefersLowestIndexOnTies) {
  EXPECT_EQ(least_loaded(std::vector<int64_t>{0, 0, 0}), 0);
  EXPECT_EQ(least_loaded(std::vector<int64_t>{5, 3, 3}), 1);
  EXPECT_EQ(least_loaded(std::vector<int64_t>{5, 4, 1}), 2);
}

TEST(DataParallel, RoutesByOutstandingTokensAndTracksOutputs) {
  std::vector<FakeEngine*> fakes;
  std::vector<std::unique_ptr<Engine>> replicas;
  for (int i = 0; i < 3; ++i) {
    auto f = std::make_unique<FakeEngine>(100);
    fakes.push_back(f.get());
    replicas.push_back(std::move(f));
  }
  DataParallelEngine dp(std::move(replicas));
  EXPECT_EQ(dp.info().kv_cache_tokens, 300);
  std::vector<RequestOutput> seen;
  auto record = [&](const RequestOutput& o) { seen.push_back(o); };
  auto submit = [&](int prompt, int max_tokens) {
    SamplingParams p;
    p.max_tokens = max_tokens;
    return dp.submit(std::vector<int32_t>(size_t(prompt), 1), p, record);
  };
  // Loads (prompt + max_tokens): a=10+20 → r0; b=5+5 → r1; c=1+1 → r2; d=4+4 → r2 (2 < 10 < 30);
  // e=1+1 → r1 (10 == 10 ties to r1 < r2).
  const uint64_t a = submit(10, 20), b = submit(5, 5), c = submit(1, 1), d = submit(4, 4),
                 e = submit(1, 1);
  EXPECT_EQ(dp.replica_of(a), 0);
  EXPECT_EQ(dp.replica_of(b), 1);
  EXPECT_EQ(dp.replica_of(c), 2);
  EXPECT_EQ(dp.replica_of(d), 2);
  EXPECT_EQ(dp.replica_of(e), 1);
  EXPECT_EQ(dp.loads(), (std::vector<int64_t>{30, 12, 10}));
  // First output of a (local id 1 on r0) releases its prompt and 3 tokens: 30 - 13 = 17.
  fakes[0]->emit(1, 3, false);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].request_id, a);  // the global id, not the replica's
  EXPECT_EQ(dp.loads(), (std::vector<int64_t>{17, 12, 10}));
  // d (local 2 on r2) finishes early: its whole remaining load goes.
  fakes[2]->emit(2, 1, true);
  EXPECT_EQ(dp.loads(), (std::vector<int64_t>{17, 12, 2}));
  EXPECT_EQ(dp.replica_of(d), -1);
  // Now r2 is least loaded.
  const uint64_t f = submit(2, 2);
  EXPECT_EQ(dp.replica_of(f), 2);
  // Abort of e goes to replica 1 with its local id (2); unknown / finished ids are ignored.
  dp.abort(e);
  dp.abort(d);
  dp.abort(12345);
  EXPECT_EQ(fakes[1]->aborted, std::vector<uint64_t>{2});
  EXPECT_TRUE(fakes[0]->aborted.empty());
  EXPECT_TRUE(fakes[2]->aborted.empty());
  // A rejected submit leaves the loads as they were.
  const auto before = dp.loads();
  EXPECT_THROW(submit(3, 0), InvalidArgument);
  EXPECT_EQ(dp.loads(), before);
  // Stats: summed and per replica.
  EXPECT_EQ(dp.replica_stats().size(), 3u);
  EXPECT_EQ(dp.stats().num_total_blocks, 30);
  EXPECT_EQ(dp.stats().num_running, 6);  // the fakes never forget a callback
}

TEST(DataParallel, RefusesASizeBelowOne) {
  EngineConfig cfg;
  cfg.model_dir = "/nonexistent";
  cfg.data_parallel_size = 0;
  EXPECT_THROW(Engine::create(cfg), InvalidArgument);
}

EngineConfig fixture_config(int dp) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  cfg.data_parallel_size = dp;
  return cfg;
}

// 20 concurrent greedy requests (distinct prompts); each one's tokens.
std::vector<std::vector<int32_t>> run_batch(Engine& engine) {
  return serval::testing::run_greedy_batch(engine, 20, 6, 5).tokens;
}

TEST(DataParallel, TwoCpuReplicasMatchOneEngine) {
  auto one = Engine::create(fixture_config(1));
  const auto ref = run_batch(*one);
  one->shutdown();
  auto two = Engine::create(fixture_config(2));
  EXPECT_EQ(two->info().kv_cache_tokens, 2 * one->info().kv_cache_tokens);
  EXPECT_EQ(run_batch(*two), ref);
  const std::vector<EngineStats> per = two->replica_stats();
  ASSERT_EQ(per.size(), 2u);
  EXPECT_GT(per[0].generation_tokens_total, 0);
  EXPECT_GT(per[1].generation_tokens_total, 0);
  EXPECT_EQ(per[0].generation_tokens_total + per[1].generation_tokens_total,
            two->stats().generation_tokens_total);
  two->shutdown();
}

// Attention data parallel over shared experts (runtime/dp_ep_group.h): two replicas whose MoE
// layers run together, the experts split over their ranks (with tensor parallel 1 and 2 in each
// replica), generate what one engine generates; both replicas take requests.
TEST(DataParallel, ExpertParallelReplicasMatchOneEngine) {
  auto one = Engine::create(fixture_config(1));
  const auto ref = run_batch(*one);
  one->shutdown();
  for (int tp : {1, 2}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    EngineConfig cfg = fixture_config(2);
    cfg.enable_expert_parallel = true;
    cfg.tensor_parallel_size = tp;
    auto two = Engine::create(cfg);
    EXPECT_EQ(run_batch(*two), ref);
    const std::vector<EngineStats> per = two->replica_stats();
    ASSERT_EQ(per.size(), 2u);
    EXPECT_GT(per[0].generation_tokens_total, 0);
    EXPECT_GT(per[1].generation_tokens_total, 0);
    two->shutdown();
  }
}

TEST(DataParallel, AbortReachesTheSecondReplica) {
  auto engine = Engine::create(fixture_config(2));
  auto* dp = dynamic_cast<DataParallelEngine*>(engine.get());
  ASSERT_NE(dp, nullptr);
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, FinishReason> finished;
  auto cb = [&](const RequestOutput& o) {
    std::lock_guard lock(mu);
    if (o.finish) finished[o.request_id] = *o.finish;
    cv.notify_all();
  };
  SamplingParams sp;
  sp.temperature = 0;
  sp.ignore_eos = true;
  sp.max_tokens = 100;
  const uint64_t first = engine->submit({3, 14, 15}, sp, cb);
  const uint64_t second = engine->submit({3, 14, 15}, sp, cb);
  ASSERT_EQ(dp->replica_of(first), 0);
  ASSERT_EQ(dp->replica_of(second), 1);
  engine->abort(second);
  std::unique_lock lock(mu);
  ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished.size() == 2; }));
  EXPECT_EQ(finished[second], FinishReason::kAbort);
  EXPECT_EQ(finished[first], FinishReason::kLength);
  lock.unlock();
  EXPECT_EQ(dp->loads(), (std::vector<int64_t>{0, 0}));
  // Idle: every block of both replicas free again.
  for (int i = 0; i < 100; ++i) {
    const auto per = engine->replica_stats();
    if (per[0].num_running == 0 && per[1].num_running == 0 &&
        per[0].num_free_blocks == per[0].num_total_blocks &&
        per[1].num_free_blocks == per[1].num_total_blocks)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const EngineStats& s : engine->replica_stats()) {
    EXPECT_EQ(s.num_running, 0);
    EXPECT_EQ(s.num_free_blocks, s.num_total_blocks);
  }
  engine->shutdown();
}

}  // namespace
}  // namespace serval::runtime
