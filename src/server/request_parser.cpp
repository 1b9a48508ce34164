// Validation and mapping of /v1/completions and /v1/chat/completions bodies, as vLLM does it.
#include "server/request_parser.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "base/json_depth.h"
#include "server/api_error.h"
#include "server/guided_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace serval::server {
namespace {

constexpr int kMaxStopStrings = 4;
constexpr int kMaxN = 128;

const tokenizer::Tokenizer& need_tokenizer(const ModelContext& ctx, const char* param) {
  if (!ctx.tokenizer)
    throw bad_request(param, "the model has no tokenizer.json; send prompts as token ids");
  return *ctx.tokenizer;
}

std::vector<int32_t> token_list(const Json& arr, const ModelContext& ctx, const char* param) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const auto& v : arr) {
    if (!v.is_number_integer())
      throw bad_request(param, fmt::format("'{}' must hold integers", param));
    int64_t id = v.get<int64_t>();
    if (id < 0 || id >= ctx.info->vocab_size)
      throw bad_request(param, fmt::format("token id {} is outside the vocabulary [0, {})", id,
                                           ctx.info->vocab_size));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

PromptInput text_prompt(const std::string& text, const ModelContext& ctx, bool add_special,
                        const char* key) {
  PromptInput p;
  p.text = text;
  p.token_ids = need_tokenizer(ctx, key).encode(text, add_special);
  return p;
}

PromptInput id_prompt(const Json& arr, const ModelContext& ctx, bool echo, const char* key) {
  PromptInput p;
  p.token_ids = token_list(arr, ctx, key);
  if (echo && ctx.tokenizer) p.text = ctx.tokenizer->decode(p.token_ids, true);
  return p;
}

}  // namespace

std::vector<PromptInput> parse_prompts(const Json& body, const ModelContext& ctx, bool echo,
                                       bool add_special, const char* key) {
  const Json* prompt = field(body, key);
  if (!prompt) throw bad_request(key, fmt::format("'{}' is required", key));
  std::vector<PromptInput> out;
  if (prompt->is_string()) {
    out.push_back(text_prompt(prompt->get<std::string>(), ctx, add_special, key));
  } else if (prompt->is_array() && !prompt->empty()) {
    const Json& first = (*prompt)[0];
    if (first.is_number_integer()) {
      out.push_back(id_prompt(*prompt, ctx, echo, key));
    } else {
      for (const auto& p : *prompt) {
        if (p.is_string()) {
          out.push_back(text_prompt(p.get<std::string>(), ctx, add_special, key));
        } else if (p.is_array() && (p.empty() || p[0].is_number_integer())) {
          out.push_back(id_prompt(p, ctx, echo, key));
        } else {
          throw bad_request(key, fmt::format("'{}' must be a string, a list of strings, a list of "
                                             "token ids or a list of lists of token ids",
                                             key));
        }
      }
    }
  } else {
    throw bad_request(
        key,
        fmt::format("'{}' must be a non-empty string, list of strings or list of token ids", key));
  }
  for (const auto& p : out)
    if (p.token_ids.empty()) throw bad_request(key, fmt::format("the {} cannot be empty", key));
  return out;
}

