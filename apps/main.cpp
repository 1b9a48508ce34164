// The `serval` command: dispatches to its subcommands.
#include <CLI/CLI.hpp>

#include "base/log.h"

int main(int argc, char** argv) {
  serval::log::init();
  CLI::App app{"serval: an LLM serving engine"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
