// POST /v1/embeddings: request parsing, the embeddings' form, and the job that gathers them.
#include "server/embeddings_api.h"

#include <fmt/format.h>

#include <boost/archive/iterators/base64_from_binary.hpp>
#include <boost/archive/iterators/transform_width.hpp>
#include <cmath>
#include <ctime>
#include <utility>

#include "base/error.h"
#include "base/log.h"
#include "server/api_error.h"
#include "server/random_id.h"
#include "server/submit_error.h"

namespace serval::server {

std::vector<PromptInput> pooling_prompts(const Json& body, const Json& texts,
                                         const ModelContext& ctx, const char* key) {
  const bool add_special = get_bool(body, "add_special_tokens").value_or(true);
  std::vector<PromptInput> prompts =
      parse_prompts(Json{{key, texts}}, ctx, /*echo=*/false, add_special, key);
  truncate_prompts(body, ctx, prompts);
  for (size_t i = 0; i < prompts.size(); ++i)
    if (int64_t(prompts[i].token_ids.size()) > ctx.info->max_model_len)
      throw bad_request(key,
                        fmt::format("{} {} has {} tokens, more than max_model_len ({}); "
                                    "truncate_prompt_tokens can shorten it",
                                    key, i, prompts[i].token_ids.size(), ctx.info->max_model_len));
  return prompts;
}

EmbeddingRequest parse_embedding_request(const Json& body, const ModelContext& ctx) {
  EmbeddingRequest req;
  req.normalize = ctx.embed_normalize;
  const Json* input = field(body, "input");
  if (!input) throw bad_request("input", "'input' is required");
  req.prompts = pooling_prompts(body, *input, ctx, "input");
  if (auto v = get_bool(body, "normalize")) req.normalize = *v;
  if (auto d = get_int(body, "dimensions")) {
    if (*d < 1 || *d > ctx.info->hidden_size)
      throw bad_request("dimensions", fmt::format("dimensions must be in [1, {}], got {}",
                                                  ctx.info->hidden_size, *d));
    req.dimensions = int(*d);
  }
  if (const Json* f = field(body, "encoding_format")) {
    if (!f->is_string() || (*f != "float" && *f != "base64"))
      throw bad_request("encoding_format", "encoding_format must be \"float\" or \"base64\"");
    req.base64 = *f == "base64";
  }
  return req;
}

std::string base64_encode(const void* data, size_t n) {
  using namespace boost::archive::iterators;
  using Bytes = const char*;
  using Base64 = base64_from_binary<transform_width<Bytes, 6, 8>>;
  const Bytes begin = static_cast<Bytes>(data);
  std::string out(Base64(begin), Base64(begin + n));
  out.append((3 - n % 3) % 3, '=');
  return out;
}

Json embedding_value(const EmbeddingRequest& req, std::vector<float> hidden) {
  if (req.dimensions && size_t(*req.dimensions) < hidden.size()) hidden.resize(*req.dimensions);
  if (req.normalize) {
    double sum_sq = 0;
    for (float v : hidden) sum_sq += double(v) * v;
    if (sum_sq > 0) {
      const double inv = 1.0 / std::sqrt(sum_sq);
      for (float& v : hidden) v = float(v * inv);
    }
  }
  if (req.base64) return base64_encode(hidden.data(), hidden.size() * sizeof(float));
  return Json(hidden);
}

EmbeddingResponder embeddings_responder(EmbeddingRequest req, std::string model_name) {
  return [req = std::move(req), model_name = std::move(model_name)](
             std::vector<std::vector<float>> hidden, int64_t prompt_tokens) {
    Json data = Json::array();
    for (size_t k = 0; k < hidden.size(); ++k)
      data.push_back({{"index", k},
                      {"object", "embedding"},
                      {"embedding", embedding_value(req, std::move(hidden[k]))}});
    return Json{{"id", random_id("embd-")},
                {"object", "list"},
                {"created", int64_t(std::time(nullptr))},
                {"model", model_name},
                {"data", std::move(data)},
                {"usage",
                 {{"prompt_tokens", prompt_tokens},
                  {"total_tokens", prompt_tokens},
                  {"completion_tokens", 0}}}};
  };
}

EmbeddingJob::EmbeddingJob(runtime::Engine& engine, std::vector<PromptInput> prompts,
                           EmbeddingResponder respond, std::shared_ptr<Responder> responder,
                           std::function<void()> on_done)
    : engine_(engine),
      prompts_(std::move(prompts)),
      respond_(std::move(respond)),
      res_(std::move(responder)),
      on_done_(std::move(on_done)) {}

void EmbeddingJob::start() {
  hidden_.resize(prompts_.size());
  remaining_ = int(prompts_.size());
  auto self = shared_from_this();
  res_->on_disconnect([self] {
    self->done_ = true;
    self->abort_all();
  });
  try {
    for (size_t i = 0; i < prompts_.size(); ++i) {
      runtime::SamplingParams params;
      params.max_tokens = 1;
      ids_.push_back(engine_.submit(prompts_[i].token_ids, params,
                                    [self, i, res = res_](const runtime::RequestOutput& out) {
                                      res->post([self, i, out] { self->on_output(i, out); });
                                    }));
    }
  } catch (...) {
    done_ = true;
    abort_all();
    rethrow_submit_error("input");
  }
}

void EmbeddingJob::abort_all() {
  for (uint64_t id : ids_) engine_.abort(id);  // finished ones are ignored by the engine
}

void EmbeddingJob::on_output(size_t i, const runtime::RequestOutput& out) {
  if (!out.finish) return;  // pooling requests have one update, their last
  --remaining_;
  if (!done_ && !out.error.empty()) {
    log::error("embedding input {} failed in the engine: {}", i, out.error);
    fail(500, "the engine failed: " + out.error);
  } else if (!done_ && *out.finish == runtime::FinishReason::kAbort) {
    fail(503, "the request was aborted (the server is shutting down)");
  } else if (!done_) {
    hidden_[i] = out.embedding;
    if (remaining_ == 0) {
      int64_t prompt_tokens = 0;
      for (const PromptInput& p : prompts_) prompt_tokens += int64_t(p.token_ids.size());
      done_ = true;
      res_->send(200, "application/json",
                 respond_(std::move(hidden_), prompt_tokens)
                     .dump(-1, ' ', false, Json::error_handler_t::replace));
    }
  }
  if (remaining_ == 0) finish_job();
}

void EmbeddingJob::fail(int status, const std::string& message) {
  done_ = true;
  abort_all();
  res_->send(status, "application/json", error_json(status, message));
}

void EmbeddingJob::finish_job() {
  if (on_done_) std::exchange(on_done_, nullptr)();
}

}  // namespace serval::server