namespace {

void check_range(bool ok, const char* param, const std::string& message) {
  if (!ok) throw bad_request(param, message);
}

// vLLM's bad_words: a string or a list of them, each tokenized as vLLM does: the word without
// leading spaces, and again after one space when that gives as many tokens but another first
// token (the word inside a text, for tokenizers that fold the space into the word's token).
std::vector<std::vector<int32_t>> parse_bad_words(const Json& body, const ModelContext& ctx) {
  const Json* words = field(body, "bad_words");
  if (!words) return {};
  std::vector<std::string> texts;
  if (words->is_string()) {
    texts.push_back(words->get<std::string>());
  } else if (words->is_array()) {
    for (const Json& w : *words) {
      if (!w.is_string())
        throw bad_request("bad_words", "'bad_words' must be a string or a list of strings");
      texts.push_back(w.get<std::string>());
    }
  } else {
    throw bad_request("bad_words", "'bad_words' must be a string or a list of strings");
  }
  const tokenizer::Tokenizer& tok = need_tokenizer(ctx, "bad_words");
  std::vector<std::vector<int32_t>> out;
  for (const std::string& text : texts) {
    const std::string_view word =
        std::string_view(text).substr(std::min(text.size(), text.find_first_not_of(" \t\n\r")));
    std::vector<int32_t> plain = tok.encode(word, /*add_special_tokens=*/false);
    if (plain.empty())
      throw bad_request("bad_words", "'bad_words' entries must not be empty or blank");
    std::string spaced_text = " ";
    spaced_text += word;
    std::vector<int32_t> spaced = tok.encode(spaced_text, /*add_special_tokens=*/false);
    const bool add_spaced = spaced.size() == plain.size() && spaced[0] != plain[0];
    out.push_back(std::move(plain));
    if (add_spaced) out.push_back(std::move(spaced));
  }
  return out;
}

// OpenAI's logit_bias: an object from token ids (as strings) to a bias in [-100, 100], added to
// the token's logit before sampling.
std::vector<std::pair<int32_t, float>> parse_logit_bias(const Json& body, const ModelContext& ctx) {
  std::vector<std::pair<int32_t, float>> out;
  const Json* bias = field(body, "logit_bias");
  if (!bias) return out;
  if (!bias->is_object())
    throw bad_request("logit_bias", "'logit_bias' must be an object of token id -> bias");
  for (auto it = bias->begin(); it != bias->end(); ++it) {
    const std::string& key = it.key();
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || key.empty())
      throw bad_request("logit_bias",
                        fmt::format("logit_bias key '{}' is not a token id (an integer)", key));
    if (id < 0 || id >= ctx.info->vocab_size)
      throw bad_request("logit_bias", fmt::format("logit_bias token id {} is outside the "
                                                  "vocabulary [0, {})",
                                                  id, ctx.info->vocab_size));
    if (!it->is_number())
      throw bad_request("logit_bias", fmt::format("logit_bias of token {} must be a number", id));
    const double v = it->get<double>();
    check_range(v >= -100 && v <= 100, "logit_bias",
                fmt::format("logit_bias of token {} must be in [-100, 100], got {}", id, v));
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(v));
  }
  return out;
}

// Generation modes serval does not have, refused rather than ignored: beam search, best_of
// candidates beyond n, and (completions) an insertion suffix.
void check_unsupported_modes(const Json& body, int n) {
  if (get_bool(body, "use_beam_search").value_or(false))
    throw bad_request("use_beam_search", "beam search is not supported by serval");
  if (auto best_of = get_int(body, "best_of"); best_of && *best_of != n)
    throw bad_request("best_of", fmt::format("best_of must equal n ({}): serval returns every "
                                             "sequence it generates, got {}",
                                             n, *best_of));
  if (const Json* suffix = field(body, "suffix");
      suffix && !(suffix->is_string() && suffix->get<std::string>().empty()))
    throw bad_request("suffix", "suffix (insertion) is not supported by serval");
}

