#include "clients/bench_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "base/clock.h"
#include "base/error.h"
#include "clients/http_client.h"
#include "clients/progress.h"

namespace serval::clients {
namespace {

// A chat chunk that only announces the reply's role: not a token (servers that send it before
// the first token would otherwise report a time to first token of ~0).
bool is_role_only(const nlohmann::json& choice) {
  const auto d = choice.find("delta");
  if (d == choice.end() || !d->is_object() || !d->contains("role")) return false;
  for (const auto& [key, value] : d->items())
    if (key != "role" && !(value.is_null() || value == "")) return false;
  return choice.value("finish_reason", nlohmann::json()).is_null();
}

// Why a response failed before its body was read: the transport's error, or the HTTP status with
// the OpenAI error's message (else the body); empty for a 200.
std::string transport_failure(const HttpResponse& r) {
  if (!r.error.empty()) return r.error;
  if (r.status == 200) return {};
  std::string msg = r.body;
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string())
    msg = j["error"]["message"].get<std::string>();
  return fmt::format("HTTP {}: {:.300}", r.status, msg);
}

// Streaming state of one request while its SSE events arrive.
struct Live {
  RequestOutcome* out = nullptr;
  double last_chunk_s = 0;
  int content_chunks = 0;
  std::optional<int> usage_tokens;
  std::optional<int> usage_prompt_tokens;
  bool done_marker = false;  // saw "data: [DONE]"
  std::string parse_error;

  void on_event(std::string_view data, double t) {
    if (data == "[DONE]") {
      done_marker = true;
      return;
    }
    nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      if (parse_error.empty()) parse_error = fmt::format("malformed SSE chunk: {:.200}", data);
      return;
    }
    auto choices = j.find("choices");
    if (choices != j.end() && choices->is_array() && !choices->empty() &&
        !is_role_only((*choices)[0])) {
      if (content_chunks == 0) {
        out->ttft_s = t - out->start_s;
      } else {
        out->itl_s.push_back(t - last_chunk_s);
      }
      last_chunk_s = t;
      ++content_chunks;
      const auto& c = (*choices)[0];
      if (auto text = c.find("text"); text != c.end() && text->is_string()) {
        out->generated_text += text->get<std::string>();
      } else if (auto d = c.find("delta"); d != c.end() && d->is_object()) {
        if (auto ct = d->find("content"); ct != d->end() && ct->is_string())
          out->generated_text += ct->get<std::string>();
      }
    }
    if (auto usage = j.find("usage"); usage != j.end() && usage->is_object()) {
      if (auto n = usage->find("completion_tokens"); n != usage->end() && n->is_number_integer())
        usage_tokens = n->get<int>();
      if (auto n = usage->find("prompt_tokens"); n != usage->end() && n->is_number_integer())
        usage_prompt_tokens = n->get<int>();
    }
  }

  // What is wrong with a stream that arrived whole: empty when nothing.
  std::string stream_failure() const {
    if (!parse_error.empty()) return parse_error;
    if (content_chunks == 0) return "Never received a valid chunk to calculate TTFT.";
    if (!done_marker) return "stream ended before data: [DONE]";
    return {};
  }

  // An embeddings response: a whole JSON body with the input's embedding.
  void on_embedding_done(HttpResponse&& r, double t) {
    out->end_s = t;
    out->latency_s = out->ttft_s = t - out->start_s;
    out->output_tokens = 0;
    out->error = transport_failure(r);
    const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
    const bool has_data =
        j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty();
    if (out->error.empty() && !has_data)
      out->error = fmt::format("no embedding in the response: {:.200}", r.body);
    out->success = out->error.empty();
    if (out->success && j.contains("usage") && j["usage"].is_object() &&
        j["usage"].value("prompt_tokens", nlohmann::json()).is_number_integer())
      out->prompt_len = j["usage"]["prompt_tokens"].get<int>();
  }

