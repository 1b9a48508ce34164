// HTTP client on libcurl: a single-threaded driver of many concurrent transfers (multi
// interface) with per-event timestamps for SSE streams, and blocking one-shot helpers.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>

namespace serval::clients {

struct HttpRequest {
  std::string url;
  std::string body;        // JSON body of a POST; empty: GET
  double timeout_s = 600;  // whole transfer, connect included
  bool sse = false;        // parse a 200 response as SSE, delivering events instead of the body
};

struct HttpResponse {
  long status = 0;    // HTTP status; 0 when none arrived
  std::string body;   // response body (for SSE with status 200: empty, events went out)
  std::string error;  // transport error (refused, timeout, dropped); empty if the transfer ended
  bool ok() const { return error.empty() && status == 200; }
};

// Owns a curl multi handle. Not thread-safe: call everything from one thread.
class HttpDriver {
 public:
  // `t_s` is the steady-clock time (serval::now_seconds) at which the bytes were received.
  using OnEvent = std::function<void(std::string_view data, double t_s)>;
  using OnDone = std::function<void(HttpResponse&& response, double t_s)>;

  HttpDriver();
  ~HttpDriver();
  HttpDriver(const HttpDriver&) = delete;
  HttpDriver& operator=(const HttpDriver&) = delete;

  // Starts a transfer now. `on_event` gets each SSE event's data (only with req.sse and
  // status 200); `on_done` is called exactly once, from poll().
  void start(const HttpRequest& req, OnEvent on_event, OnDone on_done);

  // Waits up to `timeout_ms` for network activity (returns early on any), moves all
  // transfers forward and runs their callbacks.
  void poll(int timeout_ms);

  int in_flight() const { return static_cast<int>(live_.size()); }

 private:
  struct Transfer;
  void perform();

  void* multi_ = nullptr;               // CURLM*
  std::unordered_set<Transfer*> live_;  // owned: started and not yet done
};

// Blocking helpers (one transfer each); transport errors come back in `error`, never thrown.
HttpResponse http_get(const std::string& url, double timeout_s);
HttpResponse http_post_json(const std::string& url, const std::string& body, double timeout_s);

// Downloads `url` to `path` (through a temporary file, renamed when complete). Throws
// serval::LoadError saying what failed (offline, HTTP status, disk).
void download_file(const std::string& url, const std::string& path, double timeout_s);

}  // namespace serval::clients