// Fields common to completions and chat.
void parse_common(const Json& body, const ModelContext& ctx, GenerationRequest& req) {
  auto& s = req.sampling;
  s = ctx.info->default_sampling;
  s.logprobs = -1;
  if (auto v = get_number(body, "temperature")) {
    check_range(*v >= 0, "temperature", fmt::format("temperature must be >= 0, got {}", *v));
    s.temperature = static_cast<float>(*v);
  }
  if (auto v = get_number(body, "top_p")) {
    check_range(*v > 0 && *v <= 1, "top_p", fmt::format("top_p must be in (0, 1], got {}", *v));
    s.top_p = static_cast<float>(*v);
  }
  if (auto v = get_int(body, "top_k")) {
    check_range(*v >= -1, "top_k", fmt::format("top_k must be -1 (disable) or >= 1, got {}", *v));
    s.top_k = static_cast<int>(std::min<int64_t>(*v, 1 << 30));
  }
  if (auto v = get_number(body, "min_p")) {
    check_range(*v >= 0 && *v <= 1, "min_p", fmt::format("min_p must be in [0, 1], got {}", *v));
    s.min_p = static_cast<float>(*v);
  }
  if (auto v = get_number(body, "repetition_penalty")) {
    check_range(*v > 0 && *v <= 2, "repetition_penalty",
                fmt::format("repetition_penalty must be in (0, 2], got {}", *v));
    s.repetition_penalty = static_cast<float>(*v);
  }
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    if (auto v = get_number(body, name)) {
      check_range(*v >= -2 && *v <= 2, name,
                  fmt::format("{} must be in [-2, 2], got {}", name, *v));
      (std::string(name) == "presence_penalty" ? s.presence_penalty : s.frequency_penalty) =
          static_cast<float>(*v);
    }
  }
  if (auto v = get_int(body, "seed")) s.seed = static_cast<uint64_t>(*v);
  if (const Json* id = field(body, "request_id"); id && !id->is_null()) {
    check_range(id->is_string() && !id->get<std::string>().empty(), "request_id",
                "request_id must be a non-empty string");
    req.request_id = id->get<std::string>();
  }
  if (auto v = get_int(body, "priority")) {  // vLLM: lower is served first
    check_range(*v == 0 || ctx.priority_scheduling, "priority",
                fmt::format("priority {} needs the server's --scheduling-policy priority (it "
                            "serves requests first come, first served)",
                            *v));
    check_range(*v >= INT32_MIN && *v <= INT32_MAX, "priority",
                fmt::format("priority must fit in 32 bits, got {}", *v));
    s.priority = static_cast<int>(*v);
  }
  if (auto v = get_int(body, "n")) {
    check_range(*v >= 1, "n", fmt::format("n must be at least 1, got {}", *v));
    check_range(*v <= kMaxN, "n", fmt::format("n must be at most {}, got {}", kMaxN, *v));
    req.n = static_cast<int>(*v);
  }
  if (auto v = get_int(body, "max_tokens")) {
    check_range(*v >= 1, "max_tokens", fmt::format("max_tokens must be at least 1, got {}", *v));
    req.max_tokens = *v;  // kept as sent: the context-length error names this number
  }
  if (auto v = get_int(body, "min_tokens")) {
    check_range(*v >= 0, "min_tokens", fmt::format("min_tokens must be >= 0, got {}", *v));
    // Checked against the resolved max_tokens in resolve_max_tokens (chat sets it later).
    s.min_tokens = static_cast<int>(std::min<int64_t>(*v, 1 << 30));
  }
  if (const Json* stop = field(body, "stop")) {
    if (stop->is_string()) {
      req.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      check_range(
          stop->size() <= kMaxStopStrings, "stop",
          fmt::format("'stop' may hold at most {} strings, got {}", kMaxStopStrings, stop->size()));
      for (const auto& x : *stop) {
        if (!x.is_string())
          throw bad_request("stop", "'stop' must be a string or a list of strings");
        req.stop.push_back(x.get<std::string>());
      }
    } else {
      throw bad_request("stop", "'stop' must be a string or a list of strings");
    }
  }
  if (const Json* ids = field(body, "stop_token_ids")) {
    if (!ids->is_array()) throw bad_request("stop_token_ids", "'stop_token_ids' must be a list");
    s.stop_token_ids = token_list(*ids, ctx, "stop_token_ids");
  } else {
    s.stop_token_ids.clear();
  }
  if (auto v = get_bool(body, "ignore_eos")) s.ignore_eos = *v;
  if (auto v = get_bool(body, "include_stop_str_in_output")) req.include_stop_str_in_output = *v;
  s.logit_bias = parse_logit_bias(body, ctx);
  s.allowed_token_ids.clear();
  if (const Json* ids = field(body, "allowed_token_ids")) {
    if (!ids->is_array() || ids->empty())
      throw bad_request("allowed_token_ids", "'allowed_token_ids' must be a non-empty list");
    s.allowed_token_ids = token_list(*ids, ctx, "allowed_token_ids");
  }
  s.bad_words = parse_bad_words(body, ctx);
  parse_guided_decoding(body, s);
  check_unsupported_modes(body, req.n);
  if (auto v = get_bool(body, "skip_special_tokens")) req.skip_special_tokens = *v;
  req.return_tokens_as_token_ids =
      get_bool(body, "return_tokens_as_token_ids").value_or(ctx.return_tokens_as_token_ids);
  if (auto v = get_bool(body, "stream")) req.stream = *v;
  if (const Json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw bad_request("stream_options", "'stream_options' must be an object");
    if (!req.stream)
      throw bad_request("stream_options", "stream_options can only be set when stream is true");
    if (auto v = get_bool(*so, "include_usage")) req.include_usage = *v;
    if (auto v = get_bool(*so, "continuous_usage_stats")) req.continuous_usage = *v;
  }
  if (req.stream && ctx.force_include_usage) req.include_usage = true;
  if (auto v = get_int(body, "prompt_logprobs")) {
    check_range(*v >= 0 && *v <= ctx.max_logprobs, "prompt_logprobs",
                fmt::format("prompt_logprobs must be in [0, {}], got {}", ctx.max_logprobs, *v));
    check_range(!req.stream, "prompt_logprobs",
                "prompt_logprobs are not available when stream is true");
    req.prompt_logprobs = static_cast<int>(*v);
    s.prompt_logprobs = req.prompt_logprobs;
  }
}

}  // namespace