  void on_done(HttpResponse&& r, double t) {
    out->end_s = t;
    out->error = transport_failure(r);
    if (out->error.empty()) out->error = stream_failure();
    out->success = out->error.empty();
    out->latency_s = content_chunks > 0 ? last_chunk_s - out->start_s : t - out->start_s;
    out->output_tokens = usage_tokens.value_or(content_chunks);
  }

  // Chat: the prompt as the server's template made it, when the server says.
  void count_prompt_from_usage() {
    if (usage_prompt_tokens) out->prompt_len = *usage_prompt_tokens;
  }
};

}  // namespace

std::string request_body(const BenchRequest& r, const LoadOptions& o) {
  nlohmann::json j = nlohmann::json::object();
  if (!o.model.empty()) j["model"] = o.model;
  if (o.embeddings) {
    j["input"] = r.prompt;
    return j.dump();
  }
  j["temperature"] = 0.0;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  if (o.chat) {
    j["messages"] = {{{"role", "user"}, {"content", r.text}}};
    j["max_completion_tokens"] = r.output_len;
  } else {
    j["prompt"] = r.prompt;
    j["max_tokens"] = r.output_len;
  }
  if (o.ignore_eos) j["ignore_eos"] = true;
  return j.dump();
}

std::vector<double> arrival_offsets(int n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> t(std::max(0, n), 0.0);
  if (!std::isfinite(rate)) return t;
  if (rate <= 0) throw InvalidArgument("--request-rate must be > 0 (or inf)");
  if (burstiness <= 0) throw InvalidArgument("--burstiness must be > 0");
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  for (int i = 1; i < n; ++i) t[i] = t[i - 1] + gap(rng);
  return t;
}

BenchRun run_requests(const std::vector<BenchRequest>& requests, const LoadOptions& o) {
  const int n = static_cast<int>(requests.size());
  BenchRun run;
  run.outcomes.resize(n);
  std::vector<Live> live(n);
  std::vector<double> arrivals = arrival_offsets(n, o.request_rate, o.burstiness, o.seed);
  const int cap = o.max_concurrency.value_or(std::numeric_limits<int>::max());
  if (cap <= 0) throw InvalidArgument("--max-concurrency must be >= 1");
  HttpDriver driver;
  ErrorLog errors;
  ProgressBar bar("bench", n, o.progress);
  int next = 0, finished = 0;
  double first_dispatch = -1, last_done = 0;
  while (finished < n) {
    double now = now_seconds();
    while (next < n && driver.in_flight() < cap &&
           (first_dispatch < 0 || first_dispatch + arrivals[next] <= now)) {
      int i = next++;
      RequestOutcome& out = run.outcomes[i];
      out.prompt_len = static_cast<int>(requests[i].prompt.size());
      live[i].out = &out;
      HttpRequest req{.url = o.url,
                      .body = request_body(requests[i], o),
                      .timeout_s = o.request_timeout_s,
                      .sse = !o.embeddings};
      out.start_s = now_seconds();
      if (first_dispatch < 0) first_dispatch = out.start_s;
      driver.start(
          req, [&l = live[i]](std::string_view d, double t) { l.on_event(d, t); },
          [&, i](HttpResponse&& r, double t) {
            if (o.embeddings)
              live[i].on_embedding_done(std::move(r), t);
            else
              live[i].on_done(std::move(r), t);
            if (o.chat) live[i].count_prompt_from_usage();
            if (!run.outcomes[i].success) errors.record(run.outcomes[i].error);
            last_done = std::max(last_done, t);
            ++finished;
          });
      now = now_seconds();
    }
    int wait_ms = 50;
    if (next < n && driver.in_flight() < cap) {
      double until = first_dispatch + arrivals[next] - now_seconds();
      wait_ms = std::clamp(static_cast<int>(std::ceil(until * 1000)), 0, 50);
    }
    driver.poll(wait_ms);
    bar.update(finished);
  }
  run.start_s = first_dispatch;
  run.duration_s = n > 0 ? last_done - first_dispatch : 0;
  return run;
}

}  // namespace serval::clients
