// Token feedback on the CPU backend (async scheduling): greedy steps launched ahead of the
// previous step's collection, with its ids as pending tokens, generate what synchronous steps
// generate; pending tokens are checked before a step runs; and an engine with
// --async-scheduling matches one without under preemption, prefix caching, stop ids and
// host-sampled requests.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>

#include "base/error.h"
#include "io/model_config.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/model_runner.h"
#include "runtime/parallel_runner.h"
#include "support/engine_batch.h"
#include "support/expect_error.h"
#include "support/greedy_steps.h"

namespace serval::runtime {
namespace {

constexpr int kBlockSize = 16, kBlocksPerSeq = 4, kSeqs = 4;

std::unique_ptr<ModelRunner> make_runner(int feedback_rows) {
  const std::string dir =
      (std::filesystem::path(SERVAL_SOURCE_DIR) / "tests/fixtures/qwen3_moe").string();
  const io::ModelConfig config = io::load_model_config(dir);
  auto weights = model::open_checkpoint_weights(dir);
  auto backend = backend::make_cpu_backend();
  auto m = model::create_model(config, *weights, *backend, {});
  RunnerOptions o;
  o.token_feedback_rows = feedback_rows;
  return std::make_unique<ModelRunner>(std::move(backend), std::move(m), kSeqs * kBlocksPerSeq,
                                       kBlockSize, o);
}

std::vector<std::vector<int32_t>> tables() {
  std::vector<std::vector<int32_t>> t(kSeqs);
  for (int s = 0; s < kSeqs; ++s)
    for (int b = 0; b < kBlocksPerSeq; ++b) t[s].push_back(s * kBlocksPerSeq + b);
  return t;
}

std::vector<std::vector<int32_t>> prompts() {
  std::vector<std::vector<int32_t>> p(kSeqs);
  for (int s = 0; s < kSeqs; ++s)
    for (int i = 0; i < 3 + 2 * s; ++i) p[s].push_back(int32_t((41 * (i + 1) + 97 * s) % 500));
  return p;
}

TEST(TokenFeedback, QueuedStepsGenerateTheSynchronousTokens) {
  auto reference = make_runner(0);
  auto queued = make_runner(kSeqs);
  EXPECT_FALSE(reference->supports_token_feedback());
  EXPECT_TRUE(queued->supports_token_feedback());
  const auto want =
      serval::testing::reordered_greedy_decode(*reference, prompts(), tables(), 20, false);
  const auto got = serval::testing::reordered_greedy_decode(*queued, prompts(), tables(), 20, true);
  EXPECT_EQ(got, want);
  for (const auto& seq : got)
    for (int32_t id : seq) EXPECT_GE(id, 0);
}

// Tensor parallel 2 (CPU communicators): every rank queues the step and resolves the pending ids
// from its own argmax.
TEST(TokenFeedback, TensorParallelQueuedStepsGenerateTheSynchronousTokens) {
  const std::string dir =
      (std::filesystem::path(SERVAL_SOURCE_DIR) / "tests/fixtures/qwen3_moe").string();
  const io::ModelConfig config = io::load_model_config(dir);
  auto weights = model::open_checkpoint_weights(dir);
  auto make_tp2 = [&](int feedback_rows) {
    ParallelLoadOptions o;
    o.parallel = {2, 1, false};
    o.block_size = kBlockSize;
    o.num_blocks = [](backend::Backend&, const model::Model&) { return kSeqs * kBlocksPerSeq; };
    o.runner.token_feedback_rows = feedback_rows;
    return load_parallel_runner(config, *weights, o);
  };
  auto reference = make_tp2(0);
  auto queued = make_tp2(kSeqs);
  EXPECT_FALSE(reference->supports_token_feedback());
  ASSERT_TRUE(queued->supports_token_feedback());
  const auto want =
      serval::testing::reordered_greedy_decode(*reference, prompts(), tables(), 16, false);
  const auto got = serval::testing::reordered_greedy_decode(*queued, prompts(), tables(), 16, true);
  EXPECT_EQ(got, want);
}

TEST(TokenFeedback, PendingTokensAreCheckedBeforeTheStep) {
  auto runner = make_runner(kSeqs);
  const auto t = tables();
  std::vector<int32_t> seq0 = {5, 6, 7}, seq1 = {8, 9};
  std::vector<SeqChunk> prefill = {{seq0, 0, 3, t[0]}, {seq1, 0, 2, t[1]}};
  // Nothing sampled yet: no row to name.
  std::vector<int32_t> early = {5, -1};
  std::vector<SeqChunk> bad = {{early, 0, 2, t[0]}};
  serval::testing::expect_error<InvalidArgument>([&] { runner->launch_greedy(bad); },
                                                 {"names row 0 of the previous greedy step"});
  runner->launch_greedy(prefill);  // samples 2 rows
  seq0.push_back(-3);              // row 2: past them (prefill's spans are stale from here on)
  std::vector<SeqChunk> past = {{seq0, 3, 1, t[0]}};
  serval::testing::expect_error<InvalidArgument>([&] { runner->launch_greedy(past); },
                                                 {"left 2 rows on the device"});
  seq0.back() = -2;
  seq1.push_back(-1);
  std::vector<SeqChunk> decode = {{seq0, 3, 1, t[0]}, {seq1, 2, 1, t[1]}};
  runner->launch_greedy(decode);
  serval::testing::expect_error<InvalidArgument>([&] { runner->launch_greedy(decode); },
                                                 {"two greedy steps are queued already"});
  const std::vector<int32_t> first = runner->collect_greedy();
  const std::vector<int32_t> second = runner->collect_greedy();
  EXPECT_EQ(first.size(), 2u);
  EXPECT_EQ(second.size(), 2u);
  serval::testing::expect_error<InvalidArgument>([&] { runner->collect_greedy(); },
                                                 {"no greedy step is queued"});
  // Without feedback every pending token is refused.
  auto plain = make_runner(0);
  const std::vector<int32_t> prompt0 = {5, 6, 7}, prompt1 = {8, 9};
  const std::vector<SeqChunk> plain_prefill = {{prompt0, 0, 3, t[0]}, {prompt1, 0, 2, t[1]}};
  plain->execute_greedy(plain_prefill);
  serval::testing::expect_error<InvalidArgument>([&] { plain->execute_greedy(decode); },
                                                 {"token feedback is off"});
}

struct Submitted {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::optional<FinishReason> finish;
  bool operator==(const Outcome&) const = default;
};

// Submits every request at once and waits (≤ 60 s) until each has finished.
std::vector<Outcome> run_all(Engine& engine, const std::vector<Submitted>& requests) {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Outcome> out(requests.size());
  size_t done = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    engine.submit(requests[i].prompt, requests[i].params, [&, i](const RequestOutput& o) {
      std::lock_guard lock(mu);
      out[i].tokens.insert(out[i].tokens.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finish) {
        out[i].finish = o.finish;
        ++done;
        cv.notify_all();
      }
    });
  }
  std::unique_lock lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] { return done == requests.size(); }));
  return out;
}

