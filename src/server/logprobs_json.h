// The OpenAI / vLLM JSON shapes of logprobs: completions' parallel lists, chat's per-token
// objects, vLLM's prompt_logprobs, and the prompt part of an echo. `token_text` gives a token's
// text as the response shows it (or "token_id:<id>").
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace serval::server {

using Json = nlohmann::ordered_json;
using TokenText = std::function<std::string(int32_t)>;

// {tokens, token_logprobs, top_logprobs, text_offset}, all empty.
Json empty_completion_logprobs();

// Appends one generated token at byte `text_offset` of the choice's text to completion lists.
void append_completion_logprob(Json& lists, const runtime::LogprobEntry& e, size_t text_offset,
                               const TokenText& token_text);

// Chat: {token, logprob, bytes, top_logprobs: [{token, logprob, bytes}, ...]}.
Json chat_logprob(const runtime::LogprobEntry& e, const TokenText& token_text);

// Echo: every prompt token onto completion lists, offsets from 0; the first token's logprob and
// alternatives null, token i's from prompt_entries[i - 1] with at most `top` alternatives.
void append_echo_logprobs(Json& lists, std::span<const int32_t> prompt_ids,
                          const std::vector<runtime::LogprobEntry>& prompt_entries, int top,
                          const TokenText& token_text);

// vLLM's prompt_logprobs: null for the first prompt token, then per token an object from token
// ids to {logprob, rank, decoded_token}: the prompt token itself and the top alternatives.
Json prompt_logprobs_json(const std::vector<runtime::LogprobEntry>& prompt_entries,
                          const TokenText& token_text);

}  // namespace serval::server