Json parse_body(const std::string& body, int max_depth) {
  // Depth pre-scan so that a deeply nested body is refused before any tree is built.
  if (json_nesting_depth(body, max_depth) > max_depth)
    throw bad_request("", fmt::format("JSON body is nested deeper than {} levels", max_depth));
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw bad_request("", "the request body is not valid JSON");
  if (!j.is_object()) throw bad_request("", "the request body must be a JSON object");
  return j;
}

const Json* field(const Json& body, const char* name) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> get_number(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw bad_request(name, fmt::format("'{}' must be a number", name));
  return v->get<double>();
}

std::optional<int64_t> get_int(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e15)
      return static_cast<int64_t>(d);
  }
  throw bad_request(name, fmt::format("'{}' must be an integer", name));
}

std::optional<bool> get_bool(const Json& body, const char* name) {
  const Json* v = field(body, name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw bad_request(name, fmt::format("'{}' must be a boolean", name));
  return v->get<bool>();
}

void truncate_prompts(const Json& body, const ModelContext& ctx,
                      std::vector<PromptInput>& prompts) {
  const auto k = get_int(body, "truncate_prompt_tokens");
  if (!k) return;
  check_range(*k == -1 || *k >= 1, "truncate_prompt_tokens",
              fmt::format("truncate_prompt_tokens must be an integer >= 1 or -1, got {}", *k));
  const int64_t max_len = ctx.info->max_model_len;
  check_range(
      *k <= max_len, "truncate_prompt_tokens",
      fmt::format("truncate_prompt_tokens ({}) is greater than max_model_len ({})", *k, max_len));
  const size_t keep = size_t(*k == -1 ? max_len : *k);
  for (PromptInput& p : prompts) {
    if (p.token_ids.size() <= keep) continue;
    p.token_ids.erase(p.token_ids.begin(), p.token_ids.end() - long(keep));
    if (ctx.tokenizer) p.text = ctx.tokenizer->decode(p.token_ids, false);
  }
}

namespace {

// A tool's function (an object with a string "name"), or null.
const Json* tool_function(const Json& tool) {
  const auto fn = tool.is_object() ? tool.find("function") : tool.end();
  if (fn == tool.end() || !fn->is_object() || !fn->value("name", Json()).is_string())
    return nullptr;
  return &*fn;
}

// A function's parameter schema (any object when it declares none), as JSON text.
std::string tool_parameters(const Json& fn) {
  return fn.contains("parameters") ? fn["parameters"].dump() : Json{{"type", "object"}}.dump();
}

// The tool calls a forced tool_choice generates under guided decoding: a named function's
// arguments (forced_tool), or for "required" a list of calls [{"name", "parameters"}] of the tools.
void force_tool_calls(const Json& tools, const std::string& forced, GenerationRequest& req) {
  if (tools.empty()) throw bad_request("tool_choice", "a forced tool call needs tools");
  if (req.sampling.json_grammar)
    throw bad_request("tool_choice", "a forced tool call and response_format cannot be combined");
  if (!forced.empty()) {
    for (const Json& t : tools)
      if (const Json* fn = tool_function(t); fn && (*fn)["name"] == forced) {
        req.sampling.json_grammar = compile_schema(tool_parameters(*fn), "tool_choice");
        req.forced_tool = forced;
        return;
      }
    throw bad_request("tool_choice",
                      fmt::format("tool_choice names '{}', which is not in tools", forced));
  }
  std::vector<std::pair<std::string, std::string>> schemas;
  for (const Json& t : tools) {
    const Json* fn = tool_function(t);
    if (!fn) throw bad_request("tools", "each tool needs a function with a name");
    schemas.emplace_back((*fn)["name"].get<std::string>(), tool_parameters(*fn));
  }
  req.sampling.json_grammar = grammar_or_400(
      "tools", [&] { return runtime::tool_calls_grammar(schemas, req.single_tool_call ? 1 : -1); });
  req.tool_call_list = true;
}

// Each function tool's parameter types from its JSON Schema (what is not a string type is left
// out: the parser then keeps the value as text).
ToolParameterTypes tool_parameter_types(const Json& tools) {
  ToolParameterTypes types;
  for (const Json& tool : tools) {
    const Json* fn = tool.is_object() ? field(tool, "function") : nullptr;
    const Json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    const Json* params = fn && fn->is_object() ? field(*fn, "parameters") : nullptr;
    const Json* props = params && params->is_object() ? field(*params, "properties") : nullptr;
    if (!name || !name->is_string() || !props || !props->is_object()) continue;
    auto& out = types[name->get<std::string>()];
    for (const auto& [key, schema] : props->items()) {
      const Json* type = schema.is_object() ? field(schema, "type") : nullptr;
      if (type && type->is_array() && !type->empty()) type = &(*type)[0];
      if (type && type->is_string()) out[key] = type->get<std::string>();
    }
  }
  return types;
}

// tool_choice: "none", "auto" (the server's parser reads calls out of free text), a named function
// or "required" (force_tool_calls).
void parse_tool_choice(const Json& body, const ModelContext& ctx, GenerationRequest& req) {
  const Json* tools = field(body, "tools");
  if (tools && !tools->is_array()) throw bad_request("tools", "'tools' must be a list");
  const bool has_tools = tools && !tools->empty();
  const Json* choice = field(body, "tool_choice");
  // OpenAI's parallel_tool_calls: false allows one call per reply.
  req.single_tool_call = !get_bool(body, "parallel_tool_calls").value_or(true);
  std::string mode = has_tools ? "auto" : "none";
  std::string forced;
  if (choice && choice->is_object()) {
    const auto fn = choice->find("function");
    if (choice->value("type", Json()) != "function" || fn == choice->end() || !fn->is_object() ||
        !(*fn).value("name", Json()).is_string())
      throw bad_request(
          "tool_choice",
          "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}");
    forced = (*fn)["name"].get<std::string>();
  } else if (choice) {
    if (!choice->is_string())
      throw bad_request("tool_choice", "tool_choice must be a string or a named function");
    mode = choice->get<std::string>();
  }
  if (!forced.empty() || mode == "required")
    return force_tool_calls(tools ? *tools : Json::array(), forced, req);
  if (mode == "none") return;
  if (mode != "auto")
    throw bad_request("tool_choice",
                      fmt::format("tool_choice must be \"none\", \"auto\", \"required\" or a "
                                  "named function, got \"{}\"",
                                  mode));
  if (!has_tools) throw bad_request("tool_choice", "tool_choice \"auto\" needs tools");
  if (ctx.tool_call_parser == ToolCallParser::kNone)
    throw bad_request("tool_choice",
                      "\"auto\" tool choice requires --enable-auto-tool-choice and "
                      "--tool-call-parser to be set");
  req.parse_tool_calls = true;
  if (ctx.tool_call_parser == ToolCallParser::kQwen3Coder)  // the one parser that types values
    req.tool_types = tool_parameter_types(*tools);
  // Mistral's [TOOL_CALLS] is a special token, DeepSeek's <｜tool▁…｜> markers are added tokens
  // that some tokenizers mark special: the parser must see them (as vLLM does).
  if (ctx.tool_call_parser == ToolCallParser::kMistral ||
      ctx.tool_call_parser == ToolCallParser::kDeepSeekV3 ||
      ctx.tool_call_parser == ToolCallParser::kDeepSeekV31)
    req.skip_special_tokens = false;
}

}  // namespace

GenerationRequest parse_completion_request(const Json& body, const ModelContext& ctx) {
  GenerationRequest req;
  req.kind = ApiKind::kCompletion;
  parse_common(body, ctx, req);
  if (auto v = get_bool(body, "echo")) req.echo = *v;
  if (auto v = get_int(body, "logprobs")) {
    check_range(
        *v >= 0 && *v <= ctx.max_logprobs, "logprobs",
        fmt::format("logprobs must be in [0, {}] (--max-logprobs), got {}", ctx.max_logprobs, *v));
    req.logprobs = static_cast<int>(*v);
  }
  if (req.echo && req.logprobs >= 0) {  // the prompt's logprobs come first
    req.echo_logprobs = true;
    req.sampling.prompt_logprobs = std::max(req.sampling.prompt_logprobs, req.logprobs);
  }
  bool add_special = get_bool(body, "add_special_tokens").value_or(true);
  req.prompts = parse_prompts(body, ctx, req.echo, add_special);
  truncate_prompts(body, ctx, req.prompts);
  return req;
}

namespace {

// As vLLM, and as tool-use chat templates expect (Llama 3.1's writes `arguments | tojson`): an
// assistant message's tool-call arguments, a JSON text in OpenAI's messages, reach the template
// as the value the text encodes. A text that is not JSON is a 400 naming the call.
void decode_tool_call_arguments(Json& message, size_t index) {
  const auto calls = message.find("tool_calls");
  if (calls == message.end() || !calls->is_array()) return;
  for (size_t j = 0; j < calls->size(); ++j) {
    Json& call = (*calls)[j];
    const auto fn = call.is_object() ? call.find("function") : call.end();
    if (fn == call.end() || !fn->is_object()) continue;
    const auto args = fn->find("arguments");
    if (args == fn->end() || !args->is_string()) continue;
    const std::string& text = args->get_ref<const std::string&>();
    constexpr int kMaxDepth = 64;
    Json value = json_nesting_depth(text, kMaxDepth) > kMaxDepth
                     ? Json(Json::value_t::discarded)
                     : Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded())
      throw bad_request("messages",
                        fmt::format("messages[{}].tool_calls[{}].function.arguments must be a JSON "
                                    "text (nested at most {} deep)",
                                    index, j, kMaxDepth));
    *args = std::move(value);
  }
}

}  // namespace

