// Metrics of a serving benchmark (SPEC §5): pure functions on per-request timelines.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace serval::clients {

// One request's timeline. Times in seconds on the steady clock (serval::now_seconds).
struct RequestOutcome {
  int prompt_len = 0;          // tokens sent
  bool success = false;        // HTTP 200 and at least one content chunk
  double start_s = 0;          // just before the POST
  double end_s = 0;            // transfer finished (success or not); for in-flight counting
  double ttft_s = 0;           // start -> first chunk with non-empty choices
  double latency_s = 0;        // start -> last content chunk (E2EL)
  std::vector<double> itl_s;   // gaps between successive content chunks
  int output_tokens = 0;       // usage.completion_tokens, else the number of content chunks
  std::string generated_text;  // concatenated choices[0].text
  std::string error;           // why it failed; empty on success
};

// Mean/median/std/percentiles of one latency metric, in milliseconds (0 when no samples).
struct MetricStats {
  double mean_ms = 0, median_ms = 0, std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value), in the order asked
};

// Service-level objectives for goodput, in milliseconds; unset ones are not checked.
struct GoodputSlo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

struct BenchMetrics {
  int completed = 0, failed = 0;
  long long total_input = 0, total_output = 0;  // over successful requests
  double duration_s = 0;
  double request_throughput = 0, request_goodput = 0;
  double output_throughput = 0, total_token_throughput = 0;  // tok/s
  double max_output_tokens_per_s = 0;                        // peak over 1-second bins
  int max_concurrent_requests = 0;                           // peak in flight
  MetricStats ttft, tpot, itl, e2el;
  std::vector<int> output_lens;  // per request, 0 for failed ones
};

// numpy.percentile's default (linear interpolation between closest ranks); p in [0, 100].
// Empty input gives 0, as vLLM's `np.percentile(x or 0, p)` does.
double percentile(std::vector<double> values, double p);
MetricStats summarize_ms(const std::vector<double>& values_s, const std::vector<double>& ps);

// Max over 1-second bins [start+k, start+k+1) of the content chunks (one token each)
// that successful requests received in them.
double peak_output_tokens_per_s(const std::vector<RequestOutcome>& outcomes, double bench_start_s);

// Largest number of requests whose [start_s, end_s) intervals overlap.
int peak_concurrent_requests(const std::vector<RequestOutcome>& outcomes);

// All aggregates. `duration_s` is the wall time from the first dispatch to the last completion.
BenchMetrics compute_metrics(const std::vector<RequestOutcome>& outcomes, double bench_start_s,
                             double duration_s, const std::vector<double>& percentiles,
                             const GoodputSlo& slo);

}  // namespace serval::clients
