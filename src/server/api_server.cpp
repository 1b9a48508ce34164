// Routing, authentication, model listing, tokenize/detokenize, /metrics.
#include "server/api_server.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <vector>

#include "base/clock.h"
#include "base/log.h"
#include "server/api_error.h"
#include "server/embeddings_api.h"
#include "server/generation_job.h"
#include "server/responses_api.h"
#include "server/score_api.h"
#include "tokenizer/tokenizer.h"

namespace serval::server {
namespace {

constexpr const char* kJson = "application/json";
constexpr const char* kVersion = "0.1.0";

struct Route {
  const char* path;
  const char* method;
};
// /ping is vLLM's health check for SageMaker-style hosts (GET or POST).
constexpr Route kRoutes[] = {
    {"/health", "GET"},
    {"/ping", "GET"},
    {"/ping", "POST"},
    {"/version", "GET"},
    {"/v1/models", "GET"},
    {"/metrics", "GET"},
    {"/tokenize", "POST"},
    {"/detokenize", "POST"},
    {"/v1/completions", "POST"},
    {"/v1/chat/completions", "POST"},
    {"/v1/responses", "POST"},
    {"/v1/embeddings", "POST"},
    {"/v1/responses/", "GET"},
    {"/v1/responses/", "DELETE"},
    // vLLM's score and rerank APIs (embedding models: cosine similarity)
    {"/score", "POST"},
    {"/v1/score", "POST"},
    {"/rerank", "POST"},
    {"/v1/rerank", "POST"},
    {"/v2/rerank", "POST"},
};

// A route's path ending in '/' takes any one more path segment (an id).
bool route_matches(std::string_view route, std::string_view path) {
  if (!route.ends_with('/')) return path == route;
  return path.starts_with(route) && path.size() > route.size() &&
         path.find('/', route.size()) == std::string_view::npos;
}

}  // namespace

ApiServer::ApiServer(runtime::Engine& engine, ApiOptions options)
    : engine_(engine), options_(std::move(options)), created_(unix_time_seconds()) {
  names_ = options_.served_model_names;
  if (names_.empty()) names_.push_back(engine_.info().served_model_name);
  ctx_.info = &engine_.info();
  ctx_.tokenizer = engine_.tokenizer();
  ctx_.chat_template = engine_.chat_template();
  ctx_.response_store = &responses_;
  static_cast<RequestPolicy&>(ctx_) = options_;
}

void ApiServer::handle(HttpRequest req, std::shared_ptr<Responder> res) {
  try {
    route(req, res);
  } catch (const ApiError& e) {
    if (e.status() >= 500) log::warn("{} {}: {}", req.method, req.path, e.what());
    res->send(e.status(), kJson, error_json(e.status(), e.what(), e.param()));
  } catch (const std::exception& e) {
    log::error("{} {} failed: {}", req.method, req.path, e.what());
    res->send(500, kJson, error_json(500, std::string("internal error: ") + e.what()));
  }
}

void ApiServer::route(const HttpRequest& req, const std::shared_ptr<Responder>& res) {
  std::vector<std::string_view> methods;  // those the path takes
  for (const auto& r : kRoutes)
    if (route_matches(r.path, req.path)) methods.push_back(r.method);
  if (methods.empty()) throw ApiError(404, fmt::format("route {} not found", req.path));
  if (std::find(methods.begin(), methods.end(), req.method) == methods.end())
    throw ApiError(405, fmt::format("method {} is not allowed on {}; use {}", req.method, req.path,
                                    fmt::join(methods, " or ")));
  if (!options_.api_key.empty() && req.path.starts_with("/v1/") &&
      req.authorization != "Bearer " + options_.api_key)
    throw ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')");

  const std::string& p = req.path;
  if (p == "/health" || p == "/ping") {
    if (engine_.healthy()) return res->send(200, kJson, "{}");
    throw ApiError(503, "the engine is not healthy");
  }
  if (p == "/version") return res->send(200, kJson, Json{{"version", kVersion}}.dump());
  if (p == "/v1/models") return res->send(200, kJson, models_json());
  if (p == "/metrics")
    return res->send(200, "text/plain; version=0.0.4; charset=utf-8",
                     metrics_.render(engine_.info(), engine_.stats(), engine_.replica_stats()));
  if (p == "/tokenize") return res->send(200, kJson, tokenize(req.body));
  if (p == "/detokenize") return res->send(200, kJson, detokenize(req.body));
  if (p == "/v1/embeddings" || p.ends_with("score") || p.ends_with("rerank"))
    return pooling(req, res);
  if (p == "/v1/completions") return generate(req, res, ApiKind::kCompletion);
  if (p == "/v1/chat/completions") return generate(req, res, ApiKind::kChat);
  if (p == "/v1/responses") return generate(req, res, ApiKind::kResponses);
  if (p.starts_with("/v1/responses/")) return stored_response(req, *res);
  throw ApiError(404, fmt::format("route {} not found", p));
}

// GET /v1/responses/{id}: a stored response; DELETE: forget it.
void ApiServer::stored_response(const HttpRequest& req, Responder& res) {
  const std::string id = req.path.substr(std::string_view("/v1/responses/").size());
  const auto not_found = [&] { return ApiError(404, ResponseStore::not_kept_message(id)); };
  if (req.method == "DELETE") {
    if (!responses_.erase(id)) throw not_found();
    return res.send(200, kJson, Json{{"id", id}, {"object", "response"}, {"deleted", true}}.dump());
  }
  std::optional<StoredResponse> stored = responses_.get(id);
  if (!stored) throw not_found();
  res.send(200, kJson, stored->response.dump(-1, ' ', false, Json::error_handler_t::replace));
}

void ApiServer::check_model(const Json& body) const {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_string()) throw bad_request("model", "'model' must be a string");
  const auto name = it->get<std::string>();
  for (const auto& n : names_)
    if (n == name) return;
  throw ApiError(404, fmt::format("The model `{}` does not exist.", name), "model");
}

