// `serval serve` without the command line: HTTP server + OpenAI routes over one Engine.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/api_server.h"
#include "server/http_server.h"

namespace serval::server {

// The API's options (names, key, request policy) and the HTTP layer's.
struct ServerOptions : ApiOptions {
  std::string host = "0.0.0.0";
  int port = 8000;  // 0: any free port
  std::string uds;  // --uds: a Unix domain socket instead of host and port
  int num_http_threads = 4;
  CorsPolicy cors;  // --allowed-origins etc.; vLLM's default allows every origin
  size_t max_body_bytes = size_t{32} << 20;
  int read_timeout_s = 60;
  bool request_id_headers = false;  // --enable-request-id-headers
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
