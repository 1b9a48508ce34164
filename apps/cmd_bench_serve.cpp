// `serval bench serve`: flags of `vllm bench serve`, mapped onto clients::bench_serve.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cmath>
#include <memory>
#include <sstream>

#include "apps/commands.h"
#include "base/error.h"
#include "clients/bench_serve.h"

namespace serval::apps {
namespace {

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

double parse_double(const std::string& flag, const std::string& s) {
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(fmt::format("{} {}: not a number", flag, s));
}

struct BenchServeFlags {
  clients::BenchServeOptions o;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string base_url;
  std::string request_rate = "inf";
  int max_concurrency = 0;
  int vocab_size = 0;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
};

}  // namespace

void register_bench_serve(CLI::App& bench) {
  auto flags = std::make_shared<BenchServeFlags>();
  auto& o = flags->o;
  CLI::App* cmd = bench.add_subcommand("serve", "Benchmark a running OpenAI-compatible server");
  cmd->add_option("--base-url", flags->base_url, "Server URL (overrides --host/--port)");
  cmd->add_option("--host", flags->host, "Server host")->capture_default_str();
  cmd->add_option("--port", flags->port, "Server port")->capture_default_str();
  cmd->add_option("--backend", o.backend,
                  "openai or vllm: completions; openai-chat: chat completions, each prompt's text "
                  "as a user message; openai-embeddings: /v1/embeddings of each prompt")
      ->capture_default_str();
  cmd->add_option("--endpoint", o.endpoint,
                  "API path (default: /v1/completions; /v1/chat/completions for openai-chat, "
                  "/v1/embeddings for openai-embeddings)");
  cmd->add_option("--model", o.model, "Model name (default: first of /v1/models)");
  cmd->add_option("--dataset-name", o.dataset_name, "Dataset: random, custom or sharegpt")
      ->capture_default_str();
  cmd->add_option("--dataset-path", o.dataset_path,
                  "custom: a JSONL file of {\"prompt\": ...}; sharegpt: a ShareGPT JSON file");
  cmd->add_option("--custom-output-len", o.custom_output_len)->capture_default_str();
  cmd->add_option("--sharegpt-output-len", o.sharegpt_output_len,
                  "Output tokens of every request (default: each reference reply's)");
  cmd->add_flag("--skip-chat-template", o.skip_chat_template,
                "custom: send prompts as they are, not as chat user messages");
  cmd->add_option("--random-input-len", o.random_input_len)->capture_default_str();
  cmd->add_option("--random-output-len", o.random_output_len)->capture_default_str();
  cmd->add_option("--random-range-ratio", o.random_range_ratio)->capture_default_str();
  cmd->add_option("--random-prefix-len", o.random_prefix_len)->capture_default_str();
  cmd->add_option("--num-prompts", o.num_prompts)->capture_default_str();
  cmd->add_option("--request-rate", flags->request_rate, "Requests/s, or inf")
      ->capture_default_str();
  cmd->add_option("--burstiness", o.burstiness, "Gamma shape of arrivals (1: Poisson)")
      ->capture_default_str();
  cmd->add_option("--max-concurrency", flags->max_concurrency, "Cap on requests in flight");
  cmd->add_flag("--ignore-eos", o.ignore_eos, "Send ignore_eos");
  cmd->add_option("--seed", o.seed)->capture_default_str();
  cmd->add_option("--vocab-size", flags->vocab_size,
                  "Token ids of random prompts in [0, N) (default: from the server)");
  cmd->add_option("--percentile-metrics", flags->percentile_metrics,
                  "Comma-separated of ttft,tpot,itl,e2el")
      ->capture_default_str();
  cmd->add_option("--metric-percentiles", flags->metric_percentiles, "Comma-separated, e.g. 50,99")
      ->capture_default_str();
  cmd->add_option("--goodput", o.goodput, "SLOs as KEY:MS (ttft, tpot, e2el)");
  cmd->add_option("--num-warmups", o.num_warmups)->capture_default_str();
  cmd->add_flag("--save-result", o.save_result, "Write the result JSON");
  cmd->add_option("--result-dir", o.result_dir)->capture_default_str();
  cmd->add_option("--result-filename", o.result_filename);
  cmd->add_flag("--plot", o.plot, "Write a PNG (needs gnuplot)");
  cmd->add_option("--request-timeout", o.request_timeout_s, "Seconds per request")
      ->capture_default_str();
  cmd->add_flag("--disable-tqdm", o.disable_tqdm, "No progress bar");
  cmd->callback([flags] {
    auto& f = *flags;
    int rc = 1;
    try {
      f.o.base_url = !f.base_url.empty() ? f.base_url : fmt::format("http://{}:{}", f.host, f.port);
      while (!f.o.base_url.empty() && f.o.base_url.back() == '/') f.o.base_url.pop_back();
      f.o.request_rate = parse_double("--request-rate", f.request_rate);
      if (f.max_concurrency != 0) f.o.max_concurrency = f.max_concurrency;  // 0: no cap
      if (f.vocab_size > 0) f.o.vocab_size = f.vocab_size;
      f.o.percentile_metrics = split_commas(f.percentile_metrics);
      f.o.metric_percentiles.clear();
      for (const auto& p : split_commas(f.metric_percentiles))
        f.o.metric_percentiles.push_back(parse_double("--metric-percentiles", p));
      rc = clients::bench_serve(f.o);
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", e.what());
      rc = 1;
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace serval::apps
