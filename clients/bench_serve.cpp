#include "clients/bench_serve.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "clients/bench_dataset.h"
#include "clients/bench_plot.h"
#include "clients/bench_report.h"
#include "clients/bench_runner.h"
#include "clients/bench_text_dataset.h"
#include "clients/http_client.h"

namespace serval::clients {
namespace {

// A text whose tokens stand in for the vocabulary when the server does not report its size.
constexpr const char* kProbeText =
    "The quick brown fox jumps over the lazy dog. Serving benchmarks send many prompts of "
    "random tokens; numbers like 0123456789, punctuation (!?;:), words in other languages "
    "such as Schnell, rapide, veloce, and code like for (int i = 0; i < n; ++i) {} help "
    "cover a broad range of token ids across the vocabulary of a typical tokenizer.";

struct ServerInfo {
  std::string model;
  int vocab_size = 0;
  std::vector<int> pool;
};

ServerInfo discover(const BenchServeOptions& o) {
  ServerInfo info;
  info.model = o.model;
  HttpResponse r = http_get(o.base_url + "/v1/models", 30);
  if (!r.ok()) {
    if (o.model.empty() || !o.vocab_size)
      throw Error(fmt::format("cannot list models at {}/v1/models: {}", o.base_url,
                              r.error.empty() ? fmt::format("HTTP {}", r.status) : r.error));
  } else {
    auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].empty())
      throw Error(fmt::format("{}/v1/models returned no models: {:.200}", o.base_url, r.body));
    const nlohmann::json* entry = &j["data"][0];
    for (const auto& m : j["data"])
      if (m.value("id", "") == o.model) entry = &m;
    if (info.model.empty()) info.model = entry->value("id", "");
    if (entry->contains("vocab_size") && (*entry)["vocab_size"].is_number_integer())
      info.vocab_size = (*entry)["vocab_size"].get<int>();
  }
  if (o.vocab_size) info.vocab_size = *o.vocab_size;
  if (info.vocab_size > 0) return info;
  // Fallback: sample from the ids the server's tokenizer gives a probe text.
  nlohmann::json body = {{"model", info.model}, {"prompt", kProbeText}};
  r = http_post_json(o.base_url + "/tokenize", body.dump(), 30);
  auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (r.ok() && j.is_object() && j.contains("tokens") && j["tokens"].is_array()) {
    std::set<int> ids;
    for (const auto& t : j["tokens"])
      if (t.is_number_integer()) ids.insert(t.get<int>());
    info.pool.assign(ids.begin(), ids.end());
  }
  if (info.pool.empty())
    throw Error(fmt::format(
        "cannot find the vocabulary size: /v1/models has no vocab_size and /tokenize failed ({}); "
        "pass --vocab-size",
        r.error.empty() ? fmt::format("HTTP {}", r.status) : r.error));
  return info;
}

// Token ids of a text by the server's POST /tokenize: as it is, or as a chat user message.
std::vector<int> server_tokens(const BenchServeOptions& o, const std::string& model,
                               const std::string& text, bool as_chat) {
  nlohmann::json body = {{"model", model}};
  if (as_chat) {
    body["messages"] = {{{"role", "user"}, {"content", text}}};
    body["add_generation_prompt"] = true;
  } else {
    body["prompt"] = text;
  }
  const HttpResponse r = http_post_json(o.base_url + "/tokenize", body.dump(), 60);
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!r.ok() || !j.is_object() || !j.contains("tokens") || !j["tokens"].is_array())
    throw Error(fmt::format("cannot tokenize a dataset prompt at {}/tokenize: {:.200}", o.base_url,
                            r.error.empty() ? r.body : r.error));
  return j["tokens"].get<std::vector<int>>();
}