// Runs `requests` on an engine without and with --async-scheduling (token feedback on the CPU);
// returns both outcomes and the async engine's stats.
struct Compared {
  std::vector<Outcome> sync, async;
  EngineStats sync_stats, async_stats;
};
Compared compare(EngineConfig cfg, const std::vector<Submitted>& requests) {
  Compared c;
  cfg.async_scheduling = false;
  auto sync_engine = Engine::create(cfg);
  c.sync = run_all(*sync_engine, requests);
  c.sync_stats = sync_engine->stats();
  sync_engine->shutdown();
  cfg.async_scheduling = true;
  auto async_engine = Engine::create(cfg);
  c.async = run_all(*async_engine, requests);
  c.async_stats = async_engine->stats();
  async_engine->shutdown();
  return c;
}

SamplingParams greedy(int max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

// Twelve requests sharing a 20-token prefix in a KV cache of 16 blocks (they need ~48): running
// requests are preempted and recomputed, and prompts hit the prefix cache, while steps run with
// pending tokens.
TEST(TokenFeedbackEngine, SameTokensUnderPreemptionAndPrefixCaching) {
  std::vector<Submitted> requests;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 20; ++t) prompt.push_back(int32_t(7 + 13 * t));
    for (int t = 0; t < 3; ++t) prompt.push_back(int32_t(300 + 11 * i + t));
    requests.push_back({prompt, greedy(30 + 3 * (i % 4))});
  }
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  cfg.cpu_kv_cache_bytes = 16 * 16 * 768;  // 16 blocks: 768 bytes of f32 KV per token
  const Compared c = compare(cfg, requests);
  EXPECT_EQ(c.async, c.sync);
  EXPECT_GT(c.async_stats.num_preemptions, 0);
  EXPECT_GT(c.async_stats.prefix_cache_hits, 0);
  int64_t delivered = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(c.async[i].tokens.size(), size_t(requests[i].params.max_tokens)) << "request " << i;
    delivered += int64_t(c.async[i].tokens.size());
  }
  EXPECT_EQ(c.async_stats.generation_tokens_total, delivered);
  EXPECT_EQ(c.sync_stats.generation_tokens_total, delivered);
}

