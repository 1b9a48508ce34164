// `serval eval gsm8k`: flags of vLLM's gsm8k_eval.py, mapped onto clients::eval_gsm8k.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <memory>

#include "apps/commands.h"
#include "clients/gsm8k.h"

namespace serval::apps {
namespace {

struct Gsm8kFlags {
  clients::Gsm8kOptions o;
  std::string host = "http://127.0.0.1";
  int port = 8000;
  std::string base_url;
  bool disable_tqdm = false;
};

}  // namespace

void register_eval_commands(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Accuracy evaluations against a running server");
  eval->require_subcommand(1);
  auto flags = std::make_shared<Gsm8kFlags>();
  auto& o = flags->o;
  CLI::App* cmd = eval->add_subcommand("gsm8k", "GSM8K few-shot accuracy over /v1/completions");
  cmd->add_option("--base-url", flags->base_url, "Server URL (overrides --host/--port)");
  cmd->add_option("--host", flags->host, "Server host (http:// optional)")->capture_default_str();
  cmd->add_option("--port", flags->port)->capture_default_str();
  cmd->add_option("--num-questions", o.num_questions, "Default: all");
  cmd->add_option("--num-shots", o.num_shots)->capture_default_str();
  cmd->add_option("--max-tokens", o.max_tokens)->capture_default_str();
  cmd->add_option("--max-concurrency", o.max_concurrency)->capture_default_str();
  cmd->add_option("--data-dir", o.data_dir,
                  "Folder with train.jsonl and test.jsonl (default: ~/.cache/serval/gsm8k, "
                  "downloaded)");
  cmd->add_option("--seed", o.seed)->capture_default_str();
  cmd->add_option("--temperature", o.temperature)->capture_default_str();
  cmd->add_option("--model", o.model, "Sent as \"model\" only when given");
  cmd->add_option("--save-results", o.save_results, "Write per-question JSON here");
  cmd->add_option("--request-timeout", o.request_timeout_s, "Seconds per request")
      ->capture_default_str();
  cmd->add_flag("--disable-tqdm", flags->disable_tqdm, "No progress bar");
  cmd->callback([flags] {
    auto& f = *flags;
    int rc = 0;
    try {
      std::string host = f.host;
      if (host.find("://") == std::string::npos) host = "http://" + host;
      f.o.base_url = !f.base_url.empty() ? f.base_url : fmt::format("{}:{}", host, f.port);
      while (!f.o.base_url.empty() && f.o.base_url.back() == '/') f.o.base_url.pop_back();
      f.o.progress = !f.disable_tqdm;
      clients::Gsm8kResult r = clients::eval_gsm8k(f.o);
      if (r.num_questions > 0 && r.num_failed_requests == r.num_questions) {
        fmt::print(stderr, "error: all {} requests failed\n", r.num_questions);
        rc = 1;
      }
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", e.what());
      rc = 1;
    }
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace serval::apps
