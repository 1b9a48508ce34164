// Generation requests: fan-out to engine sequences and OpenAI (streamed) responses.
#include "server/generation_job.h"

#include <fmt/format.h>

#include <optional>
#include <utility>

#include "base/clock.h"
#include "base/log.h"
#include "server/api_error.h"
#include "server/logprobs_json.h"
#include "server/random_id.h"
#include "server/reasoning_parser.h"
#include "server/response_store.h"
#include "server/stop_matcher.h"
#include "server/submit_error.h"
#include "server/tool_call_parser.h"
#include "tokenizer/tokenizer.h"

namespace serval::server {

// A tool call a chat stream has begun: its id and the arguments sent so far.
struct StreamedToolCall {
  std::string id;
  std::string arguments;
};

struct Sequence {
  Sequence(size_t prompt_index, int index, std::vector<std::string> stops, bool include_stop)
      : prompt_index(prompt_index), index(index), stop(std::move(stops), include_stop) {}
  size_t prompt_index;
  int index;  // choice index: prompt_index * n + j
  uint64_t id = 0;
  bool submitted = false;
  bool finished = false;
  std::string finish_reason;
  std::unique_ptr<tokenizer::IncrementalDetokenizer> detok;
  StopMatcher stop;
  std::string text;          // everything emitted so far (stream: also what was sent)
  std::string delta;         // stream: emitted but not yet sent
  size_t decoded_bytes = 0;  // detokenized bytes including held-back text (text_offset)
  int num_tokens = 0;
  int num_cached_tokens = 0;  // prompt tokens the engine served from the prefix cache
  Json logprobs;  // completions: {tokens, token_logprobs, top_logprobs, text_offset}; chat: [..]
  bool first_token_seen = false;
  double last_token_s = 0;
  std::vector<runtime::LogprobEntry> prompt_logprobs;  // entry i: prompt token i + 1
  size_t content_sent = 0;                        // parsed stream: bytes of the content part sent
  size_t reasoning_sent = 0;                      // parsed stream: bytes of the reasoning part sent
  std::vector<StreamedToolCall> tool_calls_sent;  // parsed stream: the calls begun, in order
  bool echo_logprobs_added = false;
  bool role_sent = false;  // chat stream: the chunk with the reply's role went out
};

namespace {

// `cached` (--enable-prompt-tokens-details): prompt tokens from the prefix cache, else nullopt.
Json usage_json(int64_t prompt, int64_t completion, std::optional<int64_t> cached) {
  Json usage = {{"prompt_tokens", prompt},
                {"completion_tokens", completion},
                {"total_tokens", prompt + completion}};
  if (cached) usage["prompt_tokens_details"] = {{"cached_tokens", *cached}};
  return usage;
}

// OpenAI's message.tool_calls.
Json tool_calls_json(const std::vector<ToolCall>& calls, ToolCallParser parser) {
  Json out = Json::array();
  for (const ToolCall& call : calls)
    out.push_back({{"id", new_tool_call_id(parser)},
                   {"type", "function"},
                   {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  return out;
}

// A stream's delta.tool_calls entries that bring the calls sent up to `calls` (each one's
// arguments extending what was sent, as the parsers promise): a new call's entry has its index,
// id, type, name and arguments so far, a begun one's its index and the arguments added since,
// as OpenAI streams them. Empty when nothing is new.
Json tool_call_deltas(const std::vector<ToolCall>& calls, std::vector<StreamedToolCall>& sent,
                      ToolCallParser parser) {
  Json entries = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string& arguments = calls[i].arguments;
    if (i == sent.size()) {
      sent.push_back({new_tool_call_id(parser), arguments});
      entries.push_back({{"index", i},
                         {"id", sent[i].id},
                         {"type", "function"},
                         {"function", {{"name", calls[i].name}, {"arguments", arguments}}}});
    } else if (arguments.size() > sent[i].arguments.size() &&
               arguments.starts_with(sent[i].arguments)) {
      entries.push_back(
          {{"index", i},
           {"function", {{"arguments", arguments.substr(sent[i].arguments.size())}}}});
      sent[i].arguments = arguments;
    }
  }
  return entries;
}

// The response's id: its kind's prefix, then the request's own id (completions and chat) or a
// random one.
std::string response_id(const GenerationRequest& req) {
  if (req.kind == ApiKind::kResponses) return random_id("resp_");
  const char* prefix = req.kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-";
  return req.request_id.empty() ? random_id(prefix) : prefix + req.request_id;
}

// Adds the entries of tool_call_deltas to a stream's delta, if there are any.
void add_tool_call_deltas(Json& delta, const std::vector<ToolCall>& calls,
                          std::vector<StreamedToolCall>& sent, ToolCallParser parser) {
  Json entries = tool_call_deltas(calls, sent, parser);
  if (!entries.empty()) delta["tool_calls"] = std::move(entries);
}

}  // namespace

GenerationJob::GenerationJob(runtime::Engine& engine, const ModelContext& ctx,
                             GenerationRequest req, std::string model_name,
                             std::shared_ptr<Responder> responder, Metrics& metrics,
                             double arrival_s, std::function<void()> on_done)
    : engine_(engine),
      ctx_(ctx),
      req_(std::move(req)),
      model_name_(std::move(model_name)),
      res_(std::move(responder)),
      metrics_(metrics),
      arrival_s_(arrival_s),
      on_done_(std::move(on_done)),
      id_(response_id(req_)),
      created_(unix_time_seconds()) {
  if (req_.kind == ApiKind::kResponses)
    responses_ = std::make_unique<ResponsesWriter>(id_, model_name_, created_, req_.responses_echo);
}

GenerationJob::~GenerationJob() = default;

void GenerationJob::start() {
  const int max_model_len = ctx_.info->max_model_len;
  std::vector<int> max_tokens;
  for (const auto& p : req_.prompts)
    max_tokens.push_back(resolve_max_tokens(req_, static_cast<int>(p.token_ids.size()),
                                            max_model_len, ctx_.info->max_new_tokens));
  for (size_t p = 0; p < req_.prompts.size(); ++p)
    for (int j = 0; j < req_.n; ++j) {
      auto s = std::make_unique<Sequence>(p, static_cast<int>(p) * req_.n + j, req_.stop,
                                          req_.include_stop_str_in_output);
      if (ctx_.tokenizer)
        s->detok = std::make_unique<tokenizer::IncrementalDetokenizer>(*ctx_.tokenizer,
                                                                       req_.skip_special_tokens);
      if (req_.logprobs >= 0)
        s->logprobs =
            req_.kind == ApiKind::kCompletion ? empty_completion_logprobs() : Json::array();
      if (req_.echo) s->decoded_bytes = req_.prompts[p].text.size();
      seqs_.push_back(std::move(s));
    }
  num_unfinished_ = static_cast<int>(seqs_.size());
  auto self = shared_from_this();
  try {
    for (size_t i = 0; i < seqs_.size(); ++i) {
      Sequence& s = *seqs_[i];
      runtime::SamplingParams sp = req_.sampling;
      sp.max_tokens = max_tokens[s.prompt_index];
      sp.logprobs = req_.logprobs;
      if (sp.seed && req_.n > 1) *sp.seed += static_cast<uint64_t>(i % req_.n);
      s.id = engine_.submit(req_.prompts[s.prompt_index].token_ids, sp,
                            [self, i, res = res_](const runtime::RequestOutput& out) {
                              res->post([self, i, out] { self->on_output(i, out); });
                            });
      s.submitted = true;
    }
  } catch (...) {
    done_ = true;
    abort_all();
    rethrow_submit_error("");
  }
  res_->on_disconnect([self] {
    log::info("client disconnected; aborting {}", self->id_);
    self->done_ = true;
    self->abort_all();
  });
  if (!req_.stream) return;
  res_->start_stream("text/event-stream");
  if (responses_) return res_->write_chunk(responses_->start_events());
  if (req_.kind == ApiKind::kCompletion && req_.echo)
    for (auto& s : seqs_) s->delta = req_.prompts[s->prompt_index].text;
}

// The chat chunk that names the reply's role. Sent with a choice's first output, as vLLM does,
// not when the request arrives: benchmarks that time the first chunk (vLLM's `bench serve`)
// then measure the time to the first token.
void GenerationJob::send_role_chunk(Sequence& s) {
  Json chunk = envelope("chat.completion.chunk");
  chunk["choices"] = Json::array({Json{{"index", s.index},
                                       {"delta", {{"role", req_.response_role}, {"content", ""}}},
                                       {"logprobs", nullptr},
                                       {"finish_reason", nullptr}}});
  if (req_.include_usage && req_.continuous_usage)  // before its tokens, as vLLM counts them
    chunk["usage"] = usage_json(static_cast<int64_t>(req_.prompts[s.prompt_index].token_ids.size()),
                                0, cached_if_reported(s.num_cached_tokens));
  res_->write_chunk("data: " + chunk.dump() + "\n\n");
  s.role_sent = true;
}

void GenerationJob::abort_all() {
  for (auto& s : seqs_)
    if (s->submitted && !s->finished) engine_.abort(s->id);
}

std::string GenerationJob::token_text(int32_t id) const {
  if (!ctx_.tokenizer || req_.return_tokens_as_token_ids) return fmt::format("token_id:{}", id);
  int32_t ids[1] = {id};
  return ctx_.tokenizer->decode(std::span<const int32_t>(ids, 1), false);
}

TokenText GenerationJob::token_texts() const {
  return [this](int32_t id) { return token_text(id); };
}

void GenerationJob::add_logprobs(Sequence& s, const runtime::LogprobEntry& e) {
  if (req_.kind == ApiKind::kCompletion)
    append_completion_logprob(s.logprobs, e, s.decoded_bytes, token_texts());
  else  // chat, and the Responses API's output_text logprobs (the same entries)
    s.logprobs.push_back(chat_logprob(e, token_texts()));
}

void GenerationJob::emit_text(Sequence& s, const std::string& text) {
  s.text += text;
  if (req_.stream) s.delta += text;
}

void GenerationJob::finish(Sequence& s, const std::string& reason) {
  s.finished = true;
  // "abort" is no OpenAI value: a request the engine cut short reports what it has as "length".
  s.finish_reason = reason == "abort" ? "length" : reason;
  metrics_.count_finished(reason);
  --num_unfinished_;
}

void GenerationJob::on_output(size_t seq, const runtime::RequestOutput& out) {
  Sequence& s = *seqs_[seq];
  if (s.finished) return;
  if (done_) {  // client gone: only account for the final updates
    if (out.finish) finish(s, "abort");
    if (num_unfinished_ == 0 && on_done_) std::exchange(on_done_, nullptr)();
    return;
  }
  if (!out.error.empty()) {
    log::error("request {} failed in the engine: {}", id_, out.error);
    finish(s, "abort");
    return fail(500, "the engine failed: " + out.error);
  }
  if (!out.prompt_logprobs.empty()) s.prompt_logprobs = out.prompt_logprobs;
  s.num_cached_tokens = std::max(s.num_cached_tokens, out.num_cached_tokens);
  if (req_.echo_logprobs && !s.echo_logprobs_added && !out.new_token_ids.empty()) {
    // The first update with tokens carries the prompt's logprobs: the echoed prompt's entries go
    // before the generated ones (streamed: in the first chunk, with the echoed text).
    append_echo_logprobs(s.logprobs, req_.prompts[s.prompt_index].token_ids, s.prompt_logprobs,
                         req_.logprobs, token_texts());
    s.echo_logprobs_added = true;
  }
  double now = now_seconds();
  if (!out.new_token_ids.empty()) {
    if (!s.first_token_seen)
      metrics_.observe_ttft(now - arrival_s_);
    else
      metrics_.observe_inter_token(now - s.last_token_s);
    s.first_token_seen = true;
    s.last_token_s = now;
  }
  for (size_t i = 0; i < out.new_token_ids.size(); ++i) {
    int32_t tok = out.new_token_ids[i];
    ++s.num_tokens;
    if (req_.logprobs >= 0 && i < out.logprobs.size()) add_logprobs(s, out.logprobs[i]);
    bool is_stop_token = out.finish && out.stop_token_id && *out.stop_token_id == tok &&
                         i + 1 == out.new_token_ids.size();
    // A stop token's text (an EOS is usually a special token, skipped anyway) only on request.
    if ((is_stop_token && !req_.include_stop_str_in_output) || !s.detok) continue;
    std::string piece = s.detok->push(tok);
    s.decoded_bytes += piece.size();
    emit_text(s, s.stop.push(piece));
    if (s.stop.stopped()) {
      finish(s, "stop");
      engine_.abort(s.id);
      break;
    }
  }
  if (!s.finished && out.finish) {
    if (s.detok) {
      emit_text(s, s.stop.push(s.detok->finish()));
      if (!s.stop.stopped()) emit_text(s, s.stop.flush());
    }
    switch (*out.finish) {
      case runtime::FinishReason::kStop:
        finish(s, "stop");
        break;
      case runtime::FinishReason::kLength:
        finish(s, "length");
        break;
      case runtime::FinishReason::kAbort:
        finish(s, "abort");
        break;
    }
  }
  if (req_.stream) send_chunk(s, !out.new_token_ids.empty());
  if (num_unfinished_ == 0) complete();
}

Json GenerationJob::envelope(const char* object) const {
  return Json{{"id", id_}, {"object", object}, {"created", created_}, {"model", model_name_}};
}

// Each prompt counts once (its first sequence's cache hits; the others share its prompt).
Json GenerationJob::usage() const {
  int64_t prompt = 0, completion = 0, cached = 0;
  for (const auto& p : req_.prompts) prompt += static_cast<int64_t>(p.token_ids.size());
  for (const auto& s : seqs_) {
    completion += s->num_tokens;
    if (s->index % req_.n == 0) cached += s->num_cached_tokens;
  }
  return usage_json(prompt, completion, cached_if_reported(cached));
}

std::optional<int64_t> GenerationJob::cached_if_reported(int64_t cached) const {
  return ctx_.prompt_tokens_details ? std::optional<int64_t>(cached) : std::nullopt;
}

// The server's parser's calls, only the first with parallel_tool_calls false.
ParsedToolCalls GenerationJob::parse_auto_tool_calls(std::string_view content) const {
  ParsedToolCalls parsed = parse_tool_calls(ctx_.tool_call_parser, content, req_.tool_types);
  if (req_.single_tool_call && parsed.calls.size() > 1) parsed.calls.resize(1);
  return parsed;
}

// Tool parsing in a chat stream: content goes out up to where a call may begin, each call as far
// as the text shows it (its name first, then its arguments as they grow); when the sequence ends,
// the rest of the content and of the calls (finish_reason "tool_calls"), or, without calls, the
// held-back text as content (after any call begun: a reply that was not calls after all).
void GenerationJob::add_tool_stream_delta(Json& delta, Sequence& s,
                                          std::string_view content) const {
  size_t upto = tool_call_content_prefix(ctx_.tool_call_parser, content);
  std::vector<ToolCall> calls;
  if (s.finished) {
    ParsedToolCalls parsed = parse_auto_tool_calls(content);
    calls = std::move(parsed.calls);
    upto = calls.empty() ? content.size() : parsed.content.size();
    if (!calls.empty()) s.finish_reason = "tool_calls";
  } else {
    calls = streamed_tool_calls(ctx_.tool_call_parser, content, req_.tool_types);
    if (req_.single_tool_call && calls.size() > 1) calls.resize(1);
  }
  if (upto > s.content_sent) {
    delta["content"] = std::string(content.substr(s.content_sent, upto - s.content_sent));
    s.content_sent = upto;
  }
  add_tool_call_deltas(delta, calls, s.tool_calls_sent, ctx_.tool_call_parser);
}

// The reasoning part goes out as `reasoning` (and `reasoning_content`, its earlier vLLM name),
// the content part as `content` or through the tool parser; each part only as far as it is known
// (split_reasoning holds back a possible tag).
bool GenerationJob::parsed_output() const {
  return req_.parse_tool_calls || req_.split_reasoning || !req_.forced_tool.empty() ||
         req_.tool_call_list;
}

Json GenerationJob::chat_stream_delta(Sequence& s) const {
  Json delta = Json::object();
  ReasoningParts parts;
  std::string_view content = s.text;
  if (req_.split_reasoning) {
    parts = split_reasoning(ctx_.reasoning_parser, s.text, req_.starts_in_reasoning, s.finished);
    if (parts.reasoning.size() > s.reasoning_sent) {
      if (req_.include_reasoning) {
        const std::string piece = parts.reasoning.substr(s.reasoning_sent);
        delta["reasoning"] = piece;
        delta["reasoning_content"] = piece;
      }
      s.reasoning_sent = parts.reasoning.size();
    }
    content = parts.content;
  }
  if (!req_.forced_tool.empty()) {  // the output is the call's arguments
    add_tool_call_deltas(delta, {forced_call(content)}, s.tool_calls_sent, ctx_.tool_call_parser);
  } else if (req_.tool_call_list) {  // the calls as they come; a text that is no list: as text
    const std::vector<ToolCall> calls =
        s.finished ? parse_tool_call_list(content) : streamed_tool_call_list(content);
    add_tool_call_deltas(delta, calls, s.tool_calls_sent, ctx_.tool_call_parser);
    if (s.finished && !calls.empty()) s.finish_reason = "tool_calls";
    if (s.finished && calls.empty() && !content.empty()) delta["content"] = std::string(content);
  } else if (req_.parse_tool_calls) {
    add_tool_stream_delta(delta, s, content);
  } else if (content.size() > s.content_sent) {
    delta["content"] = std::string(content.substr(s.content_sent));
    s.content_sent = content.size();
  }
  return delta;
}

ToolCall GenerationJob::forced_call(std::string_view arguments) const {
  return ToolCall{req_.forced_tool, std::string(arguments)};
}

Json GenerationJob::chat_message(const Sequence& s, std::string& finish_reason) const {
  Json message = {{"role", req_.response_role}, {"content", s.text}};
  ReasoningParts parts;
  std::string_view content = s.text;
  if (req_.split_reasoning) {
    parts = split_reasoning(ctx_.reasoning_parser, s.text, req_.starts_in_reasoning, true);
    content = parts.content;
    // As vLLM: an empty part is null.
    message["content"] = content.empty() ? Json(nullptr) : Json(std::string(content));
    const Json reasoning =
        parts.reasoning.empty() || !req_.include_reasoning ? Json(nullptr) : Json(parts.reasoning);
    message["reasoning"] = reasoning;
    message["reasoning_content"] = reasoning;
  }
  if (!req_.forced_tool.empty()) {  // as OpenAI: no content beside the forced call
    message["content"] = nullptr;
    message["tool_calls"] = tool_calls_json({forced_call(content)}, ctx_.tool_call_parser);
  } else if (req_.tool_call_list) {
    const std::vector<ToolCall> calls = parse_tool_call_list(content);
    if (!calls.empty()) {  // else (cut short) the text as it came
      message["content"] = nullptr;
      message["tool_calls"] = tool_calls_json(calls, ctx_.tool_call_parser);
      finish_reason = "tool_calls";
    }
  } else if (req_.parse_tool_calls) {
    const ParsedToolCalls parsed = parse_auto_tool_calls(content);
    if (!parsed.calls.empty()) {  // as vLLM: no content → null; finish "tool_calls"
      message["content"] = parsed.content.empty() ? Json(nullptr) : Json(parsed.content);
      message["tool_calls"] = tool_calls_json(parsed.calls, ctx_.tool_call_parser);
      finish_reason = "tool_calls";
    }
  }
  return message;
}

Json GenerationJob::sequence_usage(const Sequence& s) const {
  return usage_json(static_cast<int64_t>(req_.prompts[s.prompt_index].token_ids.size()),
                    s.num_tokens, cached_if_reported(s.num_cached_tokens));
}

void GenerationJob::add_continuous_usage(Json& chunk, const Sequence& s) const {
  if (req_.include_usage && req_.continuous_usage) chunk["usage"] = sequence_usage(s);
}

// Like vLLM, one chunk per engine update that produced tokens, even when their text is held
// back (a partial UTF-8 character or a possible stop-string prefix): clients count tokens and
// inter-token latency by chunks.
void GenerationJob::send_chunk(Sequence& s, bool had_tokens) {
  if (responses_) return send_responses_events(s);
  bool has_logprobs =
      req_.logprobs >= 0 &&
      (req_.kind == ApiKind::kChat ? !s.logprobs.empty() : !s.logprobs["tokens"].empty());
  if (s.delta.empty() && !has_logprobs && !s.finished && !had_tokens) return;
  if (req_.kind == ApiKind::kChat && !s.role_sent) send_role_chunk(s);
  Json choice = {{"index", s.index}};
  Json lp = nullptr;
  if (has_logprobs) lp = req_.kind == ApiKind::kChat ? Json{{"content", s.logprobs}} : s.logprobs;
  Json chunk;
  if (req_.kind == ApiKind::kChat) {
    chunk = envelope("chat.completion.chunk");
    choice["delta"] = parsed_output()   ? chat_stream_delta(s)
                      : s.delta.empty() ? Json::object()
                                        : Json{{"content", s.delta}};
  } else {
    chunk = envelope("text_completion");
    choice["text"] = s.delta;
  }
  choice["logprobs"] = std::move(lp);
  choice["finish_reason"] = s.finished ? Json(s.finish_reason) : Json(nullptr);
  chunk["choices"] = Json::array({std::move(choice)});
  add_continuous_usage(chunk, s);
  res_->write_chunk("data: " + chunk.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n\n");
  s.delta.clear();
  if (req_.logprobs >= 0)
    s.logprobs = req_.kind == ApiKind::kChat ? Json::array() : empty_completion_logprobs();
}

void GenerationJob::send_responses_events(Sequence& s) {
  std::string reasoning, content = s.delta;
  Json calls = Json::array();
  if (parsed_output()) {  // as chat's deltas: reasoning, content, then the calls as they come
    const Json delta = chat_stream_delta(s);
    reasoning = delta.value("reasoning", "");
    content = delta.value("content", "");
    calls = delta.value("tool_calls", Json::array());
  }
  // Logprobs of the tokens whose text is held back (reasoning, a call) ride on the next text.
  std::string events = responses_->delta_events(reasoning, content, s.logprobs);
  events += responses_->call_delta_events(calls);
  if (!events.empty()) {
    res_->write_chunk(events);
    if (!content.empty() && req_.logprobs >= 0) s.logprobs = Json::array();
  }
  s.delta.clear();
}

void GenerationJob::complete_response() {
  Sequence& s = *seqs_.front();
  std::string finish_reason = s.finish_reason;
  const Json message = chat_message(s, finish_reason);
  const Json calls = message.value("tool_calls", Json(nullptr));
  if (req_.stream) {
    res_->write_chunk(responses_->finish_events(finish_reason, usage(),
                                                req_.logprobs >= 0 ? s.logprobs : Json()));
    res_->end_stream();
    return store_response(responses_->reply_message(), responses_->final_response());
  }
  const Json reasoning = message.value("reasoning", Json(nullptr));
  const Json content = message["content"];
  // No message item for a reply that is only calls.
  std::optional<std::string> text;
  if (content.is_string() && !content.get<std::string>().empty())
    text = content.get<std::string>();
  else if (!calls.is_array() || calls.empty())
    text = "";
  const Json body =
      responses_->response(reasoning.is_string() ? reasoning.get<std::string>() : "", text,
                           finish_reason, usage(), calls, req_.logprobs >= 0 ? s.logprobs : Json());
  res_->send(200, "application/json", body.dump(-1, ' ', false, Json::error_handler_t::replace));
  // The reply for the next turn: its text and calls (past reasoning is not replayed).
  Json reply = {{"role", "assistant"}, {"content", text.value_or("")}};
  if (calls.is_array() && !calls.empty()) reply["tool_calls"] = calls;
  store_response(std::move(reply), body);
}

// A stored response (request `store`): the conversation through `reply`, and the object sent.
void GenerationJob::store_response(Json reply, const Json& response) const {
  if (!req_.responses_store || ctx_.response_store == nullptr) return;
  Json conversation = req_.responses_conversation;
  conversation.push_back(std::move(reply));
  ctx_.response_store->put(id_, {std::move(conversation), response});
}

void GenerationJob::complete() {
  if (done_) return;
  done_ = true;
  metrics_.observe_e2e(now_seconds() - arrival_s_);
  if (responses_) {
    complete_response();
  } else if (req_.stream) {
    if (req_.include_usage) {
      Json chunk =
          envelope(req_.kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
      chunk["choices"] = Json::array();
      chunk["usage"] = usage();
      res_->write_chunk("data: " + chunk.dump() + "\n\n");
    }
    res_->write_chunk("data: [DONE]\n\n");
    res_->end_stream();
  } else {
    Json body = envelope(req_.kind == ApiKind::kChat ? "chat.completion" : "text_completion");
    Json choices = Json::array();
    for (const auto& s : seqs_) {
      Json c = {{"index", s->index}};
      Json lp = req_.logprobs < 0             ? Json(nullptr)
                : req_.kind == ApiKind::kChat ? Json{{"content", s->logprobs}}
                                              : s->logprobs;
      std::string finish_reason = s->finish_reason;
      if (req_.kind == ApiKind::kChat) {
        c["message"] = chat_message(*s, finish_reason);
      } else {
        c["text"] = req_.echo ? req_.prompts[s->prompt_index].text + s->text : s->text;
      }
      c["logprobs"] = std::move(lp);
      c["finish_reason"] = finish_reason;
      if (req_.prompt_logprobs >= 0 && req_.kind == ApiKind::kCompletion)
        c["prompt_logprobs"] = prompt_logprobs_json(s->prompt_logprobs, token_texts());
      choices.push_back(std::move(c));
    }
    body["choices"] = std::move(choices);
    // Chat: one list for the request (every choice has the same prompt), as vLLM reports it.
    if (req_.prompt_logprobs >= 0 && req_.kind == ApiKind::kChat && !seqs_.empty())
      body["prompt_logprobs"] = prompt_logprobs_json(seqs_.front()->prompt_logprobs, token_texts());
    body["usage"] = usage();
    res_->send(200, "application/json", body.dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  if (on_done_) std::exchange(on_done_, nullptr)();
}

void GenerationJob::fail(int status, const std::string& message) {
  if (done_) return;
  done_ = true;
  abort_all();
  if (req_.stream) {
    if (responses_) {
      res_->write_chunk(responses_->error_event(status, message));
    } else {
      res_->write_chunk("data: " + error_json(status, message) + "\n\n");
      res_->write_chunk("data: [DONE]\n\n");
    }
    res_->end_stream();
  } else {
    res_->send(status, "application/json", error_json(status, message));
  }
  if (num_unfinished_ == 0 && on_done_) std::exchange(on_done_, nullptr)();
}

}  // namespace serval::server
