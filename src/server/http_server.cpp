// The only translation unit that includes Beast: sessions, acceptor and I/O threads.
#include <utility>  // first: Boost 1.74 + g++ 12 coroutine headers need it

#include "server/http_server.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "server/random_id.h"

namespace serval::server {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
// TCP or a Unix domain socket (--uds), one socket type for both.
using Protocol = asio::generic::stream_protocol;
using Socket = Protocol::socket;

class Session;

// State every session shares with the server; sessions keep it alive.
struct Shared {
  HttpServerOptions options;
  HttpHandler handler;
  ErrorBodyFn error_body;
  std::mutex mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;
};

std::string status_line(int status) {
  auto reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n";
}

// One connection. Every member runs on the connection's strand.
class Session final : public Responder, public std::enable_shared_from_this<Session> {
 public:
  Session(Socket socket, std::shared_ptr<Shared> shared)
      : stream_(std::move(socket)), shared_(std::move(shared)) {}

  ~Session() override {
    std::lock_guard lock(shared_->mu);
    shared_->sessions.erase(this);
  }

  void start() {
    {
      std::lock_guard lock(shared_->mu);
      shared_->sessions[this] = weak_from_this();
    }
    asio::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  void close_from_server() {
    asio::post(stream_.get_executor(), [self = shared_from_this()] { self->close(); });
  }

  // Responder
  void send(int status, const std::string& content_type, std::string body) override {
    if (closed_ || ended_ || streaming_) return;
    std::string head = status_line(status) + extra_headers_;
    head += "Content-Type: " + content_type + "\r\n";
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    ended_ = true;
    enqueue(head_only_ ? std::move(head) : head + body);  // HEAD: same headers, no body
  }

  void start_stream(const std::string& content_type) override {
    if (closed_ || ended_ || streaming_) return;
    streaming_ = true;
    std::string head = status_line(200) + extra_headers_;
    head += "Content-Type: " + content_type + "\r\n";
    head += "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    enqueue(std::move(head));
  }

  void write_chunk(std::string data) override {
    if (closed_ || ended_ || !streaming_ || data.empty()) return;
    char size[32];
    int len = std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    data.insert(0, size, static_cast<size_t>(len));
    data += "\r\n";
    enqueue(std::move(data));
  }

  void end_stream() override {
    if (closed_ || ended_ || !streaming_) return;
    ended_ = true;
    enqueue("0\r\n\r\n");
  }

  void on_disconnect(std::function<void()> fn) override { disconnect_fn_ = std::move(fn); }

  void post(std::function<void()> fn) override {
    asio::post(stream_.get_executor(), std::move(fn));
  }

 private:
  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(shared_->options.max_body_bytes);
    parser_->header_limit(static_cast<uint32_t>(shared_->options.max_header_bytes));
    stream_.expires_after(std::chrono::seconds(shared_->options.read_timeout_s));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // A client that sent "Expect: 100-continue" (curl does for large bodies) waits for an interim
  // "100 Continue" before it sends the body; without it, it waits a second and sends anyway.
  // Headers that fail (a body over the limit by its Content-Length) are answered at once.
  void on_header(beast::error_code ec) {
    if (closed_) return;
    if (ec || parser_->is_done()) return on_read(ec);
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(kContinue),
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          if (ec) return self->on_read(ec);
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (closed_) return;
    if (ec) {
      stream_.expires_never();
      keep_alive_ = false;
      if (ec == http::error::body_limit) {
        reply_error(413, "request body exceeds the limit of " +
                             std::to_string(shared_->options.max_body_bytes) + " bytes");
      } else if (ec == http::error::header_limit) {
        reply_error(431, "request headers exceed the limit");
      } else if (ec.category() == http::make_error_code(http::error::end_of_stream).category() &&
                 ec != http::error::end_of_stream && ec != http::error::partial_message) {
        reply_error(400, "malformed HTTP request: " + ec.message());
      } else {
        close();
      }
      return;
    }
    stream_.expires_never();
    auto msg = parser_->release();
    keep_alive_ = msg.keep_alive();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    // HEAD is GET without the body (RFC 9110 9.3.2): route it as GET, drop the body in send().
    head_only_ = msg.method() == http::verb::head;
    if (head_only_) req.method = "GET";
    std::string target(msg.target());
    req.path = target.substr(0, target.find('?'));
    req.authorization = std::string(msg[http::field::authorization]);
    req.request_id = std::string(msg["X-Request-Id"]);
    req.body = std::move(msg.body());
    req.arrival_s = now_seconds();
    in_response_ = true;
    if (answer_cors(msg)) return;
    if (shared_->options.request_id_headers)
      extra_headers_ +=
          header_lines({{"X-Request-Id", req.request_id.empty() ? random_id("") : req.request_id}});
    try {
      shared_->handler(std::move(req), shared_from_this());
    } catch (const std::exception& e) {
      log::error("HTTP handler threw: {}", e.what());
      if (!streaming_) send(500, "application/json", shared_->error_body(500, e.what()));
    }
    if (in_response_ && !ended_ && !watching_) start_watch();
  }

  // CORS (cors.h): a preflight is answered here (true); any other request from an Origin gets
  // the allow headers on its response.
  bool answer_cors(const http::request<http::string_body>& msg) {
    const std::optional<CorsPolicy>& policy = shared_->options.cors;
    const std::string_view origin = msg[http::field::origin];
    if (!policy || origin.empty()) return false;
    const std::string_view method = msg[http::field::access_control_request_method];
    if (msg.method() == http::verb::options && !method.empty()) {
      const CorsPreflight answer =
          cors_preflight(*policy, origin, method, msg[http::field::access_control_request_headers]);
      extra_headers_ = header_lines(answer.headers);
      send(answer.status, "text/plain; charset=utf-8", answer.body);
      return true;
    }
    extra_headers_ =
        header_lines(cors_response_headers(*policy, origin, msg.count(http::field::cookie) > 0));
    return false;
  }

  static std::string header_lines(const HeaderList& headers) {
    std::string out;
    for (const auto& [name, value] : headers) {
      // Values come from the request (an origin, requested headers): no line breaks through.
      if (value.find_first_of("\r\n") != std::string::npos) continue;
      out += name + ": " + value + "\r\n";
    }
    return out;
  }

  void reply_error(int status, const std::string& message) {
    in_response_ = true;
    send(status, "application/json", shared_->error_body(status, message));
  }

  // An outstanding read while a response is produced: EOF or reset means the client left.
  // Bytes that arrive (a pipelined request) stay in buffer_ for the next do_read().
  void start_watch() {
    watching_ = true;
    stream_.async_read_some(
        buffer_.prepare(4096),
        [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_watch(ec, n); });
  }

  void on_watch(beast::error_code ec, size_t n) {
    watching_ = false;
    buffer_.commit(n);
    if (closed_) return;
    if (!in_response_) {  // the response ended and cancelled this read
      if (ec && ec != asio::error::operation_aborted) return close();
      return do_read();
    }
    if (ec) return client_gone();
    if (buffer_.size() < (size_t{1} << 20)) start_watch();
  }

  void client_gone() {
    if (closed_) return;
    auto fn = std::move(disconnect_fn_);
    disconnect_fn_ = nullptr;
    close();
    if (fn && in_response_) fn();
  }

  void enqueue(std::string data) {
    queue_.push_back(std::move(data));
    if (!writing_) do_write();
  }

  void do_write() {
    writing_ = true;
    asio::async_write(
        stream_, asio::buffer(queue_.front()),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (closed_) return;
    if (ec) return client_gone();
    queue_.pop_front();
    if (!queue_.empty()) return do_write();
    if (ended_) finish_response();
  }

  void finish_response() {
    in_response_ = false;
    extra_headers_.clear();
    head_only_ = false;
    ended_ = false;
    streaming_ = false;
    disconnect_fn_ = nullptr;
    if (!keep_alive_) return close();
    if (watching_) {
      beast::error_code ignored;
      stream_.socket().cancel(ignored);  // on_watch continues with do_read()
    } else {
      do_read();
    }
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(Socket::shutdown_send, ignored);
    stream_.socket().close(ignored);
  }

  // Header lines of the current response (CORS, X-Request-Id), "\r\n"-ended.
  std::string extra_headers_;
  beast::basic_stream<Protocol> stream_;
  std::shared_ptr<Shared> shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> queue_;
  std::function<void()> disconnect_fn_;
  bool keep_alive_ = true;
  bool in_response_ = false;  // a request was handed to the handler and its response not done
  bool ended_ = false;        // the whole response is queued
  bool streaming_ = false;
  bool head_only_ = false;  // the request was HEAD
  bool writing_ = false;
  bool watching_ = false;
  bool closed_ = false;
};

}  // namespace

struct HttpServer::Impl {
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  asio::basic_socket_acceptor<Protocol> acceptor{ioc};
  std::vector<std::thread> threads;
  bool stopped = false;