// A second turn whose prompt holds the first turn's output: the block that closes at the first
// turn's last scheduled token (pending when it was scheduled) is cached as without async
// scheduling, so both engines hit the same prefix.
TEST(TokenFeedbackEngine, PrefixCacheSeesTheLastBlockOfAFinishedRequest) {
  auto turns = [](bool async) {
    EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
    cfg.async_scheduling = async;
    auto engine = Engine::create(cfg);
    // 10 prompt tokens + 7 generated: the 16th token (position 15) is the last one scheduled.
    const std::vector<int32_t> prompt = {4, 8, 15, 16, 23, 42, 108, 7, 99, 300};
    const Outcome first = run_all(*engine, {{prompt, greedy(7)}}).at(0);
    std::vector<int32_t> second = prompt;
    second.insert(second.end(), first.tokens.begin(), first.tokens.end());
    second.insert(second.end(), {11, 12, 13});
    run_all(*engine, {{second, greedy(2)}});
    const int64_t hits = engine->stats().prefix_cache_hits;
    engine->shutdown();
    return hits;
  };
  const int64_t sync_hits = turns(false);
  EXPECT_EQ(sync_hits, 16);
  EXPECT_EQ(turns(true), sync_hits);
}

// Tensor parallel 2 on the CPU: the engine queues steps on the group as on one rank.
TEST(TokenFeedbackEngine, TensorParallelSameTokens) {
  std::vector<Submitted> requests;
  for (int i = 0; i < 6; ++i)
    requests.push_back({{3, 14, 15, int32_t(60 + 9 * i)}, greedy(12 + i)});
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  cfg.tensor_parallel_size = 2;
  const Compared c = compare(cfg, requests);
  EXPECT_EQ(c.async, c.sync);
  for (size_t i = 0; i < requests.size(); ++i)
    EXPECT_EQ(c.async[i].tokens.size(), size_t(requests[i].params.max_tokens)) << "request " << i;
}

// Stop ids end requests at the token the synchronous engine ends them on (the row queued after
// it is dropped), and requests sampled on the host (seeded) interleave with greedy ones.
TEST(TokenFeedbackEngine, StopIdsAndHostSampledRequests) {
  EngineConfig cfg = serval::testing::qwen3_moe_cpu_config();
  std::vector<Submitted> requests;
  for (int i = 0; i < 6; ++i) requests.push_back({{3, 14, 15, int32_t(92 + 7 * i)}, greedy(24)});
  // Each greedy request stops at its 5th + i-th token as the reference generates it.
  const Compared free_run = compare(cfg, requests);
  ASSERT_EQ(free_run.async, free_run.sync);
  for (int i = 0; i < 6; ++i) {
    const int32_t stop = free_run.sync[size_t(i)].tokens.at(size_t(4 + i));
    requests[size_t(i)].params.stop_token_ids = {stop};
  }
  for (int i = 0; i < 3; ++i) {
    SamplingParams p = greedy(16);
    p.temperature = 0.8f;
    p.seed = uint64_t(1234 + i);
    requests.push_back({{2, 71, 82, int32_t(8 + i)}, p});
  }
  const Compared c = compare(cfg, requests);
  EXPECT_EQ(c.async, c.sync);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(c.async[size_t(i)].finish, FinishReason::kStop) << "request " << i;
    EXPECT_LE(c.async[size_t(i)].tokens.size(), size_t(5 + i)) << "request " << i;
  }
}

}  // namespace
}  // namespace serval::runtime
