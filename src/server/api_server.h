// The OpenAI-compatible routes of `serval serve` on top of an Engine: /v1/*, /tokenize,
// /detokenize, /health, /version, /metrics. Transport-free: it handles HttpRequest/Responder.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/request_parser.h"
#include "server/response_store.h"

namespace serval::server {

class InFlightJob;

struct ApiOptions : RequestPolicy {
  std::vector<std::string> served_model_names;  // empty: info().served_model_name
  std::string api_key;                          // empty: no authentication
};

class ApiServer {
 public:
  ApiServer(runtime::Engine& engine, ApiOptions options);

  // The HttpHandler: runs on the connection's strand, never throws.
  void handle(HttpRequest req, std::shared_ptr<Responder> res);

  // Aborts every generation in flight (shutdown); their responses end shortly after. A generation
  // whose request arrives later (a connection accepted before the listener closed) is aborted as
  // soon as it starts, so that its response ends too.
  void abort_all();
  int num_in_flight() const;
  // The name responses carry in "model".
  const std::string& model_name() const { return names_.front(); }

 private:
  void route(const HttpRequest& req, const std::shared_ptr<Responder>& res);
  void generate(const HttpRequest& req, const std::shared_ptr<Responder>& res, ApiKind kind);
  // /v1/embeddings, /score and /rerank: jobs of pooling requests (--runner pooling).
  void pooling(const HttpRequest& req, const std::shared_ptr<Responder>& res);
  // Registers `job` for abort_all, starts it (start may throw: then it is unregistered) and
  // aborts it at once when shutdown began meanwhile. `key` came from next_job_key().
  void run_job(uint64_t key, const std::shared_ptr<InFlightJob>& job,
               const std::shared_ptr<Responder>& res);
  uint64_t next_job_key();
  // A job's on_done: forget it.
  std::function<void()> forget_job(uint64_t key);
  void check_model(const Json& body) const;
  void stored_response(const HttpRequest& req, Responder& res);
  std::string models_json() const;
  std::string tokenize(const std::string& body) const;
  std::string detokenize(const std::string& body) const;

  runtime::Engine& engine_;
  ApiOptions options_;
  std::vector<std::string> names_;
  ModelContext ctx_;
  ResponseStore responses_;  // the Responses API's kept responses (ctx_.response_store)
  Metrics metrics_;
  int64_t created_;
  mutable std::mutex mu_;
  uint64_t next_job_ = 0;
  struct InFlight {
    std::weak_ptr<InFlightJob> job;
    std::shared_ptr<Responder> res;
  };
  std::unordered_map<uint64_t, InFlight> in_flight_;
  bool aborting_ = false;  // abort_all was called (under mu_)
};

}  // namespace serval::server
