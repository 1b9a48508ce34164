// POST /v1/embeddings for a `serve --runner pooling` engine: OpenAI's Embeddings API with vLLM's
// extras. Each input's embedding is its last token's final hidden state (the engine's pooling),
// cut to `dimensions` (matryoshka) and L2-normalized unless the request says `normalize: false`.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/http_server.h"
#include "server/in_flight_job.h"
#include "server/request_parser.h"

namespace serval::server {

struct EmbeddingRequest {
  std::vector<PromptInput> prompts;  // `input`: a string, strings, token ids or lists of them
  bool normalize = true;             // vLLM's `normalize` (default: --pooler-config's)
  std::optional<int> dimensions;     // keep the first d values, 1 <= d <= hidden size
  bool base64 = false;               // encoding_format "base64": little-endian float32 bytes
};

// 400 (ApiError) naming the field for a bad `input`, `dimensions`, `encoding_format` or
// `normalize`; `truncate_prompt_tokens` and `add_special_tokens` (default true) as for
// completions; a prompt longer than max_model_len is a 400.
EmbeddingRequest parse_embedding_request(const Json& body, const ModelContext& ctx);

// The prompts of a pooling route from `texts` (body[key]'s value, or texts gathered from several
// fields, named `key` in errors): tokenized with body's add_special_tokens (default true),
// truncated by its truncate_prompt_tokens, each at most max_model_len tokens (else a 400).
std::vector<PromptInput> pooling_prompts(const Json& body, const Json& texts,
                                         const ModelContext& ctx, const char* key);

// One embedding as the response carries it: `hidden` cut to the request's dimensions and
// normalized (a zero vector stays zero), as floats or their base64 text.
Json embedding_value(const EmbeddingRequest& req, std::vector<float> hidden);

// Standard base64 (with '=' padding) of bytes.
std::string base64_encode(const void* data, size_t n);

// The body of a pooling route's response from its prompts' raw embeddings (in prompt order) and
// their token count.
using EmbeddingResponder =
    std::function<Json(std::vector<std::vector<float>> hidden, int64_t prompt_tokens)>;

// /v1/embeddings' response body.
EmbeddingResponder embeddings_responder(EmbeddingRequest req, std::string model_name);

// The engine requests of one pooling call (/v1/embeddings, /score, /rerank), gathered into one
// response. Every method runs on the connection's strand.
class EmbeddingJob : public InFlightJob, public std::enable_shared_from_this<EmbeddingJob> {
 public:
  EmbeddingJob(runtime::Engine& engine, std::vector<PromptInput> prompts,
               EmbeddingResponder respond, std::shared_ptr<Responder> responder,
               std::function<void()> on_done);
  void start() override;  // submits every input
  void abort_all() override;

 private:
  void on_output(size_t i, const runtime::RequestOutput& out);
  void fail(int status, const std::string& message);
  void finish_job();

  runtime::Engine& engine_;
  std::vector<PromptInput> prompts_;
  EmbeddingResponder respond_;
  std::shared_ptr<Responder> res_;
  std::function<void()> on_done_;
  std::vector<uint64_t> ids_;               // engine request of each input (submitted ones)
  std::vector<std::vector<float>> hidden_;  // each input's embedding, once it came
  int remaining_ = 0;                       // inputs whose engine request has not finished
  bool done_ = false;                       // the response was sent
};

}  // namespace serval::server
