// /metrics with data-parallel replicas: every engine metric has the total sample plus one per
// replica labelled engine="i"; the server histograms stay unlabelled; promtool accepts the page
// (only the ':' naming note). And `--data-parallel-size` reaches EngineConfig.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "base/error.h"
#include "server/metrics.h"
#include "server/serve_args.h"
#include "unit/server/promtool_check.h"

namespace serval::server {
namespace {

runtime::EngineStats replica(int running, int64_t free_blocks, int64_t generated) {
  runtime::EngineStats s;
  s.num_running = running;
  s.num_free_blocks = free_blocks;
  s.num_total_blocks = 8;
  s.generation_tokens_total = generated;
  return s;
}

TEST(DataParallelMetrics, PerEngineSamplesAndTotal) {
  Metrics metrics;
  metrics.observe_ttft(0.2);
  runtime::ModelInfo info;
  info.served_model_name = "m";
  std::vector<runtime::EngineStats> per = {replica(1, 6, 10), replica(2, 2, 5)};
  per[0].step_seconds_total = 1.5;
  per[0].model_seconds_total = 1.25;
  runtime::EngineStats total = replica(3, 8, 15);
  total.num_total_blocks = 16;
  const std::string m = metrics.render(info, total, per);
  auto has = [&](const std::string& line) { return m.find(line + "\n") != std::string::npos; };
  EXPECT_TRUE(has("serval:num_requests_running{model_name=\"m\"} 3"));
  EXPECT_TRUE(has("serval:num_requests_running{model_name=\"m\",engine=\"0\"} 1"));
  EXPECT_TRUE(has("serval:num_requests_running{model_name=\"m\",engine=\"1\"} 2"));
  EXPECT_TRUE(has("serval:kv_cache_usage_perc{model_name=\"m\"} 0.5"));  // 1 - 8/16
  EXPECT_TRUE(has("serval:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25"));
  EXPECT_TRUE(has("serval:kv_cache_usage_perc{model_name=\"m\",engine=\"1\"} 0.75"));
  EXPECT_TRUE(has("serval:generation_tokens_total{model_name=\"m\",engine=\"1\"} 5"));
  EXPECT_TRUE(has("serval:kv_cache_free_blocks{model_name=\"m\",engine=\"0\"} 6"));
  EXPECT_TRUE(has("serval:time_to_first_token_seconds_count{model_name=\"m\"} 1"));
  EXPECT_TRUE(has("serval:engine_step_seconds_total{model_name=\"m\",engine=\"0\"} 1.5"));
  EXPECT_TRUE(has("serval:model_execute_seconds_total{model_name=\"m\",engine=\"0\"} 1.25"));
  EXPECT_EQ(m.find("seconds_count{model_name=\"m\",engine="), std::string::npos);
  // The total comes first (what scripts reading the first sample expect).
  EXPECT_LT(m.find("serval:num_requests_running{model_name=\"m\"}"),
            m.find("serval:num_requests_running{model_name=\"m\",engine=\"0\"}"));
  // One replica: no engine label at all (the page of a plain engine).
  const std::string single = metrics.render(info, per[0], {per[0]});
  EXPECT_EQ(single.find("engine="), std::string::npos);

  server::testing::expect_promtool_accepts(m, "serval_dp_metrics.txt");
}

TEST(DataParallelMetrics, ServeFlagSetsReplicaCount) {
  EXPECT_EQ(parse_serve_args({"/m"}, nullptr).engine.data_parallel_size, 1);
  EXPECT_EQ(
      parse_serve_args({"/m", "--data-parallel-size", "2"}, nullptr).engine.data_parallel_size, 2);
  ServeArgs a = parse_serve_args({"/m", "--data_parallel_size=3"}, nullptr);
  EXPECT_EQ(a.engine.data_parallel_size, 3);
  EXPECT_TRUE(a.ignored.empty());
  EXPECT_THROW(parse_serve_args({"/m", "--data-parallel-size", "0"}, nullptr), InvalidArgument);
}

}  // namespace
}  // namespace serval::server
