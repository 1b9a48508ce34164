#include "server/logprobs_json.h"

namespace serval::server {

namespace {

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

Json empty_completion_logprobs() {
  return Json{{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
}

void append_completion_logprob(Json& lists, const runtime::LogprobEntry& e, size_t text_offset,
                               const TokenText& token_text) {
  const std::string tok = token_text(e.sampled.token_id);
  Json top = Json::object();
  top[tok] = e.sampled.logprob;
  for (const auto& t : e.top) top[token_text(t.token_id)] = t.logprob;
  lists["tokens"].push_back(tok);
  lists["token_logprobs"].push_back(e.sampled.logprob);
  lists["top_logprobs"].push_back(std::move(top));
  lists["text_offset"].push_back(text_offset);
}

Json chat_logprob(const runtime::LogprobEntry& e, const TokenText& token_text) {
  const std::string tok = token_text(e.sampled.token_id);
  Json top = Json::array();
  for (const auto& t : e.top) {
    const std::string tt = token_text(t.token_id);
    top.push_back({{"token", tt}, {"logprob", t.logprob}, {"bytes", bytes_of(tt)}});
  }
  return {{"token", tok},
          {"logprob", e.sampled.logprob},
          {"bytes", bytes_of(tok)},
          {"top_logprobs", std::move(top)}};
}

void append_echo_logprobs(Json& lists, std::span<const int32_t> prompt_ids,
                          const std::vector<runtime::LogprobEntry>& prompt_entries, int top,
                          const TokenText& token_text) {
  size_t offset = 0;
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    const std::string tok = token_text(prompt_ids[i]);
    lists["tokens"].push_back(tok);
    lists["text_offset"].push_back(offset);
    offset += tok.size();
    if (i == 0 || i > prompt_entries.size()) {
      lists["token_logprobs"].push_back(nullptr);
      lists["top_logprobs"].push_back(nullptr);
      continue;
    }
    const runtime::LogprobEntry& e = prompt_entries[i - 1];
    Json alternatives = Json::object();
    alternatives[tok] = e.sampled.logprob;
    for (size_t j = 0; j < e.top.size() && int(j) < top; ++j)
      alternatives[token_text(e.top[j].token_id)] = e.top[j].logprob;
    lists["token_logprobs"].push_back(e.sampled.logprob);
    lists["top_logprobs"].push_back(std::move(alternatives));
  }
}

Json prompt_logprobs_json(const std::vector<runtime::LogprobEntry>& prompt_entries,
                          const TokenText& token_text) {
  Json list = Json::array({nullptr});
  for (const runtime::LogprobEntry& e : prompt_entries) {
    Json entry = Json::object();
    entry[std::to_string(e.sampled.token_id)] = {{"logprob", e.sampled.logprob},
                                                 {"rank", e.rank},
                                                 {"decoded_token", token_text(e.sampled.token_id)}};
    for (size_t i = 0; i < e.top.size(); ++i)
      entry[std::to_string(e.top[i].token_id)] = {{"logprob", e.top[i].logprob},
                                                  {"rank", int(i) + 1},
                                                  {"decoded_token", token_text(e.top[i].token_id)}};
    list.push_back(std::move(entry));
  }
  return list;
}

}  // namespace serval::server
