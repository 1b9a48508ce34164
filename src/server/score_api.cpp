// /score and /rerank: parsing, and the responses from the texts' embeddings.
#include "server/score_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <numeric>

#include "server/api_error.h"
#include "server/random_id.h"

namespace serval::server {
namespace {

// body[key]: a non-empty string or a non-empty list of non-empty strings.
std::vector<std::string> text_list(const Json& body, const char* key) {
  const Json* v = field(body, key);
  if (v && v->is_string()) return {v->get<std::string>()};
  std::vector<std::string> out;
  if (v && v->is_array())
    for (const Json& t : *v)
      if (t.is_string()) out.push_back(t.get<std::string>());
  if (!v || !v->is_array() || v->empty() || out.size() != v->size())
    throw bad_request(key,
                      fmt::format("'{}' must be a string or a non-empty list of strings", key));
  return out;
}

}  // namespace

double cosine_similarity(const std::vector<float>& a, const std::vector<float>& b) {
  double dot = 0, na = 0, nb = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    dot += double(a[i]) * b[i];
    na += double(a[i]) * a[i];
    nb += double(b[i]) * b[i];
  }
  return na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : 0.0;
}

ScoreRequest parse_score_request(const Json& body, const ModelContext& ctx) {
  const std::vector<std::string> first = text_list(body, "text_1");
  const std::vector<std::string> second = text_list(body, "text_2");
  if (first.size() > 1 && first.size() != second.size())
    throw bad_request("text_2", fmt::format("text_1 ({} texts) and text_2 ({}) must be 1:1, 1:N or "
                                            "N:N",
                                            first.size(), second.size()));
  std::vector<std::string> texts = first;
  texts.insert(texts.end(), second.begin(), second.end());
  ScoreRequest req;
  req.texts = pooling_prompts(body, Json(texts), ctx, "text_1");
  for (size_t j = 0; j < second.size(); ++j)
    req.pairs.emplace_back(first.size() == 1 ? 0 : j, first.size() + j);
  return req;
}

EmbeddingResponder score_responder(ScoreRequest req, std::string model_name) {
  return [pairs = std::move(req.pairs), model_name = std::move(model_name)](
             std::vector<std::vector<float>> hidden, int64_t prompt_tokens) {
    Json data = Json::array();
    for (size_t i = 0; i < pairs.size(); ++i)
      data.push_back(
          {{"index", i},
           {"object", "score"},
           {"score", cosine_similarity(hidden[pairs[i].first], hidden[pairs[i].second])}});
    return Json{{"id", random_id("score-")},
                {"object", "list"},
                {"created", int64_t(std::time(nullptr))},
                {"model", model_name},
                {"data", std::move(data)},
                {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
  };
}

RerankRequest parse_rerank_request(const Json& body, const ModelContext& ctx) {
  const Json* query = field(body, "query");
  if (!query || !query->is_string()) throw bad_request("query", "'query' must be a string");
  const Json* docs = field(body, "documents");
  if (!docs || !docs->is_array())
    throw bad_request("documents", "'documents' must be a non-empty list of strings");
  RerankRequest req;
  req.documents = text_list(body, "documents");
  if (auto n = get_int(body, "top_n")) {
    if (*n < 0) throw bad_request("top_n", fmt::format("top_n must be >= 0, got {}", *n));
    req.top_n = int(std::min<int64_t>(*n, int64_t(req.documents.size())));
  }
  std::vector<std::string> texts = {query->get<std::string>()};
  texts.insert(texts.end(), req.documents.begin(), req.documents.end());
  req.score.texts = pooling_prompts(body, Json(texts), ctx, "documents");
  for (size_t d = 0; d < req.documents.size(); ++d) req.score.pairs.emplace_back(0, d + 1);
  return req;
}

EmbeddingResponder rerank_responder(RerankRequest req, std::string model_name) {
  return [req = std::move(req), model_name = std::move(model_name)](
             std::vector<std::vector<float>> hidden, int64_t prompt_tokens) {
    std::vector<double> scores;
    for (const auto& [q, d] : req.score.pairs)
      scores.push_back(cosine_similarity(hidden[q], hidden[d]));
    std::vector<size_t> order(scores.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return scores[a] > scores[b]; });
    if (req.top_n > 0) order.resize(size_t(req.top_n));
    Json results = Json::array();
    for (size_t d : order)
      results.push_back({{"index", d},
                         {"document", {{"text", req.documents[d]}}},
                         {"relevance_score", scores[d]}});
    return Json{{"id", random_id("rerank-")},
                {"model", model_name},
                {"results", std::move(results)},
                {"usage", {{"total_tokens", prompt_tokens}}}};
  };
}

}  // namespace serval::server
