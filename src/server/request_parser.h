// OpenAI (+ vLLM extras) request bodies → validated generation requests. Throws ApiError.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace serval::server {

using Json = nlohmann::ordered_json;

enum class ApiKind { kCompletion, kChat, kResponses };  // kResponses: a chat request underneath

struct PromptInput {
  std::vector<int32_t> token_ids;
  std::string text;  // the prompt as text, for echo (decoded when given as ids)
};

struct GenerationRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::vector<PromptInput> prompts;  // completions may batch; chat has exactly one
  runtime::SamplingParams sampling;  // max_tokens set per prompt at submission
  std::optional<int64_t>
      max_tokens;  // as requested; else 16 (completions) or the rest of the context
  int n = 1;
  std::vector<std::string> stop;
  bool include_stop_str_in_output = false;  // keep the matched stop string (or stop token's text)
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage = false;  // vLLM's continuous_usage_stats: usage in every chunk too
  bool echo = false;
  int logprobs = -1;  // -1: none; else the number of alternatives per token
  // vLLM's prompt_logprobs (-1: none); a completion with echo and logprobs also reports its prompt
  // tokens' logprobs in `logprobs` (echo_logprobs).
  int prompt_logprobs = -1;
  bool echo_logprobs = false;
  bool parse_tool_calls = false;  // chat with tools, tool_choice auto, the server's parser on
  // tool_choice names a function (or "required" with one tool): the output, generated under
  // guided decoding with its parameter schema, is that call's arguments.
  std::string forced_tool;
  // tool_choice "required": the output, guided, is a JSON list of {"name", "parameters"} calls.
  bool tool_call_list = false;
  bool single_tool_call = false;  // parallel_tool_calls false: at most one call per reply
  ToolParameterTypes tool_types;  // qwen3_coder with parse_tool_calls: the tools' parameter types
  // Chat with `serve --reasoning-parser`: the output split into reasoning and content
  // (reasoning_parser.h), the reply starting inside the reasoning block or not; the reasoning
  // sent unless the request's include_reasoning is false.
  bool split_reasoning = false;
  bool starts_in_reasoning = false;
  bool include_reasoning = true;
  bool skip_special_tokens = true;
  bool return_tokens_as_token_ids = false;  // logprob tokens as "token_id:<id>" (vLLM)
  // Chat: the reply's role, as vLLM gives it: --response-role after a generation prompt, else
  // the last message's role (the turn the model continues).
  std::string response_role = "assistant";
  Json responses_echo;  // kResponses: the request's settings the response repeats
  // Completions and chat: the id after the response id's prefix ("chatcmpl-<request_id>"): the
  // X-Request-Id header, else the body's request_id (vLLM), else random.
  std::string request_id;
  // kResponses: the conversation's chat messages so far (a previous response's, then this
  // input; no instructions), and whether to keep the response (`store`) for a next turn.
  Json responses_conversation;
  bool responses_store = false;
};

enum class ContentFormat { kAuto, kString, kOpenAi };

// How the server treats requests (serve flags): declared once, carried whole from ServerOptions
// through ApiOptions into ModelContext.
struct RequestPolicy {
  int max_logprobs = 20;
  // --enable-auto-tool-choice --tool-call-parser P: P (kNone without the flag)
  ToolCallParser tool_call_parser = ToolCallParser::kNone;
  ReasoningParser reasoning_parser = ReasoningParser::kNone;  // --reasoning-parser
  // --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens (prompt tokens
  // served from the prefix cache)
  bool prompt_tokens_details = false;
  // --return-tokens-as-token-ids: logprob tokens as "token_id:<id>" unless a request says
  // otherwise.
  bool return_tokens_as_token_ids = false;
  // --enable-force-include-usage: every stream ends with a usage chunk, as if its stream_options
  // asked for it.
  bool force_include_usage = false;
  std::string response_role = "assistant";  // --response-role
  bool priority_scheduling = false;  // --scheduling-policy priority: requests may set `priority`
  // --chat-template-content-format: how message content reaches the chat template: kString (text
  // parts joined by newlines), kOpenAi (a list of {"type": "text", "text"} parts, a string
  // content too), kAuto (kOpenAi when the template loops over a message's content).
  ContentFormat content_format = ContentFormat::kAuto;
  // --pooler-config's normalize: the default of an embeddings request's `normalize`.
  bool embed_normalize = true;
};

class ResponseStore;

// What parsing needs to know about the served model, and the server's policy.
struct ModelContext : RequestPolicy {
  const runtime::ModelInfo* info = nullptr;
  const tokenizer::Tokenizer* tokenizer = nullptr;         // may be null
  const tokenizer::ChatTemplate* chat_template = nullptr;  // may be null
  ResponseStore* response_store = nullptr;  // the Responses API's kept responses; may be null
};

// The prompts of body[key] ("prompt"; the embeddings API's "input"): a string, a list of strings,
// a list of token ids or a list of lists of them; texts tokenized with add_special. 400 naming
// `key` when it is absent, empty or of another shape.
std::vector<PromptInput> parse_prompts(const Json& body, const ModelContext& ctx, bool echo,
                                       bool add_special, const char* key = "prompt");
// vLLM's truncate_prompt_tokens: k >= 1 keeps the last k tokens of every prompt, -1 the last
// max_model_len; absent or null, no truncation. The text of a truncated prompt is that of the
// tokens kept.
void truncate_prompts(const Json& body, const ModelContext& ctx, std::vector<PromptInput>& prompts);

// Parses JSON, rejecting bodies nested deeper than `max_depth` (400) before building the tree.
Json parse_body(const std::string& body, int max_depth = 64);

GenerationRequest parse_completion_request(const Json& body, const ModelContext& ctx);
GenerationRequest parse_chat_request(const Json& body, const ModelContext& ctx);

// The max_tokens a prompt of `prompt_len` tokens gets; 400 when it does not fit max_model_len.
// max_new_tokens (> 0): the generation config's cap, applied after the checks, as vLLM does.
int resolve_max_tokens(const GenerationRequest& req, int prompt_len, int max_model_len,
                       int max_new_tokens = 0);

// Chat messages → prompt text through the chat template (400 on bad messages).
std::string render_chat(const Json& body, const ModelContext& ctx, bool default_add_gen_prompt);

// The field, or null when absent or JSON null.
const Json* field(const Json& body, const char* name);
// Field readers: nullopt when absent or null, 400 naming the field when of the wrong type.
std::optional<double> get_number(const Json& body, const char* name);
std::optional<int64_t> get_int(const Json& body, const char* name);
std::optional<bool> get_bool(const Json& body, const char* name);

}  // namespace serval::server