std::string render_chat(const Json& body, const ModelContext& ctx, bool default_add_gen_prompt) {
  const Json* msgs = field(body, "messages");
  if (!msgs || !msgs->is_array() || msgs->empty())
    throw bad_request("messages", "'messages' must be a non-empty list");
  const bool content_as_parts = ctx.content_format == ContentFormat::kOpenAi ||
                                (ctx.content_format == ContentFormat::kAuto && ctx.chat_template &&
                                 ctx.chat_template->iterates_message_content());
  Json messages = Json::array();
  for (const auto& m : *msgs) {
    if (!m.is_object()) throw bad_request("messages", "each message must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string())
      throw bad_request("messages", "each message needs a string 'role'");
    std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer")
      throw bad_request("messages", fmt::format("unknown message role '{}'", r));
    Json out = m;
    if (r == "assistant") decode_tool_call_arguments(out, messages.size());
    auto content = m.find("content");
    if (content != m.end() && content->is_array()) {
      std::string text;
      Json parts = Json::array();
      for (const auto& part : *content) {
        // find() is end() for a non-object; Json::value() would throw a type_error (a 500) for a
        // "type" that is not a string.
        const auto type = part.find("type");
        const auto part_text = part.find("text");
        if (!part.is_object() || type == part.end() || *type != "text" || part_text == part.end() ||
            !part_text->is_string())
          throw bad_request("messages", "content parts must be {\"type\":\"text\",\"text\":...}");
        if (!text.empty()) text += "\n";
        text += part_text->get<std::string>();
        parts.push_back({{"type", "text"}, {"text", *part_text}});
      }
      out["content"] = content_as_parts ? parts : Json(text);
    } else if (content != m.end() && !content->is_string() && !content->is_null()) {
      throw bad_request("messages", "message 'content' must be a string or a list of text parts");
    } else if (content == m.end() && r != "assistant") {
      throw bad_request("messages", fmt::format("a '{}' message needs 'content'", r));
    } else if (content != m.end() && content->is_string() && content_as_parts) {
      out["content"] = Json::array({{{"type", "text"}, {"text", *content}}});  // as vLLM
    }
    messages.push_back(std::move(out));
  }
  if (!ctx.chat_template)
    throw bad_request("messages", "the model has no chat template; use /v1/completions");
  const auto& tok = need_tokenizer(ctx, "messages");
  const std::optional<bool> add_gen_asked = get_bool(body, "add_generation_prompt");
  // continue_final_message (vLLM, transformers): the prompt ends inside the last message, which
  // the model continues; no generation prompt.
  const bool continue_final = get_bool(body, "continue_final_message").value_or(false);
  if (continue_final && add_gen_asked.value_or(false))
    throw bad_request("continue_final_message",
                      "continue_final_message and add_generation_prompt cannot both be true");
  const bool add_gen = !continue_final && add_gen_asked.value_or(default_add_gen_prompt);
  Json tools = field(body, "tools") ? body["tools"] : Json();
  Json extra = Json::object();
  if (const Json* kw = field(body, "chat_template_kwargs")) {
    if (!kw->is_object())
      throw bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
    extra = *kw;
  }
  std::string rendered;
  try {
    rendered = ctx.chat_template->render(messages, add_gen, tools, tok.bos_token(), tok.eos_token(),
                                         extra);
  } catch (const InvalidArgument& e) {
    throw bad_request("messages", std::string("chat template: ") + e.what());
  }
  if (continue_final) {  // cut after the last message's text (trimmed: templates may trim it)
    const Json& last = messages.back()["content"];
    std::string text = last.is_string() ? last.get<std::string>() : std::string();
    const size_t b = text.find_first_not_of(" \t\r\n");
    text = b == std::string::npos ? "" : text.substr(b, text.find_last_not_of(" \t\r\n") - b + 1);
    const size_t at = text.empty() ? std::string::npos : rendered.rfind(text);
    if (at == std::string::npos)
      throw bad_request("continue_final_message",
                        "continue_final_message needs a final message whose text appears in the "
                        "rendered chat");
    rendered.resize(at + text.size());
  }
  return rendered;
}

GenerationRequest parse_chat_request(const Json& body, const ModelContext& ctx) {
  GenerationRequest req;
  req.kind = ApiKind::kChat;
  parse_common(body, ctx, req);
  if (auto v = get_int(body, "max_completion_tokens")) {
    check_range(*v >= 1, "max_completion_tokens",
                fmt::format("max_completion_tokens must be at least 1, got {}", *v));
    req.max_tokens = *v;
  }
  bool want_logprobs = get_bool(body, "logprobs").value_or(false);
  if (auto v = get_int(body, "top_logprobs")) {
    check_range(want_logprobs, "top_logprobs", "top_logprobs requires logprobs to be true");
    check_range(*v >= 0 && *v <= ctx.max_logprobs, "top_logprobs",
                fmt::format("top_logprobs must be in [0, {}], got {}", ctx.max_logprobs, *v));
    req.logprobs = static_cast<int>(*v);
  } else if (want_logprobs) {
    req.logprobs = 0;
  }
  parse_tool_choice(body, ctx, req);
  if (ctx.reasoning_parser != ReasoningParser::kNone) {
    std::optional<bool> enable_thinking, thinking;
    if (const Json* kw = field(body, "chat_template_kwargs"); kw && kw->is_object()) {
      if (auto v = kw->find("enable_thinking"); v != kw->end() && v->is_boolean())
        enable_thinking = v->get<bool>();
      if (auto v = kw->find("thinking"); v != kw->end() && v->is_boolean())
        thinking = v->get<bool>();
    }
    req.split_reasoning = true;
    req.starts_in_reasoning = starts_in_reasoning(ctx.reasoning_parser, enable_thinking, thinking);
    // Markers that are special tokens must reach the parser (as vLLM keeps them).
    if (reasoning_markers_are_special(ctx.reasoning_parser)) req.skip_special_tokens = false;
  }
  req.include_reasoning = get_bool(body, "include_reasoning").value_or(true);
  // A thinking reply's JSON comes after its thoughts, as with vLLM's reasoning parsers.
  req.sampling.guided_after_think = req.sampling.json_grammar && req.starts_in_reasoning;
  std::string text = render_chat(body, ctx, true);
  const bool continued = get_bool(body, "continue_final_message").value_or(false);
  req.response_role = !continued && get_bool(body, "add_generation_prompt").value_or(true)
                          ? ctx.response_role
                          : body["messages"].back()["role"].get<std::string>();  // checked
  bool add_special = get_bool(body, "add_special_tokens").value_or(false);
  PromptInput p;
  p.token_ids = need_tokenizer(ctx, "messages").encode(text, add_special);
  p.text = std::move(text);
  if (p.token_ids.empty()) throw bad_request("messages", "the rendered prompt is empty");
  req.prompts.push_back(std::move(p));
  truncate_prompts(body, ctx, req.prompts);
  return req;
}

int resolve_max_tokens(const GenerationRequest& req, int prompt_len, int max_model_len,
                       int max_new_tokens) {
  const char* param = req.kind == ApiKind::kChat        ? "max_completion_tokens"
                      : req.kind == ApiKind::kResponses ? "max_output_tokens"
                                                        : "max_tokens";
  if (prompt_len >= max_model_len)
    throw bad_request("prompt", fmt::format("This model's maximum context length is {} tokens, "
                                            "but the prompt has {} tokens",
                                            max_model_len, prompt_len));
  int64_t max_tokens =
      req.max_tokens.value_or(req.kind == ApiKind::kCompletion ? 16 : max_model_len - prompt_len);
  // Compared as the room left (prompt + max_tokens overflows int64 for a max_tokens near 2^63);
  // the total in the message is exact in uint64 (both terms are in [0, 2^63)).
  if (max_tokens > max_model_len - prompt_len)
    throw bad_request(param, fmt::format("This model's maximum context length is {} tokens. "
                                         "However, you requested {} tokens ({} in the prompt, {} "
                                         "for the completion). Please reduce the prompt or {}.",
                                         max_model_len, uint64_t(prompt_len) + uint64_t(max_tokens),
                                         prompt_len, max_tokens, param));
  if (max_new_tokens > 0) max_tokens = std::min<int64_t>(max_tokens, max_new_tokens);
  if (req.sampling.min_tokens > max_tokens)
    throw bad_request("min_tokens", fmt::format("min_tokens ({}) must be <= {} ({})",
                                                req.sampling.min_tokens, param, max_tokens));
  return static_cast<int>(max_tokens);  // <= max_model_len - prompt_len
}

}  // namespace serval::server
