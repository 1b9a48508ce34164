// Async HTTP/1.1 server (Boost.Beast/Asio behind a pimpl): keep-alive, body and header limits,
// timeouts, chunked streaming and client-disconnect detection. Knows nothing about OpenAI.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "server/cors.h"

namespace serval::server {

struct HttpRequest {
  std::string method;         // "GET", "POST", ...
  std::string path;           // request target without the query string
  std::string authorization;  // the Authorization header, empty if absent
  std::string request_id;     // the X-Request-Id header, empty if absent
  std::string body;
  double arrival_s = 0;  // serval::now_seconds() when the request was fully read
};

// The response to one request. All methods except post() must run on the connection's strand
// (the handler is called there, and post() gets you there). Use either send() once, or
// start_stream(), write_chunk()*, end_stream(). Calls after the client left are ignored.
class Responder {
 public:
  virtual ~Responder() = default;
  virtual void send(int status, const std::string& content_type, std::string body) = 0;
  virtual void start_stream(const std::string& content_type) = 0;  // 200, chunked encoding
  virtual void write_chunk(std::string data) = 0;
  virtual void end_stream() = 0;
  // `fn` runs once on the strand if the client disconnects before the response has ended.
  virtual void on_disconnect(std::function<void()> fn) = 0;
  // Runs `fn` on the connection's strand; callable from any thread, never blocks.
  virtual void post(std::function<void()> fn) = 0;
};

// Called on the connection's strand for every complete request.
using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<Responder>)>;

// Builds the body of an error response the HTTP layer makes itself (400 bad HTTP, 413).
using ErrorBodyFn = std::function<std::string(int status, const std::string& message)>;

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 8000;  // 0: any free port
  std::string uds;  // a Unix domain socket's path to listen on instead of host:port
  int num_threads = 4;
  size_t max_body_bytes = size_t{32} << 20;
  size_t max_header_bytes = size_t{64} << 10;
  int read_timeout_s = 60;  // headers + body of a request, and keep-alive idle time
  // Preflights answered here and allow headers added to every response (cors.h); none: no CORS.
  std::optional<CorsPolicy> cors;
  // --enable-request-id-headers: every response carries X-Request-Id, the request's own or a
  // new one.
  bool request_id_headers = false;
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler, ErrorBodyFn error_body);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds, listens and starts the I/O threads. Returns the bound port (0 on a Unix domain
  // socket). Throws serval::Error.
  int start();
  // Stops accepting new connections; open connections keep being served.
  void stop_accepting();
  // Closes every connection and joins the I/O threads.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace serval::server
