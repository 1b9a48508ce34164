// `serval serve`: loads the engine and serves the OpenAI-compatible HTTP API until SIGINT/SIGTERM.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "apps/commands.h"
#include "base/error.h"
#include "base/log.h"
#include "runtime/engine.h"
#include "runtime/multi_node.h"
#include "server/serve_args.h"
#include "server/server.h"

namespace serval::apps {
namespace {

int run_serve(const std::vector<std::string>& args) {
  server::ServeArgs parsed;
  try {
    parsed = server::parse_serve_args(args, std::getenv("SERVAL_MOE_BACKEND"),
                                      std::getenv("VLLM_API_KEY"));
  } catch (const Error& e) {
    log::error("serve: {}", e.what());
    return 2;
  }
  if (parsed.help) {
    std::cout << parsed.help_text;
    return 0;
  }
  if (!parsed.ignored.empty())
    log::info("ignoring flags that have no meaning in serval: {}", fmt::join(parsed.ignored, "; "));
  // Nodes other than 0 of a multi-node group run node 0's steps and serve no HTTP.
  if (parsed.engine.nnodes > 1 && parsed.engine.node_rank > 0)
    return runtime::run_follower_node(parsed.engine);
  // Engine and I/O threads inherit the blocked mask; only wait_for_shutdown_signal sees them.
  server::block_shutdown_signals();
  std::unique_ptr<runtime::Engine> engine;
  try {
    engine = runtime::Engine::create(parsed.engine);
  } catch (const std::exception& e) {
    log::error("serve: cannot start the engine: {}", e.what());
    return 1;
  }
  const auto& info = engine->info();
  int port = 0;
  server::Server http(*engine, parsed.server);
  try {
    port = http.start();
  } catch (const std::exception& e) {
    log::error("serve: {}", e.what());
    engine->shutdown();
    return 1;
  }
  log::info(
      "serving model {} ({}) from {}: architecture {}, {} parameters, dtype {}, KV cache {} "
      "tokens ({}), device {}, MoE backend {}, max_model_len {}",
      http.api().model_name(), info.served_model_name, info.model_dir, info.architecture,
      info.num_parameters, info.dtype, info.kv_cache_tokens, info.kv_cache_dtype, info.device,
      info.moe_backend.empty() ? "none (dense model)" : info.moe_backend, info.max_model_len);
  // As vLLM says when the generation config changes them: a request that sets none gets these.
  const runtime::SamplingParams& d = info.default_sampling;
  const runtime::SamplingParams none;
  if (d.temperature != none.temperature || d.top_p != none.top_p || d.top_k != none.top_k ||
      d.min_p != none.min_p || d.repetition_penalty != none.repetition_penalty ||
      info.max_new_tokens > 0)
    log::info(
        "default sampling parameters (generation config): temperature {}, top_p {}, top_k {}, "
        "min_p {}, repetition_penalty {}{}",
        d.temperature, d.top_p, d.top_k, d.min_p, d.repetition_penalty,
        info.max_new_tokens > 0 ? fmt::format("; max_tokens at most {}", info.max_new_tokens) : "");
  if (!parsed.server.uds.empty())
    log::info(
        "serval serve listening on unix:{} (e.g. curl --unix-socket {} http://localhost/v1/models)",
        parsed.server.uds, parsed.server.uds);
  else
    log::info("serval serve listening on http://{}:{} (OpenAI API at http://{}:{}/v1)",
              parsed.server.host, port, parsed.server.host, port);
  int sig = server::wait_for_shutdown_signal();
  log::info("received signal {}; shutting down", sig);
  http.shutdown(2.0);
  engine->shutdown();
  log::info("serve: stopped");
  return 0;
}

}  // namespace

void register_serve_command(CLI::App& app) {
  auto* serve = app.add_subcommand(
      "serve", "Serve a model over the OpenAI-compatible HTTP API (flags as in vllm serve)");
  // The serve flags are parsed by server::parse_serve_args (vLLM spellings, ignored flags).
  serve->prefix_command();
  serve->set_help_flag();
  serve->callback([serve] {
    int rc = run_serve(serve->remaining());
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace serval::apps
