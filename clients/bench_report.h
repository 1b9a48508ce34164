// The printed result block of `serval bench serve` (SPEC §5, as `vllm bench serve` prints it)
// and its --save-result JSON.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "clients/bench_metrics.h"

namespace serval::clients {

struct ReportOptions {
  std::optional<int> max_concurrency;  // line shown only when set
  double request_rate = 0;             // +inf: all at once (no "configured" line)
  bool goodput = false;                // show "Request goodput (req/s):"
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};  // sections shown
  bool embeddings = false;  // no generated tokens: their lines are left out
};

// The block, lines joined by '\n' with a final '\n': labels padded to 40, one space, the
// value (integers plain, floats with two decimals); headers centered in 50. vLLM pads values
// to 10 on the left too; those trailing blanks are left out, as in the SPEC block.
std::string format_report(const BenchMetrics& m, const ReportOptions& options);

// "99" for 99.0, "99.9" for 99.9: how vLLM names percentiles (P99, p99.9_ttft_ms).
std::string percentile_word(double p);

// The --save-result document: run settings (`header`, merged first), aggregates, and
// per-request arrays input_lens, output_lens, ttfts, itls, generated_texts, errors.
nlohmann::json result_json(const nlohmann::json& header, const BenchMetrics& m,
                           const std::vector<RequestOutcome>& outcomes,
                           const ReportOptions& options);

}  // namespace serval::clients
