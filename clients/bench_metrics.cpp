#include "clients/bench_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace serval::clients {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(rank));
  size_t hi = std::min(lo + 1, values.size() - 1);
  double frac = rank - static_cast<double>(lo);
  return values[lo] + (values[hi] - values[lo]) * frac;
}

MetricStats summarize_ms(const std::vector<double>& values_s, const std::vector<double>& ps) {
  MetricStats s;
  for (double p : ps) s.percentiles_ms.emplace_back(p, percentile(values_s, p) * 1000);
  if (values_s.empty()) return s;
  double n = static_cast<double>(values_s.size());
  double mean = std::accumulate(values_s.begin(), values_s.end(), 0.0) / n;
  double var = 0;
  for (double v : values_s) var += (v - mean) * (v - mean);
  s.mean_ms = mean * 1000;
  s.std_ms = std::sqrt(var / n) * 1000;  // population std, as np.std
  s.median_ms = percentile(values_s, 50) * 1000;
  return s;
}

double peak_output_tokens_per_s(const std::vector<RequestOutcome>& outcomes, double bench_start_s) {
  std::map<long long, long long> tokens_per_bin;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) continue;
    double t = o.start_s + o.ttft_s;
    tokens_per_bin[static_cast<long long>(std::floor(t - bench_start_s))] += 1;
    for (double gap : o.itl_s) {
      t += gap;
      tokens_per_bin[static_cast<long long>(std::floor(t - bench_start_s))] += 1;
    }
  }
  long long peak = 0;
  for (const auto& [bin, n] : tokens_per_bin) peak = std::max(peak, n);
  return static_cast<double>(peak);
}

int peak_concurrent_requests(const std::vector<RequestOutcome>& outcomes) {
  // Sweep: at equal times an end (-1) sorts before a start (+1): intervals are half-open.
  std::vector<std::pair<double, int>> events;
  for (const RequestOutcome& o : outcomes) {
    events.emplace_back(o.start_s, +1);
    events.emplace_back(std::max(o.end_s, o.start_s), -1);
  }
  std::sort(events.begin(), events.end());
  int now = 0, peak = 0;
  for (const auto& [t, delta] : events) peak = std::max(peak, now += delta);
  return peak;
}

BenchMetrics compute_metrics(const std::vector<RequestOutcome>& outcomes, double bench_start_s,
                             double duration_s, const std::vector<double>& percentiles,
                             const GoodputSlo& slo) {
  BenchMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  int good = 0;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) {
      ++m.failed;
      m.output_lens.push_back(0);
      continue;
    }
    ++m.completed;
    m.output_lens.push_back(o.output_tokens);
    m.total_input += o.prompt_len;
    m.total_output += o.output_tokens;
    // One-token outputs have no TPOT; for goodput they count as TPOT 0 (as vLLM does).
    double tpot = 0;
    if (o.output_tokens > 1) {
      tpot = (o.latency_s - o.ttft_s) / (o.output_tokens - 1);
      tpots.push_back(tpot);
    }
    ttfts.push_back(o.ttft_s);
    e2els.push_back(o.latency_s);
    itls.insert(itls.end(), o.itl_s.begin(), o.itl_s.end());
    bool is_good = (!slo.ttft_ms || o.ttft_s * 1000 <= *slo.ttft_ms) &&
                   (!slo.tpot_ms || tpot * 1000 <= *slo.tpot_ms) &&
                   (!slo.e2el_ms || o.latency_s * 1000 <= *slo.e2el_ms);
    if (slo.any() && is_good) ++good;
  }
  m.duration_s = duration_s;
  if (duration_s > 0) {
    m.request_throughput = m.completed / duration_s;
    m.request_goodput = good / duration_s;
    m.output_throughput = static_cast<double>(m.total_output) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
  }
  m.max_output_tokens_per_s = peak_output_tokens_per_s(outcomes, bench_start_s);
  m.max_concurrent_requests = peak_concurrent_requests(outcomes);
  m.ttft = summarize_ms(ttfts, percentiles);
  m.tpot = summarize_ms(tpots, percentiles);
  m.itl = summarize_ms(itls, percentiles);
  m.e2el = summarize_ms(e2els, percentiles);
  return m;
}

}  // namespace serval::clients
