#include "clients/http_client.h"

#include <curl/curl.h>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "base/clock.h"
#include "base/error.h"
#include "clients/sse.h"

namespace serval::clients {
namespace {

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string curl_error_message(CURLcode code, const char* errbuf) {
  std::string msg = curl_easy_strerror(code);
  if (errbuf[0] != '\0') msg += fmt::format(" ({})", errbuf);
  return msg;
}

}  // namespace

struct HttpDriver::Transfer {
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  bool sse = false;
  SseParser parser;
  OnEvent on_event;
  OnDone on_done;
  HttpResponse response;
  char errbuf[CURL_ERROR_SIZE] = {};

  ~Transfer() {
    if (headers) curl_slist_free_all(headers);
    if (easy) curl_easy_cleanup(easy);
  }

  static size_t on_write(char* data, size_t size, size_t nmemb, void* user) {
    auto* t = static_cast<Transfer*>(user);
    size_t n = size * nmemb;
    if (t->response.status == 0)
      curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->response.status);
    if (t->sse && t->response.status == 200) {
      double now = now_seconds();
      t->parser.feed({data, n}, [&](std::string_view ev) {
        if (t->on_event) t->on_event(ev, now);
      });
    } else {
      t->response.body.append(data, n);
    }
    return n;
  }
};

// Sets the options every transfer shares; `t` must outlive the easy handle's use.
static void configure(CURL* easy, curl_slist*& headers, const HttpRequest& req, char* errbuf) {
  curl_easy_setopt(easy, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(req.timeout_s * 1000));
  curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(easy, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
  if (!req.body.empty()) {
    // "Expect:" off: a server without 100-continue support would stall big bodies for 1 s.
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Expect:");
    curl_easy_setopt(easy, CURLOPT_POST, 1L);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    curl_easy_setopt(easy, CURLOPT_COPYPOSTFIELDS, req.body.c_str());
  }
  if (req.sse) headers = curl_slist_append(headers, "Accept: text/event-stream");
  if (headers) curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
}

HttpDriver::HttpDriver() {
  global_init();
  multi_ = curl_multi_init();
  if (!multi_) throw Error("curl_multi_init failed");
}

HttpDriver::~HttpDriver() {
  auto* multi = static_cast<CURLM*>(multi_);
  // Abandon unfinished transfers without callbacks.
  for (Transfer* t : live_) {
    curl_multi_remove_handle(multi, t->easy);
    delete t;
  }
  curl_multi_cleanup(multi);
}

void HttpDriver::start(const HttpRequest& req, OnEvent on_event, OnDone on_done) {
  auto t = std::make_unique<Transfer>();
  t->easy = curl_easy_init();
  if (!t->easy) throw Error("curl_easy_init failed");
  t->sse = req.sse;
  t->on_event = std::move(on_event);
  t->on_done = std::move(on_done);
  configure(t->easy, t->headers, req, t->errbuf);
  curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, &Transfer::on_write);
  curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t.get());
  curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t.get());
  curl_multi_add_handle(static_cast<CURLM*>(multi_), t->easy);
  live_.insert(t.release());
  int running = 0;
  curl_multi_perform(static_cast<CURLM*>(multi_), &running);  // send it right away
}

void HttpDriver::poll(int timeout_ms) {
  auto* multi = static_cast<CURLM*>(multi_);
  perform();
  if (live_.empty()) {  // nothing to wait on: just let the time pass
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return;
  }
  curl_multi_poll(multi, nullptr, 0, timeout_ms, nullptr);
  perform();
}

void HttpDriver::perform() {
  auto* multi = static_cast<CURLM*>(multi_);
  int running = 0;
  curl_multi_perform(multi, &running);
  int left = 0;
  while (CURLMsg* msg = curl_multi_info_read(multi, &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    double now = now_seconds();
    Transfer* raw = nullptr;
    curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &raw);
    std::unique_ptr<Transfer> t(raw);
    live_.erase(raw);
    CURLcode code = msg->data.result;
    curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->response.status);
    if (code != CURLE_OK) t->response.error = curl_error_message(code, t->errbuf);
    curl_multi_remove_handle(multi, t->easy);
    if (t->on_done) t->on_done(std::move(t->response), now);
  }
}

namespace {

size_t append_to_string(char* data, size_t size, size_t nmemb, void* user) {
  static_cast<std::string*>(user)->append(data, size * nmemb);
  return size * nmemb;
}

HttpResponse blocking(const HttpRequest& req) {
  global_init();
  HttpResponse r;
  CURL* easy = curl_easy_init();
  if (!easy) throw Error("curl_easy_init failed");
  curl_slist* headers = nullptr;
  char errbuf[CURL_ERROR_SIZE] = {};
  configure(easy, headers, req, errbuf);
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &append_to_string);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &r.body);
  CURLcode code = curl_easy_perform(easy);
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &r.status);
  if (code != CURLE_OK) r.error = curl_error_message(code, errbuf);
  if (headers) curl_slist_free_all(headers);
  curl_easy_cleanup(easy);
  return r;
}

}  // namespace

HttpResponse http_get(const std::string& url, double timeout_s) {
  return blocking({.url = url, .body = "", .timeout_s = timeout_s, .sse = false});
}

HttpResponse http_post_json(const std::string& url, const std::string& body, double timeout_s) {
  return blocking({.url = url, .body = body, .timeout_s = timeout_s, .sse = false});
}

void download_file(const std::string& url, const std::string& path, double timeout_s) {
  HttpResponse r = http_get(url, timeout_s);
  if (!r.error.empty())
    throw LoadError(
        fmt::format("cannot download {}: {} (offline? pass a local copy instead)", url, r.error));
  if (r.status != 200)
    throw LoadError(fmt::format("cannot download {}: HTTP status {}", url, r.status));
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::string tmp = path + ".part";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw LoadError(fmt::format("cannot write {}", tmp));
  size_t written = std::fwrite(r.body.data(), 1, r.body.size(), f);
  bool closed = std::fclose(f) == 0;
  if (written != r.body.size() || !closed)
    throw LoadError(fmt::format("cannot write {} ({} of {} bytes)", tmp, written, r.body.size()));
  std::filesystem::rename(tmp, path);
}

}  // namespace serval::clients
