// Server-side request metrics and the Prometheus text exposition (format 0.0.4) of /metrics.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace serval::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  // Appends the _bucket/_sum/_count lines of `name` with `labels` (`key="v"` pairs, no braces).
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Thread-safe; observed from the connection strands.
class Metrics {
 public:
  Metrics();
  void observe_ttft(double seconds);
  void observe_inter_token(double seconds);
  void observe_e2e(double seconds);
  void count_finished(const std::string& reason);  // "stop" | "length" | "abort" | "error"

  // The whole /metrics page: engine gauges and counters plus the server's histograms. Every
  // engine metric has a sample for `stats` (the total) and, when there are several replicas
  // (data parallel), one more per replica labelled engine="i" (as vLLM labels its engines).
  std::string render(const runtime::ModelInfo& info, const runtime::EngineStats& stats,
                     const std::vector<runtime::EngineStats>& per_engine = {}) const;

 private:
  mutable std::mutex mu_;
  Histogram ttft_, itl_, e2e_;
  std::map<std::string, uint64_t> finished_;
};

// Escapes a Prometheus label value (backslash, double quote, newline).
std::string escape_label(const std::string& value);

}  // namespace serval::server
