// Benchmark metrics on synthetic timelines, against hand-computed values.
#include "clients/bench_metrics.h"

#include <gtest/gtest.h>

using namespace serval::clients;

namespace {

RequestOutcome ok(int prompt, double start, double ttft, std::vector<double> itl, int tokens,
                  double end) {
  RequestOutcome o;
  o.prompt_len = prompt;
  o.success = true;
  o.start_s = start;
  o.ttft_s = ttft;
  o.itl_s = itl;
  o.latency_s = ttft;
  for (double g : itl) o.latency_s += g;
  o.output_tokens = tokens;
  o.end_s = end;
  return o;
}

// R1..R3 succeed, R4 fails. Values chosen so every figure is computable by hand.
std::vector<RequestOutcome> timelines() {
  RequestOutcome failed;
  failed.prompt_len = 40;
  failed.start_s = 1.2;
  failed.end_s = 1.5;
  failed.error = "HTTP 500: boom";
  return {ok(10, 0.0, 0.1, {0.05, 0.05, 0.1}, 4, 0.31), ok(20, 0.5, 0.2, {0.5, 0.6}, 3, 1.8),
          ok(30, 1.0, 0.4, {}, 1, 1.4), failed};
}

constexpr double kTol = 1e-9;

}  // namespace

TEST(Percentile, MatchesNumpyLinear) {
  // np.percentile([1,2,3,4], 99) = 3.97; [5] -> 5; [] -> 0 (vLLM's `x or 0`).
  EXPECT_NEAR(percentile({4, 1, 3, 2}, 99), 3.97, kTol);
  EXPECT_NEAR(percentile({4, 1, 3, 2}, 50), 2.5, kTol);
  EXPECT_NEAR(percentile({4, 1, 3, 2}, 0), 1, kTol);
  EXPECT_NEAR(percentile({4, 1, 3, 2}, 100), 4, kTol);
  EXPECT_NEAR(percentile({10, 0}, 25), 2.5, kTol);
  EXPECT_EQ(percentile({5}, 99), 5);
  EXPECT_EQ(percentile({}, 99), 0);
}

TEST(BenchMetrics, Aggregates) {
  BenchMetrics m = compute_metrics(timelines(), 0.0, 2.0, {99}, {});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 60);  // failed requests' prompts are not counted
  EXPECT_EQ(m.total_output, 8);
  EXPECT_EQ(m.output_lens, (std::vector<int>{4, 3, 1, 0}));
  EXPECT_NEAR(m.request_throughput, 1.5, kTol);
  EXPECT_NEAR(m.output_throughput, 4.0, kTol);
  EXPECT_NEAR(m.total_token_throughput, 34.0, kTol);
  EXPECT_EQ(m.request_goodput, 0);
}

TEST(BenchMetrics, LatencyStats) {
  BenchMetrics m = compute_metrics(timelines(), 0.0, 2.0, {50, 99}, {});
  // TTFT [0.1, 0.2, 0.4]
  EXPECT_NEAR(m.ttft.mean_ms, 700.0 / 3, 1e-6);
  EXPECT_NEAR(m.ttft.median_ms, 200, 1e-6);
  EXPECT_NEAR(m.ttft.std_ms, 124.72191289246472, 1e-6);
  ASSERT_EQ(m.ttft.percentiles_ms.size(), 2u);
  EXPECT_EQ(m.ttft.percentiles_ms[1].first, 99);
  EXPECT_NEAR(m.ttft.percentiles_ms[0].second, 200, 1e-6);
  EXPECT_NEAR(m.ttft.percentiles_ms[1].second, 396, 1e-6);
  // TPOT: R1 (0.3-0.1)/3, R2 (1.3-0.2)/2; R3 has one token and is excluded.
  double t1 = 0.2 / 3, t2 = 0.55;
  EXPECT_NEAR(m.tpot.mean_ms, (t1 + t2) / 2 * 1000, 1e-6);
  EXPECT_NEAR(m.tpot.median_ms, (t1 + t2) / 2 * 1000, 1e-6);
  EXPECT_NEAR(m.tpot.percentiles_ms[1].second, (t1 + (t2 - t1) * 0.99) * 1000, 1e-6);
  // ITL [0.05, 0.05, 0.1, 0.5, 0.6]
  EXPECT_NEAR(m.itl.mean_ms, 260, 1e-6);
  EXPECT_NEAR(m.itl.median_ms, 100, 1e-6);
  EXPECT_NEAR(m.itl.percentiles_ms[1].second, 596, 1e-6);
  // E2EL [0.3, 1.3, 0.4]
  EXPECT_NEAR(m.e2el.mean_ms, 2000.0 / 3, 1e-6);
  EXPECT_NEAR(m.e2el.median_ms, 400, 1e-6);
  EXPECT_NEAR(m.e2el.percentiles_ms[1].second, 1282, 1e-6);
}

TEST(BenchMetrics, NoSuccessGivesZeros) {
  std::vector<RequestOutcome> all_failed(2);
  BenchMetrics m = compute_metrics(all_failed, 0.0, 1.0, {99}, {});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.ttft.mean_ms, 0);
  EXPECT_EQ(m.tpot.percentiles_ms[0].second, 0);
  EXPECT_EQ(m.max_output_tokens_per_s, 0);
}

TEST(BenchMetrics, PeakOutputBins) {
  // Token times: R1 .1 .15 .2 .3; R2 .7 1.2 1.8; R3 1.4 -> bin 0 has 5, bin 1 has 3.
  EXPECT_EQ(peak_output_tokens_per_s(timelines(), 0.0), 5);
  // Bins start at the benchmark start: shifted by 0.5 s, [-.5,.5) has 4 and [.5,1.5) has 3.
  EXPECT_EQ(peak_output_tokens_per_s(timelines(), -0.5), 4);
  EXPECT_EQ(compute_metrics(timelines(), 0.0, 2.0, {99}, {}).max_output_tokens_per_s, 5);
}

TEST(BenchMetrics, PeakConcurrency) {
  // In flight at 1.25: R2, R3 and the failed R4.
  EXPECT_EQ(peak_concurrent_requests(timelines()), 3);
  RequestOutcome a, b;
  a.start_s = 0, a.end_s = 1.0;
  b.start_s = 1.0, b.end_s = 2.0;  // starts exactly when a ends: not concurrent
  EXPECT_EQ(peak_concurrent_requests({a, b}), 1);
  b.start_s = 0.999;
  EXPECT_EQ(peak_concurrent_requests({a, b}), 2);
}

TEST(BenchMetrics, Goodput) {
  using Ms = std::optional<double>;
  auto goodput = [](Ms ttft, Ms tpot, Ms e2el) {
    GoodputSlo slo;
    slo.ttft_ms = ttft, slo.tpot_ms = tpot, slo.e2el_ms = e2el;
    return compute_metrics(timelines(), 0.0, 2.0, {99}, slo).request_goodput;
  };
  EXPECT_NEAR(goodput(250, {}, {}), 1.0, kTol);   // R1, R2
  EXPECT_NEAR(goodput(250, 100, {}), 0.5, kTol);  // R1
  EXPECT_NEAR(goodput({}, 100, {}), 1.0, kTol);   // R1 and R3 (one token: TPOT 0)
  EXPECT_NEAR(goodput({}, {}, 500), 1.0, kTol);   // R1, R3
  EXPECT_NEAR(goodput(400, {}, {}), 1.5, kTol);   // the bound is inclusive
}
