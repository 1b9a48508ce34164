// The engine's step time accounting (EngineStats::step_seconds_total / model_seconds_total, the
// /metrics counters serval:engine_step_seconds_total and serval:model_execute_seconds_total): after
// a batch of requests on the CPU fixture, the model's share is positive and within the steps';
// and the KV cache is reported before the first step.
#include <gtest/gtest.h>

#include "runtime/engine.h"
#include "support/engine_batch.h"

namespace serval::runtime {
namespace {

TEST(EngineStepTime, ModelTimeIsPartOfStepTime) {
  auto engine = Engine::create(serval::testing::qwen3_moe_cpu_config());
  const EngineStats before = engine->stats();
  EXPECT_EQ(before.steps_total, 0);
  EXPECT_EQ(before.step_seconds_total, 0.0);
  serval::testing::run_greedy_batch(*engine, 4, 3, 2);
  engine->shutdown();
  const EngineStats after = engine->stats();
  ASSERT_GT(after.steps_total, 0);
  EXPECT_GT(after.model_seconds_total, 0.0);
  EXPECT_LE(after.model_seconds_total, after.step_seconds_total);
  // The CPU model dominates a step of this fixture; host work stays far below the steps' time.
  EXPECT_LT(after.step_seconds_total - after.model_seconds_total, after.step_seconds_total);
}

// A fresh engine reports its KV cache (all blocks free) before it has run a step: a /metrics
// scrape right after start-up must not read 0 total blocks.
TEST(EngineStats, KvCacheIsReportedBeforeTheFirstStep) {
  auto engine = Engine::create(serval::testing::qwen3_moe_cpu_config());
  const EngineStats s = engine->stats();
  EXPECT_EQ(s.steps_total, 0);
  EXPECT_GT(s.num_total_blocks, 0);
  EXPECT_EQ(s.num_free_blocks, s.num_total_blocks);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
}

}  // namespace
}  // namespace serval::runtime
