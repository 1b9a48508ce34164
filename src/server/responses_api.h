// OpenAI's Responses API (POST /v1/responses) over the chat machinery: the request becomes a
// chat request, and the reply (one sequence: the Responses API has no n) a response object or,
// streamed, its server-sent events.
//
// Supported: `input` as text or a list of messages (roles user, system, developer, assistant;
// content as text or input_text / output_text parts), `instructions`, `max_output_tokens`,
// `temperature`, `top_p`, `text.format` (text, json_object, json_schema: guided decoding),
// function `tools` with `tool_choice` and `parallel_tool_calls` (as chat's), input items
// function_call and function_call_output (the conversation's earlier calls and their results),
// and vLLM's sampling extras (top_k, min_p, seed, penalties, chat_template_kwargs). Output: a
// reasoning item when `serve --reasoning-parser` splits one off, a message item with one
// output_text part (left out when the reply is only calls), then function_call items (streamed
// as the tool-call parser reads them: each call's item, then its arguments piece by piece).
// Responses are kept (response_store.h) unless `store` is false: `previous_response_id` continues
// a kept conversation. Refused with a 400: other tool types, background, and other input items.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/request_parser.h"

namespace serval::server {

GenerationRequest parse_responses_request(const Json& body, const ModelContext& ctx);

// One response's object and stream events. Events carry increasing sequence numbers; text
// arrives through deltas, the reasoning item (if any) before the message item.
class ResponsesWriter {
 public:
  ResponsesWriter(std::string id, std::string model, int64_t created, Json request_echo);

  // The whole response: `reasoning` empty when there is none, no message item when `content` is
  // nullopt; finish_reason "length" makes it incomplete (max_output_tokens). usage: the chat form
  // (prompt_tokens, completion_tokens, …); tool_calls: chat's message.tool_calls.
  // logprobs: the output_text's entries (null: not asked for).
  Json response(const std::string& reasoning, const std::optional<std::string>& content,
                const std::string& finish_reason, const Json& usage, const Json& tool_calls,
                const Json& logprobs);

  // Events, each "event: <type>\ndata: <json>\n\n".
  std::string start_events();  // response.created, response.in_progress
  // New reasoning and content text (either may be empty), and the logprob entries to send with
  // the content (an array; empty when not asked for).
  std::string delta_events(std::string_view reasoning, std::string_view content,
                           const Json& logprobs);
  // Tool calls as a chat stream's delta.tool_calls entries carry them (a call's first entry has
  // its index, id and name; later ones more arguments): a call's function_call item is opened
  // (closing the item before it), then its arguments arrive as deltas.
  std::string call_delta_events(const Json& entries);
  // The open items closed (a message item unless the reply is only calls), then
  // response.completed (or response.incomplete) with the texts and calls the deltas carried.
  // trailing_logprobs: entries of tokens no text delta carried (an array, or null).
  std::string finish_events(const std::string& finish_reason, const Json& usage,
                            const Json& trailing_logprobs);
  std::string error_event(int status, const std::string& message);
  // After finish_events: the response object it ended with, and the reply as a chat assistant
  // message (its text and calls, as streamed) for a stored conversation.
  const Json& final_response() const { return final_response_; }
  Json reply_message() const;

 private:
  enum class Item { kNone, kReasoning, kMessage, kCall };
  // A function_call item of the stream.
  struct StreamedCall {
    std::string item_id, call_id, name, arguments;
    int output_index;
  };
  Json envelope(const char* status) const;
  Json reasoning_item(const std::string& text, const char* status) const;
  Json message_item(const std::string& text, const char* status, const Json& logprobs) const;
  std::string event(const char* type, Json body);
  std::string open_reasoning();
  std::string open_message();
  std::string close_open_item();
  Json call_item(const StreamedCall& call, const char* status) const;
  Json response_of(const std::string& reasoning, const std::optional<std::string>& content,
                   const std::string& finish_reason, const Json& usage, const Json& call_items,
                   const Json& logprobs);

  std::string id_, model_, reasoning_id_, message_id_;
  int64_t created_;
  Json request_echo_;  // the request's settings, repeated in the response
  int64_t sequence_ = 0;
  Item open_ = Item::kNone;
  int next_output_index_ = 0;
  std::string reasoning_text_, message_text_;  // streamed so far
  Json logprobs_ = Json::array();              // streamed so far
  bool message_opened_ = false;
  const char* item_status_ = "completed";  // the message item's at the end ("incomplete": cut)
  std::vector<StreamedCall> calls_;        // streamed so far; the open one (kCall) last
  Json final_response_;
};

}  // namespace serval::server