void ApiServer::generate(const HttpRequest& req, const std::shared_ptr<Responder>& res,
                         ApiKind kind) {
  if (engine_.info().pooling)  // as vLLM answers a generation request to an embedding model
    throw ApiError(400, fmt::format("The model does not support {} API (it runs with --runner "
                                    "pooling: use /v1/embeddings)",
                                    kind == ApiKind::kChat        ? "Chat Completions"
                                    : kind == ApiKind::kResponses ? "Responses"
                                                                  : "Completions"));
  Json body = parse_body(req.body);
  check_model(body);
  GenerationRequest gen = kind == ApiKind::kChat        ? parse_chat_request(body, ctx_)
                          : kind == ApiKind::kResponses ? parse_responses_request(body, ctx_)
                                                        : parse_completion_request(body, ctx_);
  if (!req.request_id.empty() && kind != ApiKind::kResponses) gen.request_id = req.request_id;
  const uint64_t key = next_job_key();
  auto job = std::make_shared<GenerationJob>(engine_, ctx_, std::move(gen), model_name(), res,
                                             metrics_, req.arrival_s, forget_job(key));
  run_job(key, job, res);
}

void ApiServer::pooling(const HttpRequest& req, const std::shared_ptr<Responder>& res) {
  const std::string& p = req.path;
  const bool score = p.ends_with("score"), rerank = p.ends_with("rerank");
  if (!engine_.info().pooling)
    throw ApiError(400, fmt::format("The model does not support {} API (serve an embedding model "
                                    "with --runner pooling)",
                                    score    ? "Score"
                                    : rerank ? "Rerank"
                                             : "Embeddings"));
  Json body = parse_body(req.body);
  check_model(body);
  std::vector<PromptInput> prompts;
  EmbeddingResponder respond;
  if (score) {
    ScoreRequest request = parse_score_request(body, ctx_);
    prompts = std::move(request.texts);
    respond = score_responder(std::move(request), model_name());
  } else if (rerank) {
    RerankRequest request = parse_rerank_request(body, ctx_);
    prompts = std::move(request.score.texts);
    respond = rerank_responder(std::move(request), model_name());
  } else {
    EmbeddingRequest request = parse_embedding_request(body, ctx_);
    prompts = std::move(request.prompts);
    respond = embeddings_responder(std::move(request), model_name());
  }
  const uint64_t key = next_job_key();
  auto job = std::make_shared<EmbeddingJob>(engine_, std::move(prompts), std::move(respond), res,
                                            forget_job(key));
  run_job(key, job, res);
}

