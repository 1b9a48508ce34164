// vLLM's /score and /rerank on a `serve --runner pooling` engine (an embedding model): the cosine
// similarity of the embeddings of each (text_1, text_2) pair, or of a query and each document,
// ranked. (Cross-encoder models, which score a pair in one pass, are not served.)
#pragma once
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "server/embeddings_api.h"
#include "server/request_parser.h"

namespace serval::server {

// Texts to embed and the pairs to score, as indices into `texts`.
struct ScoreRequest {
  std::vector<PromptInput> texts;
  std::vector<std::pair<size_t, size_t>> pairs;
};

// /score: text_1 and text_2 each a string or a list of strings, 1:1, 1:N or N:N (a single text_1
// is scored against every text_2). 400 naming the field otherwise; truncate_prompt_tokens as for
// completions.
ScoreRequest parse_score_request(const Json& body, const ModelContext& ctx);
EmbeddingResponder score_responder(ScoreRequest req, std::string model_name);

// /rerank: `query` and a list of `documents` (strings), `top_n` (0 or absent: all); the results
// ordered by relevance_score, highest first (ties by index).
struct RerankRequest {
  ScoreRequest score;  // texts: the query, then the documents; pairs (0, d + 1)
  std::vector<std::string> documents;
  int top_n = 0;
};
RerankRequest parse_rerank_request(const Json& body, const ModelContext& ctx);
EmbeddingResponder rerank_responder(RerankRequest req, std::string model_name);

// cos(a, b); 0 when either is a zero vector.
double cosine_similarity(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace serval::server
