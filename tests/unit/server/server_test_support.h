// Test doubles for the server: a deterministic FakeEngine, a tiny byte-level tokenizer, and a
// raw-socket HTTP client.
#pragma once
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cstdint>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>

#include "runtime/engine.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::server::testing {

constexpr int32_t kEosId = 256;

// Byte-level BPE without merges: token id b is byte b (GPT-2 byte→unicode mapping), plus the
// special token "<|eos|>" = 256. So "abc" encodes to {97, 98, 99}.
inline std::unique_ptr<tokenizer::Tokenizer> make_byte_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    vocab[s] = b;
  }
  nlohmann::json tok = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens",
       {{{"id", kEosId}, {"content", "<|eos|>"}, {"special", true}, {"normalized", false}}}}};
  nlohmann::json cfg = {{"eos_token", "<|eos|>"}};
  return tokenizer::Tokenizer::from_json(tok.dump(), cfg.dump());
}

// Echoes the prompt cyclically, one token per step of `delay_ms`. Honours max_tokens,
// stop_token_ids, EOS (when the echoed token is kEosId), logprobs, prompt_logprobs (prompt token
// i gets logprob -i/4 and rank i, alternatives 65, 66, ... at -1, -2, ...) and aborts; throws
// QueueFull when `queue_cap` requests are active.
// The prompt tokens FakeEngine reports as served from a prefix cache: a whole 16-token block
// per 32 prompt tokens, so that usage reports have something to count.
inline int fake_cached_tokens(size_t prompt_len) {
  return int(prompt_len / 32) * 16;
}

class FakeEngine final : public runtime::Engine {
 public:
  explicit FakeEngine(int delay_ms = 0, int queue_cap = 64, int max_model_len = 64)
      : delay_ms_(delay_ms), cap_(queue_cap) {
    tok_ = make_byte_tokenizer();
    tmpl_ = std::make_unique<tokenizer::ChatTemplate>(
        // A system message renders bare, so that a test can make the whole echoed output.
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}{% else %}"
        "<{{ m.role }}>{{ m.content }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}");
    info_.served_model_name = "fake-model";
    info_.model_dir = "/models/fake";
    info_.architecture = "FakeMoeForCausalLM";
    info_.dtype = "bfloat16";
    info_.kv_cache_dtype = "auto";
    info_.device = "cpu";
    info_.moe_backend = "latency";
    info_.num_parameters = 1234;
    info_.max_model_len = max_model_len;
    info_.vocab_size = tok_->vocab_size();
    info_.kv_cache_tokens = 1024;
    info_.eos_token_ids = {kEosId};
    thread_ = std::thread([this] { loop(); });
  }
  ~FakeEngine() override { shutdown(); }

  const runtime::ModelInfo& info() const override { return info_; }
  const tokenizer::Tokenizer* tokenizer() const override { return tok_.get(); }
  const tokenizer::ChatTemplate* chat_template() const override { return tmpl_.get(); }

  uint64_t submit(std::vector<int32_t> prompt, const runtime::SamplingParams& params,
                  runtime::OutputCallback cb) override {
    std::lock_guard lock(mu_);
    if (static_cast<int>(active_.size()) >= cap_) throw runtime::QueueFull("queue is full");
    uint64_t id = next_id_++;
    active_[id] = Req{std::move(prompt), params, std::move(cb)};
    submitted_.push_back(params);
    cv_.notify_all();
    return id;
  }
  void abort(uint64_t id) override {
    std::lock_guard lock(mu_);
    aborted_.insert(id);
    if (active_.count(id)) active_[id].aborted = true;
  }
  runtime::EngineStats stats() const override {
    std::lock_guard lock(mu_);
    runtime::EngineStats s;
    s.num_running = static_cast<int>(active_.size());
    s.num_total_blocks = 100;
    s.num_free_blocks = 75;
    s.generation_tokens_total = generated_;
    return s;
  }
  bool healthy() const override { return healthy_; }
  void shutdown() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    if (thread_.joinable()) thread_.join();
  }

  void set_healthy(bool h) { healthy_ = h; }
  // While paused, requests are accepted but no step runs (no output reaches the server).
  void set_paused(bool paused) {
    std::lock_guard lock(mu_);
    paused_ = paused;
    cv_.notify_all();
  }
  void set_max_new_tokens(int n) { info_.max_new_tokens = n; }  // the generation config's cap
  // --runner pooling: each request's one update is fake_embedding(prompt).
  void set_pooling() {
    info_.pooling = true;
    info_.hidden_size = 4;
  }
  // A pooling request's "hidden state": its length, the sum, the first and the last of its ids.
  static std::vector<float> fake_embedding(const std::vector<int32_t>& prompt) {
    float sum = 0;
    for (int32_t id : prompt) sum += float(id);
    return {float(prompt.size()), sum, float(prompt.front()), float(prompt.back())};
  }
  std::set<uint64_t> aborted() const {
    std::lock_guard lock(mu_);
    return aborted_;
  }
  std::vector<runtime::SamplingParams> submitted() const {
    std::lock_guard lock(mu_);
    return submitted_;
  }
  int num_active() const {
    std::lock_guard lock(mu_);
    return static_cast<int>(active_.size());
  }

 private:
  struct Req {
    std::vector<int32_t> prompt;
    runtime::SamplingParams params;
    runtime::OutputCallback cb;
    int generated = 0;
    bool aborted = false;
  };

  void loop() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      if (active_.empty() || paused_) {
        cv_.wait(lock);
        continue;
      }
      std::vector<std::pair<runtime::OutputCallback, runtime::RequestOutput>> outs;
      for (auto it = active_.begin(); it != active_.end();) {
        Req& r = it->second;
        runtime::RequestOutput o;
        o.request_id = it->first;
        o.num_prompt_tokens = static_cast<int>(r.prompt.size());
        o.num_cached_tokens = fake_cached_tokens(r.prompt.size());
        if (r.aborted) {
          o.finish = runtime::FinishReason::kAbort;
        } else if (info_.pooling) {
          o.embedding = fake_embedding(r.prompt);
          o.finish = runtime::FinishReason::kStop;
        } else {
          if (r.generated == 0 && r.params.prompt_logprobs >= 0) {
            for (size_t i = 1; i < r.prompt.size(); ++i) {
              runtime::LogprobEntry e{{r.prompt[i], -0.25f * float(i)}, {}, int(i)};
              for (int k = 0; k < r.params.prompt_logprobs; ++k)
                e.top.push_back({static_cast<int32_t>(65 + k), -1.0f - k});
              o.prompt_logprobs.push_back(e);
            }
          }
          int32_t t = r.prompt[r.generated % r.prompt.size()];
          ++r.generated;
          ++generated_;
          o.new_token_ids = {t};
          if (r.params.logprobs >= 0) {
            runtime::LogprobEntry e{{t, -0.5f}, {}};
            for (int k = 0; k < r.params.logprobs; ++k)
              e.top.push_back({static_cast<int32_t>(65 + k), -1.0f - k});
            o.logprobs.push_back(e);
          }
          bool is_stop_id = false;
          for (int32_t s : r.params.stop_token_ids) is_stop_id |= s == t;
          if ((t == kEosId && !r.params.ignore_eos) || is_stop_id) {
            o.finish = runtime::FinishReason::kStop;
            o.stop_token_id = t;
          } else if (r.generated >= r.params.max_tokens) {
            o.finish = runtime::FinishReason::kLength;
          }
        }
        outs.emplace_back(r.cb, o);
        it = o.finish ? active_.erase(it) : std::next(it);
      }
      lock.unlock();
      for (auto& [cb, o] : outs) cb(o);
      if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
      lock.lock();
    }
    for (auto& [id, r] : active_) {
      runtime::RequestOutput o;
      o.request_id = id;
      o.finish = runtime::FinishReason::kAbort;
      r.cb(o);
    }
    active_.clear();
  }

  int delay_ms_;
  int cap_;
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  std::unique_ptr<tokenizer::ChatTemplate> tmpl_;
  runtime::ModelInfo info_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Req> active_;
  std::set<uint64_t> aborted_;
  std::vector<runtime::SamplingParams> submitted_;
  int64_t generated_ = 0;
  uint64_t next_id_ = 1;
  bool stop_ = false;
  bool paused_ = false;
  std::atomic<bool> healthy_{true};
  std::thread thread_;
};

