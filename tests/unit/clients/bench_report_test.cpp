// The printed block must equal SPEC §5's example byte for byte.
#include "clients/bench_report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

using namespace serval::clients;

namespace {

const char* kSpecBlock = R"(============ Serving Benchmark Result ============
Successful requests:                     40
Failed requests:                         0
Maximum request concurrency:             8
Benchmark duration (s):                  26.08
Total input tokens:                      40920
Total generated tokens:                  22789
Request throughput (req/s):              1.53
Output token throughput (tok/s):         873.75
Peak output token throughput (tok/s):    1128.00
Peak concurrent requests:                13.00
Total token throughput (tok/s):          2442.67
---------------Time to First Token----------------
Mean TTFT (ms):                          126.60
Median TTFT (ms):                        94.03
P99 TTFT (ms):                           283.60
-----Time per Output Token (excl. 1st token)------
Mean TPOT (ms):                          7.67
Median TPOT (ms):                        7.69
P99 TPOT (ms):                           8.96
---------------Inter-token Latency----------------
Mean ITL (ms):                           7.67
Median ITL (ms):                         7.08
P99 ITL (ms):                            8.09
==================================================
)";

MetricStats stats(double mean, double median, std::vector<std::pair<double, double>> ps) {
  MetricStats s;
  s.mean_ms = mean, s.median_ms = median, s.percentiles_ms = ps;
  return s;
}

BenchMetrics spec_metrics() {
  BenchMetrics m;
  m.completed = 40, m.failed = 0;
  m.duration_s = 26.0811;
  m.total_input = 40920, m.total_output = 22789;
  m.request_throughput = 1.5337, m.output_throughput = 873.7512;
  m.max_output_tokens_per_s = 1128, m.max_concurrent_requests = 13;
  m.total_token_throughput = 2442.6658;
  m.ttft = stats(126.6031, 94.0298, {{99, 283.6012}});
  m.tpot = stats(7.6712, 7.6876, {{99, 8.9553}});
  m.itl = stats(7.6699, 7.0812, {{99, 8.0905}});
  m.e2el = stats(301.5, 300.25, {{99, 412.345}});
  return m;
}

}  // namespace

TEST(BenchReport, EqualsSpecBlock) {
  ReportOptions o{.max_concurrency = 8, .request_rate = INFINITY};
  std::string got = format_report(spec_metrics(), o);
  // Line by line first, for a readable failure, then the whole.
  std::istringstream g(got), w(kSpecBlock);
  std::string gl, wl;
  for (int n = 1; std::getline(w, wl); ++n) {
    ASSERT_TRUE(std::getline(g, gl)) << "missing line " << n << ": " << wl;
    EXPECT_EQ(gl, wl) << "line " << n;
  }
  EXPECT_FALSE(std::getline(g, gl)) << "extra line: " << gl;
  EXPECT_EQ(got, kSpecBlock);
}

TEST(BenchReport, SpecFileHoldsTheSameBlock) {
  std::ifstream f(SERVAL_SHARED_DIR "/docs/SPEC.md");
  if (!f) GTEST_SKIP() << "no SPEC.md under " SERVAL_SHARED_DIR;
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find(kSpecBlock), std::string::npos);
}

TEST(BenchReport, OptionalLinesAndSections) {
  ReportOptions o{.max_concurrency = std::nullopt,
                  .request_rate = 2.5,
                  .goodput = true,
                  .percentile_metrics = {"ttft", "e2el"}};
  BenchMetrics m = spec_metrics();
  m.request_goodput = 1.25;
  m.ttft.percentiles_ms = {{50, 90.0}, {99.9, 300.456}};
  m.e2el.percentiles_ms = {{50, 300.0}, {99.9, 500.0}};
  std::string got = format_report(m, o);
  EXPECT_EQ(got.find("Maximum request concurrency:"), std::string::npos);
  EXPECT_NE(got.find("Failed requests:                         0\n"
                     "Request rate configured (RPS):           2.50\n"
                     "Benchmark duration (s):"),
            std::string::npos);
  EXPECT_NE(got.find("Request throughput (req/s):              1.53\n"
                     "Request goodput (req/s):                 1.25\n"
                     "Output token throughput"),
            std::string::npos);
  EXPECT_EQ(got.find("TPOT"), std::string::npos);
  EXPECT_EQ(got.find("ITL"), std::string::npos);
  EXPECT_NE(got.find("P50 TTFT (ms):                           90.00\n"
                     "P99.9 TTFT (ms):                         300.46\n"
                     "----------------End-to-end Latency----------------\n"
                     "Mean E2EL (ms):                          301.50\n"
                     "Median E2EL (ms):                        300.25\n"
                     "P50 E2EL (ms):                           300.00\n"
                     "P99.9 E2EL (ms):                         500.00\n"
                     "==================================================\n"),
            std::string::npos)
      << got;
}

// An embeddings run (--backend openai-embeddings) generates nothing: no token lines.
TEST(BenchReport, EmbeddingsLeaveOutTheGeneratedTokens) {
  const ReportOptions o{.max_concurrency = 8,
                        .request_rate = INFINITY,
                        .percentile_metrics = {"e2el"},
                        .embeddings = true};
  const std::string got = format_report(spec_metrics(), o);
  EXPECT_EQ(got.find("generated"), std::string::npos) << got;
  EXPECT_EQ(got.find("Output token throughput"), std::string::npos) << got;
  EXPECT_NE(got.find("Total input tokens:                      40920\n"
                     "Request throughput (req/s):              1.53\n"
                     "Peak concurrent requests:"),
            std::string::npos)
      << got;
  EXPECT_NE(got.find("End-to-end Latency"), std::string::npos) << got;
}

TEST(BenchReport, ResultJsonKeys) {
  ReportOptions o{.max_concurrency = 8, .request_rate = INFINITY};
  RequestOutcome r;
  r.prompt_len = 7, r.ttft_s = 0.5, r.itl_s = {0.1, 0.2}, r.generated_text = "hi";
  r.error = "";
  BenchMetrics m = spec_metrics();
  m.output_lens = {3};
  nlohmann::json j = result_json({{"backend", "serval"}}, m, {r}, o);
  EXPECT_EQ(j["backend"], "serval");
  EXPECT_EQ(j["completed"], 40);
  EXPECT_EQ(j["input_lens"], nlohmann::json::array({7}));
  EXPECT_EQ(j["output_lens"], nlohmann::json::array({3}));
  EXPECT_EQ(j["itls"][0].size(), 2u);
  EXPECT_EQ(j["generated_texts"][0], "hi");
  EXPECT_NEAR(j["p99_ttft_ms"].get<double>(), 283.6012, 1e-9);
  EXPECT_NEAR(j["median_itl_ms"].get<double>(), 7.0812, 1e-9);
  EXPECT_TRUE(j.contains("std_tpot_ms"));
  EXPECT_FALSE(j.contains("mean_e2el_ms"));  // not selected
  EXPECT_TRUE(j["request_goodput"].is_null());
}
