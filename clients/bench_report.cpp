#include "clients/bench_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace serval::clients {
namespace {

constexpr int kWidth = 50;

struct MetricSection {
  const char* key;     // as in --percentile-metrics
  const char* name;    // as in the labels
  const char* header;  // section title
  const MetricStats BenchMetrics::*stats;
};

constexpr MetricSection kSections[] = {
    {"ttft", "TTFT", "Time to First Token", &BenchMetrics::ttft},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &BenchMetrics::tpot},
    {"itl", "ITL", "Inter-token Latency", &BenchMetrics::itl},
    {"e2el", "E2EL", "End-to-end Latency", &BenchMetrics::e2el},
};

void line(std::string& out, std::string_view label, std::string_view value) {
  out += fmt::format("{:<40} {}\n", label, value);
}
void line_int(std::string& out, std::string_view label, long long v) {
  line(out, label, fmt::format("{}", v));
}
void line_float(std::string& out, std::string_view label, double v) {
  line(out, label, fmt::format("{:.2f}", v));
}

bool selected(const ReportOptions& o, std::string_view key) {
  return std::find(o.percentile_metrics.begin(), o.percentile_metrics.end(), key) !=
         o.percentile_metrics.end();
}

}  // namespace

std::string percentile_word(double p) {
  if (p == std::floor(p)) return fmt::format("{}", static_cast<long long>(p));
  return fmt::format("{}", p);
}

std::string format_report(const BenchMetrics& m, const ReportOptions& o) {
  std::string out = fmt::format("{:=^{}}\n", " Serving Benchmark Result ", kWidth);
  line_int(out, "Successful requests:", m.completed);
  line_int(out, "Failed requests:", m.failed);
  if (o.max_concurrency) line_int(out, "Maximum request concurrency:", *o.max_concurrency);
  if (std::isfinite(o.request_rate))
    line_float(out, "Request rate configured (RPS):", o.request_rate);
  line_float(out, "Benchmark duration (s):", m.duration_s);
  line_int(out, "Total input tokens:", m.total_input);
  if (!o.embeddings) line_int(out, "Total generated tokens:", m.total_output);
  line_float(out, "Request throughput (req/s):", m.request_throughput);
  if (o.goodput) line_float(out, "Request goodput (req/s):", m.request_goodput);
  if (!o.embeddings) {
    line_float(out, "Output token throughput (tok/s):", m.output_throughput);
    line_float(out, "Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  }
  line_float(out, "Peak concurrent requests:", m.max_concurrent_requests);
  line_float(out, "Total token throughput (tok/s):", m.total_token_throughput);
  for (const MetricSection& s : kSections) {
    if (!selected(o, s.key)) continue;
    const MetricStats& st = m.*s.stats;
    out += fmt::format("{:-^{}}\n", s.header, kWidth);
    line_float(out, fmt::format("Mean {} (ms):", s.name), st.mean_ms);
    line_float(out, fmt::format("Median {} (ms):", s.name), st.median_ms);
    for (const auto& [p, v] : st.percentiles_ms)
      line_float(out, fmt::format("P{} {} (ms):", percentile_word(p), s.name), v);
  }
  out += std::string(kWidth, '=') + "\n";
  return out;
}

nlohmann::json result_json(const nlohmann::json& header, const BenchMetrics& m,
                           const std::vector<RequestOutcome>& outcomes, const ReportOptions& o) {
  nlohmann::json j = header;
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = o.goodput ? nlohmann::json(m.request_goodput) : nlohmann::json(nullptr);
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  auto& input_lens = j["input_lens"] = nlohmann::json::array();
  auto& ttfts = j["ttfts"] = nlohmann::json::array();
  auto& itls = j["itls"] = nlohmann::json::array();
  auto& texts = j["generated_texts"] = nlohmann::json::array();
  auto& errors = j["errors"] = nlohmann::json::array();
  for (const RequestOutcome& r : outcomes) {
    input_lens.push_back(r.prompt_len);
    ttfts.push_back(r.ttft_s);
    itls.push_back(r.itl_s);
    texts.push_back(r.generated_text);
    errors.push_back(r.error);
  }
  j["output_lens"] = m.output_lens;
  for (const MetricSection& s : kSections) {
    if (!selected(o, s.key)) continue;
    const MetricStats& st = m.*s.stats;
    j[fmt::format("mean_{}_ms", s.key)] = st.mean_ms;
    j[fmt::format("median_{}_ms", s.key)] = st.median_ms;
    j[fmt::format("std_{}_ms", s.key)] = st.std_ms;
    for (const auto& [p, v] : st.percentiles_ms)
      j[fmt::format("p{}_{}_ms", percentile_word(p), s.key)] = v;
  }
  return j;
}

}  // namespace serval::clients