// The text of token ids by the server's POST /detokenize (random prompts sent as chat).
std::string server_text(const BenchServeOptions& o, const std::string& model,
                        const std::vector<int>& ids) {
  const nlohmann::json body = {{"model", model}, {"tokens", ids}};
  const HttpResponse r = http_post_json(o.base_url + "/detokenize", body.dump(), 60);
  const auto j = nlohmann::json::parse(r.body, nullptr, false);
  if (!r.ok() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
    throw Error(fmt::format("cannot detokenize a random prompt at {}/detokenize: {:.200}",
                            o.base_url, r.error.empty() ? r.body : r.error));
  return j["prompt"].get<std::string>();
}

std::vector<BenchRequest> dataset_requests(const BenchServeOptions& o, const ServerInfo& info,
                                           bool chat) {
  if (o.dataset_name == "random") {
    std::vector<BenchRequest> requests = random_requests({.num_prompts = o.num_prompts,
                                                          .input_len = o.random_input_len,
                                                          .output_len = o.random_output_len,
                                                          .range_ratio = o.random_range_ratio,
                                                          .prefix_len = o.random_prefix_len,
                                                          .seed = o.seed},
                                                         info.vocab_size, info.pool);
    if (chat)  // a chat message is text: the ids' text, as vLLM sends random prompts
      for (BenchRequest& r : requests) r.text = server_text(o, info.model, r.prompt);
    return requests;
  }
  const bool sharegpt = o.dataset_name == "sharegpt";
  TextDatasetOptions d{
      .num_prompts = o.num_prompts,
      .output_len = sharegpt ? o.sharegpt_output_len : std::optional<int>(o.custom_output_len),
      // Embeddings take the text as it is: no chat template around it.
      .chat_template = !sharegpt && !o.skip_chat_template && o.backend != "openai-embeddings",
      .sharegpt_filter = sharegpt,
      .seed = o.seed};
  return text_requests(
      sharegpt ? read_sharegpt_dataset(o.dataset_path) : read_custom_dataset(o.dataset_path), d,
      [&](const std::string& text, bool as_chat) {
        return server_tokens(o, info.model, text, as_chat);
      });
}

std::string rate_word(double rate) {  // as Python prints a float: 10.0, 2.5, inf
  if (!std::isfinite(rate)) return "inf";
  if (rate == std::floor(rate)) return fmt::format("{:.1f}", rate);
  return fmt::format("{}", rate);
}

}  // namespace

GoodputSlo parse_goodput(const std::vector<std::string>& items) {
  GoodputSlo slo;
  for (const std::string& item : items) {
    auto colon = item.find(':');
    if (colon == std::string::npos)
      throw InvalidArgument(fmt::format("--goodput item '{}' is not KEY:MS", item));
    std::string key = item.substr(0, colon);
    double ms = 0;
    try {
      size_t used = 0;
      ms = std::stod(item.substr(colon + 1), &used);
      if (used != item.size() - colon - 1) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      throw InvalidArgument(fmt::format("--goodput item '{}': value is not a number", item));
    }
    if (ms < 0) throw InvalidArgument(fmt::format("--goodput item '{}': negative value", item));
    if (key == "ttft")
      slo.ttft_ms = ms;
    else if (key == "tpot")
      slo.tpot_ms = ms;
    else if (key == "e2el")
      slo.e2el_ms = ms;
    else
      throw InvalidArgument(fmt::format("--goodput key '{}' is not one of ttft, tpot, e2el", key));
  }
  return slo;
}

