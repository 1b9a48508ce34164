// Composition of HttpServer and ApiServer, orderly shutdown, signal waiting.
#include "server/server.h"

#include <signal.h>

#include <chrono>
#include <thread>

#include "base/clock.h"
#include "server/api_error.h"

namespace serval::server {

Server::Server(runtime::Engine& engine, ServerOptions options) : options_(std::move(options)) {
  api_ = std::make_unique<ApiServer>(engine, static_cast<const ApiOptions&>(options_));
  HttpServerOptions http;
  http.host = options_.host;
  http.port = options_.port;
  http.uds = options_.uds;
  http.num_threads = options_.num_http_threads;
  http.max_body_bytes = options_.max_body_bytes;
  http.read_timeout_s = options_.read_timeout_s;
  http.cors = options_.cors;
  http.request_id_headers = options_.request_id_headers;
  http_ = std::make_unique<HttpServer>(
      http,
      [api = api_.get()](HttpRequest req, std::shared_ptr<Responder> res) {
        api->handle(std::move(req), std::move(res));
      },
      [](int status, const std::string& message) { return error_json(status, message); });
}

Server::~Server() {
  shutdown(0.0);
}

int Server::start() {
  return http_->start();
}

void Server::shutdown(double grace_s) {
  if (!http_) return;
  http_->stop_accepting();
  api_->abort_all();
  double deadline = now_seconds() + grace_s;
  while (api_->num_in_flight() > 0 && now_seconds() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // Let the last response bytes leave before the connections close.
  if (grace_s > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  http_->stop();
  http_.reset();
}

void block_shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int wait_for_shutdown_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  while (sigwait(&set, &sig) != 0) {
  }
  return sig;
}

}  // namespace serval::server