  void do_accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, Socket s) {
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
        log::warn("accept failed: {}", ec.message());
      } else {
        beast::error_code ignored;
        if (shared->options.uds.empty()) s.set_option(tcp::no_delay(true), ignored);
        std::make_shared<Session>(std::move(s), shared)->start();
      }
      do_accept();
    });
  }
};

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler, ErrorBodyFn error_body)
    : impl_(std::make_unique<Impl>()) {
  impl_->shared->options = std::move(options);
  impl_->shared->handler = std::move(handler);
  impl_->shared->error_body = std::move(error_body);
}

HttpServer::~HttpServer() {
  stop();
}

namespace {

// The port of a bound TCP endpoint (IPv4 or IPv6).
int bound_port(const Protocol::endpoint& ep) {
  const sockaddr* sa = ep.data();
  if (sa->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(sa)->sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6*>(sa)->sin6_port);
}

}  // namespace

int HttpServer::start() {
  const auto& opt = impl_->shared->options;
  beast::error_code ec;
  Protocol::endpoint ep;
  std::string where;
  if (!opt.uds.empty()) {
    // A socket file left by an earlier server is replaced; any other file is not.
    std::error_code fs_ec;
    if (std::filesystem::is_socket(opt.uds, fs_ec)) std::filesystem::remove(opt.uds, fs_ec);
    ep = asio::local::stream_protocol::endpoint(opt.uds);
    where = "unix:" + opt.uds;
  } else {
    tcp::resolver resolver(impl_->ioc);
    auto results = resolver.resolve(opt.host, std::to_string(opt.port), ec);
    if (ec || results.empty())
      throw InvalidArgument("cannot resolve host '" + opt.host + "': " + ec.message());
    ep = results.begin()->endpoint();
    where = opt.host + ":" + std::to_string(opt.port);
  }
  impl_->acceptor.open(ep.protocol(), ec);
  if (!ec && opt.uds.empty())
    impl_->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(ep, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw Error("cannot listen on " + where + ": " + ec.message());
  const int port = opt.uds.empty() ? bound_port(impl_->acceptor.local_endpoint()) : 0;
  impl_->work.emplace(impl_->ioc.get_executor());
  impl_->do_accept();
  for (int i = 0; i < std::max(1, opt.num_threads); ++i)
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
  return port;
}

void HttpServer::stop_accepting() {
  asio::post(impl_->ioc, [this] {
    beast::error_code ignored;
    impl_->acceptor.close(ignored);
  });
}

void HttpServer::stop() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  if (!impl_->threads.empty()) {
    stop_accepting();
    std::vector<std::shared_ptr<Session>> live;
    {
      std::lock_guard lock(impl_->shared->mu);
      for (auto& [ptr, weak] : impl_->shared->sessions)
        if (auto s = weak.lock()) live.push_back(std::move(s));
    }
    for (auto& s : live) s->close_from_server();
    live.clear();
    impl_->work.reset();
    impl_->ioc.stop();
    for (auto& t : impl_->threads) t.join();
    impl_->threads.clear();
    if (const std::string& uds = impl_->shared->options.uds; !uds.empty()) {
      std::error_code ignored;
      std::filesystem::remove(uds, ignored);
    }
  }
}

}  // namespace serval::server
