// `serval serve` without the command line: HTTP server + OpenAI routes over one Engine.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/api_server.h"
#include "server/http_server.h"

namespace serval::server {

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;  // 0: any free port
  int num_http_threads = 4;
  std::vector<std::string> served_model_names;
  std::string api_key;
  int max_logprobs = 20;
  // --enable-auto-tool-choice: the --tool-call-parser format (kNone: off)
  ToolCallParser tool_call_parser = ToolCallParser::kNone;
  ReasoningParser reasoning_parser = ReasoningParser::kNone;  // --reasoning-parser
  bool prompt_tokens_details = false;                         // --enable-prompt-tokens-details
  bool return_tokens_as_token_ids = false;  // --return-tokens-as-token-ids: the requests' default
  bool force_include_usage = false;         // --enable-force-include-usage
  std::string response_role = "assistant";  // --response-role
  CorsPolicy cors;  // --allowed-origins etc.; vLLM's default allows every origin
  size_t max_body_bytes = size_t{32} << 20;
  int read_timeout_s = 60;
};

class Server {
 public:
  Server(runtime::Engine& engine, ServerOptions options);
  ~Server();
  // Starts listening; returns the bound port.
  int start();
  // Stops accepting, aborts in-flight generations, waits up to `grace_s` for their responses
  // to end, then closes every connection. The engine is left running.
  void shutdown(double grace_s = 2.0);
  ApiServer& api() { return *api_; }

 private:
  ServerOptions options_;
  std::unique_ptr<ApiServer> api_;
  std::unique_ptr<HttpServer> http_;
};

// Blocks SIGINT and SIGTERM in the calling thread; threads started afterwards inherit the mask.
// Call before starting the engine and the server.
void block_shutdown_signals();
// Waits for SIGINT or SIGTERM (blocked first by block_shutdown_signals); returns its number.
int wait_for_shutdown_signal();

}  // namespace serval::server