namespace {

// Numeric options that the dataset and load generator would refuse only after connecting (or,
// for a count, silently run with).
void check_numbers(const BenchServeOptions& o) {
  const auto fail = [](const std::string& what) { throw InvalidArgument(what); };
  if (o.num_prompts < 1) fail(fmt::format("--num-prompts must be >= 1, got {}", o.num_prompts));
  if (o.random_input_len < 0)
    fail(fmt::format("--random-input-len must be >= 0, got {}", o.random_input_len));
  if (o.random_output_len < 1)
    fail(fmt::format("--random-output-len must be >= 1, got {}", o.random_output_len));
  if (o.random_prefix_len < 0)
    fail(fmt::format("--random-prefix-len must be >= 0, got {}", o.random_prefix_len));
  if (!(o.random_range_ratio >= 0 && o.random_range_ratio < 1))
    fail(fmt::format("--random-range-ratio must be in [0, 1), got {}", o.random_range_ratio));
  if (!(o.request_rate > 0))
    fail(fmt::format("--request-rate must be > 0 (or inf), got {}", o.request_rate));
  if (!(o.burstiness > 0)) fail(fmt::format("--burstiness must be > 0, got {}", o.burstiness));
  if (o.max_concurrency && *o.max_concurrency < 1)
    fail(fmt::format("--max-concurrency must be >= 1, got {}", *o.max_concurrency));
  if (o.num_warmups < 0) fail(fmt::format("--num-warmups must be >= 0, got {}", o.num_warmups));
  if (o.custom_output_len < 1)
    fail(fmt::format("--custom-output-len must be >= 1, got {}", o.custom_output_len));
  if (o.sharegpt_output_len && *o.sharegpt_output_len < 1)
    fail(fmt::format("--sharegpt-output-len must be >= 1, got {}", *o.sharegpt_output_len));
  if (!(o.request_timeout_s > 0))
    fail(fmt::format("--request-timeout must be > 0 seconds, got {}", o.request_timeout_s));
}

}  // namespace

// The endpoint path of the run, from --backend and --endpoint; throws InvalidArgument when they
// disagree (a completions body sent to a chat endpoint or the other way round).
std::string resolve_endpoint(const BenchServeOptions& o) {
  if (o.backend != "openai" && o.backend != "vllm" && o.backend != "openai-chat" &&
      o.backend != "openai-embeddings")
    throw InvalidArgument(
        fmt::format("--backend {}: serval has openai, vllm (completions), "
                    "openai-chat and openai-embeddings",
                    o.backend));
  const bool chat = o.backend == "openai-chat";
  if (o.backend == "openai-embeddings") {
    if (o.endpoint.empty()) return "/v1/embeddings";
    if (!o.endpoint.ends_with("embeddings"))
      throw InvalidArgument(
          fmt::format("--backend openai-embeddings needs an endpoint ending in embeddings, got {}",
                      o.endpoint));
    return o.endpoint;
  }
  if (o.endpoint.empty()) return chat ? "/v1/chat/completions" : "/v1/completions";
  const bool chat_path = o.endpoint.ends_with("chat/completions");
  if (chat && !chat_path)
    throw InvalidArgument(fmt::format(
        "--backend openai-chat needs an endpoint ending in chat/completions, got {}", o.endpoint));
  if (!chat && chat_path)
    throw InvalidArgument(
        fmt::format("--endpoint {} takes chat requests: add --backend openai-chat", o.endpoint));
  return o.endpoint;
}