uint64_t ApiServer::next_job_key() {
  std::lock_guard lock(mu_);
  return next_job_++;
}

std::function<void()> ApiServer::forget_job(uint64_t key) {
  return [this, key] {
    std::lock_guard lock(mu_);
    in_flight_.erase(key);
  };
}

void ApiServer::run_job(uint64_t key, const std::shared_ptr<InFlightJob>& job,
                        const std::shared_ptr<Responder>& res) {
  bool aborting;
  {
    std::lock_guard lock(mu_);
    in_flight_[key] = {job, res};
    aborting = aborting_;
  }
  try {
    job->start();
  } catch (...) {
    std::lock_guard lock(mu_);
    in_flight_.erase(key);
    throw;
  }
  // Registered after abort_all went through in_flight_ (shutdown): end it now, on this strand, as
  // the abort posted to every earlier job does.
  if (aborting) job->abort_all();
}

void ApiServer::abort_all() {
  std::lock_guard lock(mu_);
  aborting_ = true;
  for (auto& [key, f] : in_flight_)
    if (auto job = f.job.lock()) f.res->post([job] { job->abort_all(); });
}

int ApiServer::num_in_flight() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(in_flight_.size());
}

std::string ApiServer::models_json() const {
  const auto& info = engine_.info();
  Json data = Json::array();
  for (const auto& name : names_) {
    data.push_back(
        {{"id", name},
         {"object", "model"},
         {"created", created_},
         {"owned_by", "serval"},
         {"root", info.model_dir},
         {"parent", nullptr},
         {"max_model_len", info.max_model_len},
         {"vocab_size", info.vocab_size},
         {"permission", Json::array()},
         {"serval",
          {{"architecture", info.architecture},
           {"dtype", info.dtype},
           {"kv_cache_dtype", info.kv_cache_dtype},
           {"device", info.device},
           {"moe_backend", info.moe_backend.empty() ? Json(nullptr) : Json(info.moe_backend)},
           {"num_parameters", info.num_parameters},
           {"runner", info.pooling ? "pooling" : "generate"},
           {"kv_cache_tokens", info.kv_cache_tokens}}}});
  }
  return Json{{"object", "list"}, {"data", std::move(data)}}.dump();
}

std::string ApiServer::tokenize(const std::string& text) const {
  Json body = parse_body(text);
  check_model(body);
  if (!ctx_.tokenizer) throw bad_request("", "the model has no tokenizer.json");
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    std::string prompt = render_chat(body, ctx_, true);
    ids = ctx_.tokenizer->encode(prompt, get_bool(body, "add_special_tokens").value_or(false));
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string())
      throw bad_request("prompt", "'prompt' (a string) or 'messages' is required");
    ids = ctx_.tokenizer->encode(it->get<std::string>(),
                                 get_bool(body, "add_special_tokens").value_or(true));
  }
  return Json{
      {"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine_.info().max_model_len}}
      .dump();
}

std::string ApiServer::detokenize(const std::string& text) const {
  Json body = parse_body(text);
  check_model(body);
  if (!ctx_.tokenizer) throw bad_request("", "the model has no tokenizer.json");
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw bad_request("tokens", "'tokens' must be a list");
  std::vector<int32_t> ids;
  for (const auto& v : *it) {
    if (!v.is_number_integer()) throw bad_request("tokens", "'tokens' must hold integers");
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= engine_.info().vocab_size)
      throw bad_request("tokens", fmt::format("token id {} is outside the vocabulary", id));
    ids.push_back(static_cast<int32_t>(id));
  }
  return Json{{"prompt", ctx_.tokenizer->decode(ids, false)}}.dump(-1, ' ', false,
                                                                   Json::error_handler_t::replace);
}

}  // namespace serval::server
