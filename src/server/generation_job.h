// One /v1/completions, /v1/chat/completions or /v1/responses request in flight: its engine
// sequences, incremental detokenization, stop strings, logprobs, and the (streamed) OpenAI
// response.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http_server.h"
#include "server/in_flight_job.h"
#include "server/logprobs_json.h"
#include "server/metrics.h"
#include "server/request_parser.h"
#include "server/responses_api.h"
#include "server/tool_call_parser.h"

namespace serval::server {

struct Sequence;

// Lives until every sequence finished; owned by the engine callbacks and the disconnect hook.
// Every method runs on the connection's strand.
class GenerationJob : public InFlightJob, public std::enable_shared_from_this<GenerationJob> {
 public:
  GenerationJob(runtime::Engine& engine, const ModelContext& ctx, GenerationRequest req,
                std::string model_name, std::shared_ptr<Responder> responder, Metrics& metrics,
                double arrival_s, std::function<void()> on_done);
  ~GenerationJob();

  // Submits n sequences per prompt and starts the stream. Throws ApiError (400 when the prompt
  // does not fit, 503 on QueueFull) after aborting what was already submitted.
  void start() override;
  // Aborts every unfinished sequence (client gone or server shutting down).
  void abort_all() override;

 private:
  void on_output(size_t seq, const runtime::RequestOutput& out);
  void add_logprobs(Sequence& s, const runtime::LogprobEntry& e);
  void emit_text(Sequence& s, const std::string& text);
  void finish(Sequence& s, const std::string& reason);
  void send_role_chunk(Sequence& s);
  void send_chunk(Sequence& s, bool had_tokens);
  void complete();
  void fail(int status, const std::string& message);
  std::string token_text(int32_t id) const;
  TokenText token_texts() const;  // token_text as a function object
  Json usage() const;
  std::optional<int64_t> cached_if_reported(int64_t cached) const;
  // Whether the output is parsed (reasoning split off, tool calls read out) rather than streamed
  // as it comes.
  bool parsed_output() const;
  // A chat stream chunk's delta when the output is parsed (reasoning, tool calls); `content` is
  // the content part of the text so far.
  Json chat_stream_delta(Sequence& s) const;
  void add_tool_stream_delta(Json& delta, Sequence& s, std::string_view content) const;
  ParsedToolCalls parse_auto_tool_calls(std::string_view content) const;
  // The call of a forced tool_choice with these arguments.
  ToolCall forced_call(std::string_view arguments) const;
  // A finished chat choice's message.
  Json chat_message(const Sequence& s, std::string& finish_reason) const;
  // Usage so far of one sequence: its prompt and its tokens (continuous_usage_stats chunks).
  Json sequence_usage(const Sequence& s) const;
  // Adds the sequence's usage to a stream chunk when the request asked for it in every chunk.
  void add_continuous_usage(Json& chunk, const Sequence& s) const;
  Json envelope(const char* object) const;
  // /v1/responses: a stream chunk's events, and the finished response or its last events.
  void send_responses_events(Sequence& s);
  void store_response(Json reply, const Json& response) const;
  void complete_response();

  runtime::Engine& engine_;
  ModelContext ctx_;
  GenerationRequest req_;
  std::string model_name_;
  std::shared_ptr<Responder> res_;
  Metrics& metrics_;
  double arrival_s_;
  std::function<void()> on_done_;
  std::string id_;
  int64_t created_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  int num_unfinished_ = 0;
  bool done_ = false;                           // the response has been completed (or failed)
  std::unique_ptr<ResponsesWriter> responses_;  // kResponses only
};

}  // namespace serval::server