struct HttpResult {
  int status = 0;
  std::string headers;  // raw, lower-cased
  std::string body;     // de-chunked
};

inline int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    throw std::runtime_error("connect failed");
  return fd;
}

inline void send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;  // the server may close early (413)
    off += static_cast<size_t>(n);
  }
}

inline std::string request_text(const std::string& method, const std::string& path,
                                const std::string& body, const std::string& extra_headers,
                                bool close = true) {
  return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers +
         "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         (close ? "\r\nConnection: close" : "") + "\r\n\r\n" + body;
}

inline HttpResult parse_response(const std::string& raw) {
  HttpResult r;
  size_t head_end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || head_end == std::string::npos) return r;
  r.status = std::stoi(raw.substr(9, 3));
  r.headers = raw.substr(0, head_end);
  for (auto& c : r.headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string body = raw.substr(head_end + 4);
  if (r.headers.find("transfer-encoding: chunked") == std::string::npos) {
    r.body = body;
    return r;
  }
  size_t pos = 0;
  while (pos < body.size()) {
    size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) break;
    size_t len = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    if (len == 0) break;
    r.body += body.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return r;
}

// One request on a fresh connection with "Connection: close"; reads until EOF.
inline HttpResult http(int port, const std::string& method, const std::string& path,
                       const std::string& body = "", const std::string& extra_headers = "") {
  int fd = connect_to(port);
  send_all(fd, request_text(method, path, body, extra_headers));
  std::string raw;
  char buf[65536];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return parse_response(raw);
}

// The JSON payloads of the SSE events of a stream body ("[DONE]" kept as a string).
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return out;
}

}  // namespace serval::server::testing
