// The `serval` command: dispatches to its subcommands.
#include <CLI/CLI.hpp>

#include "apps/commands.h"
#include "base/log.h"

int main(int argc, char** argv) {
  serval::log::init();
  CLI::App app{"serval: an LLM serving engine"};
  app.require_subcommand(1);
  serval::apps::register_tokenize_commands(app);
  serval::apps::register_serve_command(app);
  serval::apps::register_generate_command(app);
  auto* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  serval::apps::register_bench_serve(*bench);
  serval::apps::register_bench_latency(*bench);
  serval::apps::register_bench_moe(*bench);
  serval::apps::register_eval_commands(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
