// The command line of `serval serve`, vLLM-compatible: flag normalization, ignored vLLM flags,
// dotted --compilation-config, suggestions for unknown flags, mapping to the configs.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "runtime/engine.h"
#include "server/server.h"

namespace serval::server {

struct ServeArgs {
  runtime::EngineConfig engine;
  ServerOptions server;
  std::vector<std::string> ignored;  // "--flag (reason)" for the one start-up line
  bool help = false;
  std::string help_text;
};

// Step one, before CLI11: `--x_y` → `--x-y`, `--x=y` split, vLLM flags without meaning here
// dropped into `ignored`, `--compilation-config[.key]` folded into `--cudagraph-mode`, `-tp`
// expanded. Throws InvalidArgument for an unknown flag, naming the nearest known one.
struct PreprocessedArgs {
  std::vector<std::string> args;
  std::vector<std::string> ignored;
};
PreprocessedArgs preprocess_serve_args(const std::vector<std::string>& args);

// The known flag closest to `flag` by edit distance (with its leading dashes).
std::string nearest_flag(std::string_view flag);

// Parses the arguments after `serve`. `env_moe_backend` is SERVAL_MOE_BACKEND, `env_api_key`
// VLLM_API_KEY (the key when --api-key is not given, as vLLM takes it); null if unset.
// Throws InvalidArgument with a message for the user.
ServeArgs parse_serve_args(const std::vector<std::string>& args, const char* env_moe_backend,
                           const char* env_api_key = nullptr);

}  // namespace serval::server