int bench_serve(const BenchServeOptions& o) {
  check_numbers(o);
  const std::string endpoint = resolve_endpoint(o);
  const bool chat = o.backend == "openai-chat";
  if (chat && o.skip_chat_template)
    throw InvalidArgument(
        "--skip-chat-template with --backend openai-chat: the server applies the chat template");
  if (o.dataset_name != "random" && o.dataset_name != "custom" && o.dataset_name != "sharegpt")
    throw InvalidArgument(
        fmt::format("--dataset-name {}: serval has random, custom and sharegpt", o.dataset_name));
  if (o.dataset_name != "random" && o.dataset_path.empty())
    throw InvalidArgument(fmt::format("--dataset-name {} needs --dataset-path", o.dataset_name));
  for (const std::string& m : o.percentile_metrics)
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el")
      throw InvalidArgument(fmt::format("--percentile-metrics: unknown metric '{}'", m));
  for (double p : o.metric_percentiles)
    if (!(p > 0 && p < 100))
      throw InvalidArgument(fmt::format("--metric-percentiles: {} is not in (0, 100)", p));
  GoodputSlo slo = parse_goodput(o.goodput);
  if (o.plot && !gnuplot_available())  // say so before the run, not after it
    throw Error(
        "--plot needs gnuplot, which is not installed (Debian: apt-get install gnuplot-nox)");

  ServerInfo info = discover(o);
  const std::vector<BenchRequest> requests = dataset_requests(o, info, chat);
  const bool embeddings = o.backend == "openai-embeddings";
  LoadOptions load{.url = o.base_url + endpoint,
                   .model = info.model,
                   .chat = chat,
                   .embeddings = embeddings,
                   .ignore_eos = o.ignore_eos,
                   .request_rate = o.request_rate,
                   .burstiness = o.burstiness,
                   .max_concurrency = o.max_concurrency,
                   .seed = o.seed,
                   .request_timeout_s = o.request_timeout_s,
                   .progress = !o.disable_tqdm};

  fmt::print("Model: {}\n", info.model);
  if (o.num_warmups > 0 && !requests.empty()) {
    fmt::print("Warming up with {} requests...\n", o.num_warmups);
    std::vector<BenchRequest> warm;
    for (int i = 0; i < o.num_warmups; ++i) warm.push_back(requests[i % requests.size()]);
    LoadOptions wl = load;
    wl.request_rate = std::numeric_limits<double>::infinity();
    run_requests(warm, wl);
  }
  fmt::print("Traffic request rate: {}\nBurstiness factor: {}{}\nMaximum request concurrency: {}\n",
             rate_word(o.request_rate), rate_word(o.burstiness),
             o.burstiness == 1 ? " (Poisson process)" : " (Gamma distribution)",
             o.max_concurrency ? std::to_string(*o.max_concurrency) : "None");
  std::fflush(stdout);

  BenchRun run = run_requests(requests, load);
  std::vector<double> ps = o.metric_percentiles;
  BenchMetrics m = compute_metrics(run.outcomes, run.start_s, run.duration_s, ps, slo);
  ReportOptions ro{.max_concurrency = o.max_concurrency,
                   .request_rate = o.request_rate,
                   .goodput = slo.any(),
                   .percentile_metrics = o.percentile_metrics,
                   .embeddings = embeddings};
  if (embeddings) ro.percentile_metrics = {"e2el"};  // a whole response: no token timings
  fmt::print("{}", format_report(m, ro));
  std::fflush(stdout);

  std::time_t now = std::time(nullptr);
  std::string date = fmt::format("{:%Y%m%d-%H%M%S}", fmt::localtime(now));
  std::string base_model = info.model.substr(info.model.rfind('/') + 1);
  std::string stem =
      o.result_filename.empty()
          ? fmt::format("serval-{}qps{}-{}-{}", rate_word(o.request_rate),
                        o.max_concurrency ? fmt::format("-concurrency{}", *o.max_concurrency) : "",
                        base_model, date)
          : std::filesystem::path(o.result_filename).stem().string();
  if (o.save_result) {
    nlohmann::json header = {
        {"date", date},
        {"backend", o.backend},
        {"endpoint_type", o.backend},
        {"label", nullptr},
        {"model_id", info.model},
        {"tokenizer_id", info.model},
        {"num_prompts", o.num_prompts},
        {"request_rate",
         std::isfinite(o.request_rate) ? nlohmann::json(o.request_rate) : nlohmann::json("inf")},
        {"burstiness", o.burstiness},
        {"max_concurrency",
         o.max_concurrency ? nlohmann::json(*o.max_concurrency) : nlohmann::json(nullptr)}};
    std::filesystem::create_directories(o.result_dir);
    std::string name = o.result_filename.empty() ? stem + ".json" : o.result_filename;
    std::filesystem::path path = std::filesystem::path(o.result_dir) / name;
    std::ofstream f(path);
    f << result_json(header, m, run.outcomes, ro).dump(2) << "\n";
    if (!f) throw Error(fmt::format("cannot write {}", path.string()));
    fmt::print(stderr, "Saved the results to {}\n", path.string());
  }
  if (o.plot) {
    std::filesystem::create_directories(o.result_dir);
    std::string png = (std::filesystem::path(o.result_dir) / (stem + ".png")).string();
    write_plot(run.outcomes, run.start_s, png);
    fmt::print(stderr, "Saved the plot to {}\n", png);
  }
  if (m.completed == 0 && !run.outcomes.empty()) {
    fmt::print(stderr, "error: all {} requests failed\n", run.outcomes.size());
    return 1;
  }
  return 0;
}

}  // namespace serval::clients
