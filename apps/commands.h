// Registration functions of the serval subcommands, one per file.
#pragma once
#include <CLI/CLI.hpp>

namespace serval::apps {

// Adds "serve" to the existing "bench" subcommand (cmd_bench_serve.cpp).
void register_bench_serve(CLI::App& bench);
// Adds "latency" to the "bench" subcommand (cmd_bench_latency.cpp).
void register_bench_latency(CLI::App& bench);
// Adds "moe" to the "bench" subcommand (cmd_bench_moe.cpp).
void register_bench_moe(CLI::App& bench);
// Adds "eval" with its subcommand "gsm8k" (cmd_eval.cpp).
void register_eval_commands(CLI::App& app);
// Adds "serve", the OpenAI-compatible HTTP server (cmd_serve.cpp).
void register_serve_command(CLI::App& app);
// Adds "generate", one prompt through the engine (cmd_generate.cpp).
void register_generate_command(CLI::App& app);

// Adds "tokenize" and "detokenize" (cmd_tokenize.cpp).
void register_tokenize_commands(CLI::App& app);

}  // namespace serval::apps
