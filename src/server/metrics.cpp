// Prometheus exposition of engine stats and server-measured latencies, with vLLM's buckets.
#include "server/metrics.h"

#include <fmt/format.h>

namespace serval::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    std::string le = i < bounds_.size() ? fmt::format("{}", bounds_[i]) : "+Inf";
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, le, cumulative);
  }
  out += fmt::format("{}_sum{{{}}} {}\n", name, labels, sum_);
  out += fmt::format("{}_count{{{}}} {}\n", name, labels, count_);
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
             1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
            20.0, 40.0, 80.0}),
      e2e_({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
            30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}),
      finished_({{"stop", 0}, {"length", 0}, {"abort", 0}}) {}

void Metrics::observe_ttft(double s) {
  std::lock_guard lock(mu_);
  ttft_.observe(s);
}
void Metrics::observe_inter_token(double s) {
  std::lock_guard lock(mu_);
  itl_.observe(s);
}
void Metrics::observe_e2e(double s) {
  std::lock_guard lock(mu_);
  e2e_.observe(s);
}
void Metrics::count_finished(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++finished_[reason];
}

std::string escape_label(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string Metrics::render(const runtime::ModelInfo& info, const runtime::EngineStats& stats,
                            const std::vector<runtime::EngineStats>& per_engine) const {
  const std::string model = fmt::format("model_name=\"{}\"", escape_label(info.served_model_name));
  std::string out;
  auto header = [&](const char* name, const char* type, const char* help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // One engine metric: the total, then engine="i" per replica when there are several.
  auto engine_metric = [&](const char* name, const char* type, const char* help, auto value_of) {
    header(name, type, help);
    out += fmt::format("{}{{{}}} {}\n", name, model, value_of(stats));
    if (per_engine.size() < 2) return;
    for (size_t i = 0; i < per_engine.size(); ++i)
      out += fmt::format("{}{{{},engine=\"{}\"}} {}\n", name, model, i, value_of(per_engine[i]));
  };
  using S = runtime::EngineStats;
  engine_metric("serval:num_requests_running", "gauge",
                "Number of requests in model execution batches.",
                [](const S& s) { return s.num_running; });
  engine_metric("serval:num_requests_waiting", "gauge",
                "Number of requests waiting to be processed.",
                [](const S& s) { return s.num_waiting; });
  engine_metric("serval:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                [](const S& s) {
                  return s.num_total_blocks > 0
                             ? 1.0 - static_cast<double>(s.num_free_blocks) / s.num_total_blocks
                             : 0.0;
                });
  engine_metric("serval:kv_cache_free_blocks", "gauge", "Free KV-cache blocks.",
                [](const S& s) { return s.num_free_blocks; });
  engine_metric("serval:kv_cache_total_blocks", "gauge", "Total KV-cache blocks.",
                [](const S& s) { return s.num_total_blocks; });
  engine_metric("serval:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                [](const S& s) { return s.prompt_tokens_total; });
  engine_metric("serval:generation_tokens_total", "counter",
                "Number of generation tokens processed.",
                [](const S& s) { return s.generation_tokens_total; });
  engine_metric("serval:num_preemptions_total", "counter", "Cumulative number of preemptions.",
                [](const S& s) { return s.num_preemptions; });
  engine_metric("serval:engine_steps_total", "counter", "Number of engine steps.",
                [](const S& s) { return s.steps_total; });
  engine_metric("serval:engine_step_seconds_total", "counter",
                "Wall time of engine steps (scheduling, model, sampling, outputs) in seconds.",
                [](const S& s) { return s.step_seconds_total; });
  engine_metric("serval:model_execute_seconds_total", "counter",
                "Wall time of the model runner's calls within the steps, in seconds.",
                [](const S& s) { return s.model_seconds_total; });
  engine_metric("serval:prefix_cache_queries_total", "counter",
                "Prefix cache queries, in terms of number of queried tokens.",
                [](const S& s) { return s.prefix_cache_queries; });
  engine_metric("serval:prefix_cache_hits_total", "counter",
                "Prefix cache hits, in terms of number of cached tokens.",
                [](const S& s) { return s.prefix_cache_hits; });
  engine_metric("serval:spec_decode_num_drafts_total", "counter",
                "Speculative decoding: drafts checked (one per request and step).",
                [](const S& s) { return s.spec_decode_num_drafts; });
  engine_metric("serval:spec_decode_num_draft_tokens_total", "counter",
                "Speculative decoding: draft tokens checked.",
                [](const S& s) { return s.spec_decode_num_draft_tokens; });
  engine_metric("serval:spec_decode_num_accepted_tokens_total", "counter",
                "Speculative decoding: draft tokens accepted.",
                [](const S& s) { return s.spec_decode_num_accepted_tokens; });
  if (!info.moe_backend.empty()) {
    header("serval:moe_backend_info", "gauge", "The MoE expert backend in effect.");
    out += fmt::format("serval:moe_backend_info{{{},backend=\"{}\"}} 1\n", model,
                       escape_label(info.moe_backend));
  }
  std::lock_guard lock(mu_);
  header("serval:request_success_total", "counter", "Count of finished requests by reason.");
  for (const auto& [reason, n] : finished_)
    out += fmt::format("serval:request_success_total{{{},finished_reason=\"{}\"}} {}\n", model,
                       escape_label(reason), n);
  header("serval:time_to_first_token_seconds", "histogram",
         "Histogram of time to first token in seconds.");
  ttft_.render(out, "serval:time_to_first_token_seconds", model);
  header("serval:inter_token_latency_seconds", "histogram",
         "Histogram of inter-token latency in seconds.");
  itl_.render(out, "serval:inter_token_latency_seconds", model);
  header("serval:e2e_request_latency_seconds", "histogram",
         "Histogram of end-to-end request latency in seconds.");
  e2e_.render(out, "serval:e2e_request_latency_seconds", model);
  return out;
}

}  // namespace serval::server
