#include "server/responses_api.h"

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/random_id.h"
#include "server/response_store.h"

namespace serval::server {

namespace {

// A string field of an input item (400 naming the item when missing).
std::string item_string(const Json& item, const char* key, const std::string& at) {
  const auto v = item.find(key);
  if (v == item.end() || !v->is_string())
    throw bad_request("input", fmt::format("{} needs a string '{}'", at, key));
  return v->get<std::string>();
}

// A message's content: text, or a list of text parts.
Json message_content(const Json& content, const std::string& at) {
  if (content.is_string()) return content;
  if (!content.is_array()) throw bad_request("input", at + ".content must be text or a list");
  Json parts = Json::array();  // chat's text parts, joined as chat joins them
  for (const Json& part : content) {
    const auto type = part.is_object() ? part.find("type") : part.end();
    const bool text_part =
        type != part.end() && (*type == "input_text" || *type == "output_text" || *type == "text");
    if (!text_part)
      throw bad_request("input", fmt::format("{}: content parts other than input_text and "
                                             "output_text are not supported",
                                             at));
    parts.push_back({{"type", "text"}, {"text", item_string(part, "text", at)}});
  }
  return parts;
}

// A function_call item: added to the assistant message of calls just before it, or a new one.
void add_function_call(Json& messages, const Json& item, const std::string& at) {
  const Json call = {{"id", item_string(item, "call_id", at)},
                     {"type", "function"},
                     {"function",
                      {{"name", item_string(item, "name", at)},
                       {"arguments", item_string(item, "arguments", at)}}}};
  if (messages.empty() || messages.back()["role"] != "assistant" ||
      !messages.back().contains("tool_calls"))
    messages.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", Json::array()}});
  messages.back()["tool_calls"].push_back(call);
}

// `input` as chat messages: messages, function calls (an assistant message's tool_calls) and
// their outputs (tool messages); an earlier reply's reasoning items are left out, as chat
// templates drop past thoughts.
Json input_messages(const Json& input) {
  if (input.is_string()) return Json::array({Json{{"role", "user"}, {"content", input}}});
  if (!input.is_array() || input.empty())
    throw bad_request("input", "'input' must be text or a non-empty list of messages");
  Json messages = Json::array();
  for (size_t i = 0; i < input.size(); ++i) {
    const Json& item = input[i];
    const std::string at = fmt::format("input[{}]", i);
    if (!item.is_object()) throw bad_request("input", at + " must be an object");
    // (find, not value(): a type that is not a string must be a 400, not a type_error's 500)
    const auto type_field = item.find("type");
    const std::string type = type_field == item.end()  ? "message"
                             : type_field->is_string() ? type_field->get<std::string>()
                                                       : "";
    if (type == "function_call") {
      add_function_call(messages, item, at);
      continue;
    }
    if (type == "reasoning") continue;  // an earlier reply's thoughts: not replayed in the prompt
    if (type == "function_call_output") {
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", item_string(item, "call_id", at)},
                          {"content", item_string(item, "output", at)}});
      continue;
    }
    if (type != "message")
      throw bad_request("input", fmt::format("{}: items of type '{}' are not supported (message, "
                                             "function_call, function_call_output, reasoning)",
                                             at, type));
    const std::string role =
        item.contains("role") && item["role"].is_string() ? item["role"].get<std::string>() : "";
    if (role != "user" && role != "system" && role != "developer" && role != "assistant")
      throw bad_request("input", at + ".role must be user, system, developer or assistant");
    if (!item.contains("content")) throw bad_request("input", at + " needs 'content'");
    messages.push_back({{"role", role == "developer" ? "system" : role},
                        {"content", message_content(item["content"], at)}});
  }
  return messages;
}

// text.format → the chat request's response_format (null: plain text).
Json response_format(const Json& body) {
  const auto text = body.find("text");
  if (text == body.end() || text->is_null()) return nullptr;
  if (!text->is_object()) throw bad_request("text", "'text' must be an object");
  const auto format = text->find("format");
  if (format == text->end() || format->is_null()) return nullptr;
  if (!format->is_object() || !format->contains("type") || !(*format)["type"].is_string())
    throw bad_request("text", "text.format needs a 'type'");
  const std::string type = (*format)["type"].get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return Json{{"type", "json_object"}};
  if (type != "json_schema")
    throw bad_request("text", fmt::format("text.format type '{}' is not supported (text, "
                                          "json_object, json_schema)",
                                          type));
  if (!format->contains("schema"))
    throw bad_request("text", "a json_schema text.format needs 'schema'");
  return Json{
      {"type", "json_schema"},
      {"json_schema",
       {{"name", format->value("name", Json("response"))}, {"schema", (*format)["schema"]}}}};
}

// Chat usage → the Responses API's.
Json responses_usage(const Json& usage) {
  const int64_t input = usage.value("prompt_tokens", int64_t{0});
  const int64_t output = usage.value("completion_tokens", int64_t{0});
  int64_t cached = 0;
  if (auto d = usage.find("prompt_tokens_details"); d != usage.end() && d->is_object())
    cached = d->value("cached_tokens", int64_t{0});
  return {{"input_tokens", input},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", output},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", input + output}};
}

// Function tools ({"type": "function", "name", "description", "parameters"}) in the chat form.
Json chat_tools(const Json& tools) {
  if (!tools.is_array()) throw bad_request("tools", "'tools' must be a list");
  Json out = Json::array();
  for (const Json& t : tools) {
    if (!t.is_object() || t.value("type", Json()) != "function")
      throw bad_request("tools",
                        "only function tools are supported ({\"type\": \"function\", "
                        "\"name\": ..., \"parameters\": ...})");
    if (!t.contains("name") || !t["name"].is_string())
      throw bad_request("tools", "a function tool needs a string 'name'");
    Json fn = {{"name", t["name"]}};
    for (const char* key : {"description", "parameters"})
      if (t.contains(key) && !t[key].is_null()) fn[key] = t[key];
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out;
}

// tool_choice: "none" / "auto" / "required", or {"type": "function", "name"} → the chat form.
Json chat_tool_choice(const Json& choice) {
  if (choice.is_string()) return choice;
  if (choice.is_object() && choice.value("type", Json()) == "function" && choice.contains("name") &&
      choice["name"].is_string())
    return {{"type", "function"}, {"function", {{"name", choice["name"]}}}};
  throw bad_request("tool_choice",
                    "tool_choice must be \"none\", \"auto\", \"required\" or "
                    "{\"type\": \"function\", \"name\": ...}");
}

// The conversation a request continues: its previous response's (404 when not kept), else none.
Json previous_conversation(const Json& body, const ModelContext& ctx) {
  const auto prev = body.find("previous_response_id");
  if (prev == body.end() || prev->is_null()) return Json::array();
  if (!prev->is_string())
    throw bad_request("previous_response_id", "'previous_response_id' must be a string");
  const std::string id = prev->get<std::string>();
  std::optional<StoredResponse> stored =
      ctx.response_store ? ctx.response_store->get(id) : std::nullopt;
  if (!stored)
    throw ApiError(404, "previous " + ResponseStore::not_kept_message(id), "previous_response_id");
  return std::move(stored->conversation);
}

}  // namespace

GenerationRequest parse_responses_request(const Json& body, const ModelContext& ctx) {
  if (get_bool(body, "background").value_or(false))
    throw bad_request("background", "background responses are not supported");
  if (!body.contains("input")) throw bad_request("input", "'input' is required");
  Json conversation = previous_conversation(body, ctx);
  for (Json& m : input_messages(body["input"])) conversation.push_back(std::move(m));
  Json chat = {{"messages", conversation}};
  if (const auto instructions = body.find("instructions");
      instructions != body.end() && !instructions->is_null()) {
    if (!instructions->is_string())
      throw bad_request("instructions", "'instructions' must be a string");
    chat["messages"].insert(chat["messages"].begin(),
                            Json{{"role", "system"}, {"content", *instructions}});
  }
  if (const Json format = response_format(body); !format.is_null())
    chat["response_format"] = format;
  if (const auto tools = body.find("tools"); tools != body.end() && !tools->is_null())
    chat["tools"] = chat_tools(*tools);
  if (const auto choice = body.find("tool_choice"); choice != body.end() && !choice->is_null())
    chat["tool_choice"] = chat_tool_choice(*choice);
  if (const auto max = get_int(body, "max_output_tokens")) {
    if (*max < 1)
      throw bad_request("max_output_tokens",
                        fmt::format("max_output_tokens must be at least 1, got {}", *max));
    chat["max_tokens"] = *max;
  }
  for (const char* key : {"stream", "temperature", "top_p", "top_k", "min_p", "seed",
                          "repetition_penalty", "presence_penalty", "frequency_penalty",
                          "chat_template_kwargs", "include_reasoning", "parallel_tool_calls"})
    if (const auto v = body.find(key); v != body.end()) chat[key] = *v;
  // Logprobs of the output text: include "message.output_text.logprobs", top_logprobs alternatives.
  if (const auto include = body.find("include"); include != body.end() && include->is_array())
    for (const Json& what : *include)
      if (what == "message.output_text.logprobs") chat["logprobs"] = true;
  if (const auto top = body.find("top_logprobs"); top != body.end() && !top->is_null()) {
    chat["logprobs"] = true;
    chat["top_logprobs"] = *top;
  }
  GenerationRequest req = parse_chat_request(chat, ctx);
  req.kind = ApiKind::kResponses;
  req.responses_conversation = std::move(conversation);
  req.responses_store = ctx.response_store != nullptr && get_bool(body, "store").value_or(true);
  req.responses_echo = {
      {"instructions", body.value("instructions", Json(nullptr))},
      {"max_output_tokens", body.value("max_output_tokens", Json(nullptr))},
      {"metadata", body.value("metadata", Json::object())},
      {"parallel_tool_calls", body.value("parallel_tool_calls", Json(true))},
      {"previous_response_id", body.value("previous_response_id", Json(nullptr))},
      {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
      {"store", req.responses_store},
      {"temperature", body.value("temperature", Json(1.0))},
      {"text",
       {{"format",
         body.contains("text") && body["text"].is_object() && body["text"].contains("format")
             ? body["text"]["format"]
             : Json{{"type", "text"}}}}},
      {"tool_choice", body.value("tool_choice", Json("auto"))},
      {"tools", body.value("tools", Json::array())},
      {"top_p", body.value("top_p", Json(1.0))},
      {"truncation", "disabled"},
      {"user", body.value("user", Json(nullptr))},
  };
  return req;
}

ResponsesWriter::ResponsesWriter(std::string id, std::string model, int64_t created,
                                 Json request_echo)
    : id_(std::move(id)),
      model_(std::move(model)),
      reasoning_id_(random_id("rs_")),
      message_id_(random_id("msg_")),
      created_(created),
      request_echo_(std::move(request_echo)) {}

Json ResponsesWriter::envelope(const char* status) const {
  Json r = {{"id", id_},        {"object", "response"},    {"created_at", created_},
            {"status", status}, {"error", nullptr},        {"incomplete_details", nullptr},
            {"model", model_},  {"output", Json::array()}, {"usage", nullptr}};
  for (const auto& [key, value] : request_echo_.items()) r[key] = value;
  return r;
}

Json ResponsesWriter::reasoning_item(const std::string& text, const char* status) const {
  return {{"id", reasoning_id_},
          {"type", "reasoning"},
          {"summary", Json::array()},
          {"content", Json::array({Json{{"type", "reasoning_text"}, {"text", text}}})},
          {"status", status}};
}

Json ResponsesWriter::message_item(const std::string& text, const char* status,
                                   const Json& logprobs) const {
  Json content = Json::array();
  if (std::string_view(status) != "in_progress")
    content.push_back({{"type", "output_text"},
                       {"text", text},
                       {"annotations", Json::array()},
                       {"logprobs", logprobs.is_array() ? logprobs : Json::array()}});
  return {{"id", message_id_},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", std::move(content)}};
}

Json ResponsesWriter::call_item(const StreamedCall& call, const char* status) const {
  return {{"id", call.item_id}, {"type", "function_call"},     {"call_id", call.call_id},
          {"name", call.name},  {"arguments", call.arguments}, {"status", status}};
}

Json ResponsesWriter::response(const std::string& reasoning,
                               const std::optional<std::string>& content,
                               const std::string& finish_reason, const Json& usage,
                               const Json& tool_calls, const Json& logprobs) {
  Json items = Json::array();
  if (tool_calls.is_array())
    for (const Json& c : tool_calls)
      items.push_back(call_item(
          {random_id("fc_"), c["id"], c["function"]["name"], c["function"]["arguments"], 0},
          "completed"));
  return response_of(reasoning, content, finish_reason, usage, items, logprobs);
}

Json ResponsesWriter::response_of(const std::string& reasoning,
                                  const std::optional<std::string>& content,
                                  const std::string& finish_reason, const Json& usage,
                                  const Json& call_items, const Json& logprobs) {
  const bool cut = finish_reason == "length";
  Json r = envelope(cut ? "incomplete" : "completed");
  if (cut) r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (!reasoning.empty()) r["output"].push_back(reasoning_item(reasoning, "completed"));
  if (content)
    r["output"].push_back(message_item(*content, cut ? "incomplete" : "completed", logprobs));
  for (const Json& call : call_items) r["output"].push_back(call);
  r["usage"] = responses_usage(usage);
  return r;
}

std::string ResponsesWriter::event(const char* type, Json body) {
  Json e = {{"type", type}, {"sequence_number", sequence_++}};
  for (auto& [key, value] : body.items()) e[key] = std::move(value);
  return fmt::format("event: {}\ndata: {}\n\n", type,
                     e.dump(-1, ' ', false, Json::error_handler_t::replace));
}

std::string ResponsesWriter::start_events() {
  std::string out = event("response.created", {{"response", envelope("in_progress")}});
  return out + event("response.in_progress", {{"response", envelope("in_progress")}});
}

std::string ResponsesWriter::open_reasoning() {
  open_ = Item::kReasoning;
  const int index = next_output_index_++;
  return event("response.output_item.added",
               {{"output_index", index}, {"item", reasoning_item("", "in_progress")}});
}

std::string ResponsesWriter::open_message() {
  open_ = Item::kMessage;
  message_opened_ = true;
  const int index = next_output_index_++;
  std::string out =
      event("response.output_item.added",
            {{"output_index", index}, {"item", message_item("", "in_progress", Json())}});
  return out + event("response.content_part.added", {{"item_id", message_id_},
                                                     {"output_index", index},
                                                     {"content_index", 0},
                                                     {"part",
                                                      {{"type", "output_text"},
                                                       {"text", ""},
                                                       {"annotations", Json::array()},
                                                       {"logprobs", Json::array()}}}});
}

std::string ResponsesWriter::close_open_item() {
  const int index = next_output_index_ - 1;
  std::string out;
  if (open_ == Item::kReasoning) {
    out += event("response.reasoning_text.done", {{"item_id", reasoning_id_},
                                                  {"output_index", index},
                                                  {"content_index", 0},
                                                  {"text", reasoning_text_}});
    out += event("response.output_item.done",
                 {{"output_index", index}, {"item", reasoning_item(reasoning_text_, "completed")}});
  } else if (open_ == Item::kMessage) {
    const Json part = {{"type", "output_text"},
                       {"text", message_text_},
                       {"annotations", Json::array()},
                       {"logprobs", logprobs_}};
    out += event("response.output_text.done", {{"item_id", message_id_},
                                               {"output_index", index},
                                               {"content_index", 0},
                                               {"text", message_text_},
                                               {"logprobs", logprobs_}});
    out += event(
        "response.content_part.done",
        {{"item_id", message_id_}, {"output_index", index}, {"content_index", 0}, {"part", part}});
    out += event(
        "response.output_item.done",
        {{"output_index", index}, {"item", message_item(message_text_, item_status_, logprobs_)}});
  } else if (open_ == Item::kCall) {
    const StreamedCall& call = calls_.back();
    out += event("response.function_call_arguments.done", {{"item_id", call.item_id},
                                                           {"output_index", call.output_index},
                                                           {"arguments", call.arguments}});
    out += event("response.output_item.done",
                 {{"output_index", call.output_index}, {"item", call_item(call, "completed")}});
  }
  open_ = Item::kNone;
  return out;
}

std::string ResponsesWriter::call_delta_events(const Json& entries) {
  std::string out;
  for (const Json& entry : entries) {
    const size_t index = entry.at("index").get<size_t>();
    const Json& function = entry.at("function");
    const std::string arguments = function.value("arguments", "");
    if (index == calls_.size()) {  // a new call: its item opens
      out += close_open_item();
      calls_.push_back({random_id("fc_"), entry.value("id", ""), function.value("name", ""), "",
                        next_output_index_++});
      open_ = Item::kCall;
      out +=
          event("response.output_item.added", {{"output_index", calls_.back().output_index},
                                               {"item", call_item(calls_.back(), "in_progress")}});
    } else if (index > calls_.size()) {
      continue;  // chat streams calls in order; never here
    }
    StreamedCall& call = calls_[index];
    if (arguments.empty()) continue;
    call.arguments += arguments;
    out += event(
        "response.function_call_arguments.delta",
        {{"item_id", call.item_id}, {"output_index", call.output_index}, {"delta", arguments}});
  }
  return out;
}

std::string ResponsesWriter::delta_events(std::string_view reasoning, std::string_view content,
                                          const Json& logprobs) {
  std::string out;
  if (!reasoning.empty() && open_ != Item::kMessage) {  // reasoning comes before the message
    if (open_ != Item::kReasoning) out += open_reasoning();
    reasoning_text_ += reasoning;
    out += event("response.reasoning_text.delta", {{"item_id", reasoning_id_},
                                                   {"output_index", next_output_index_ - 1},
                                                   {"content_index", 0},
                                                   {"delta", reasoning}});
  }
  if (!content.empty()) {
    if (open_ != Item::kMessage) {
      out += close_open_item();
      out += open_message();
    }
    message_text_ += content;
    const Json entries = logprobs.is_array() ? logprobs : Json::array();
    for (const Json& e : entries) logprobs_.push_back(e);
    out += event("response.output_text.delta", {{"item_id", message_id_},
                                                {"output_index", next_output_index_ - 1},
                                                {"content_index", 0},
                                                {"delta", content},
                                                {"logprobs", entries}});
  }
  return out;
}

std::string ResponsesWriter::finish_events(const std::string& finish_reason, const Json& usage,
                                           const Json& trailing_logprobs) {
  std::string out;
  if (finish_reason == "length") item_status_ = "incomplete";
  if (trailing_logprobs.is_array())
    for (const Json& e : trailing_logprobs) logprobs_.push_back(e);
  if (open_ != Item::kMessage && !message_opened_ && calls_.empty()) {  // a message, even empty
    out += close_open_item();
    out += open_message();
  }
  out += close_open_item();
  // The object as the stream built it: its texts and calls are what the deltas carried.
  Json items = Json::array();
  for (const StreamedCall& call : calls_) items.push_back(call_item(call, "completed"));
  final_response_ = response_of(
      reasoning_text_, message_opened_ ? std::optional<std::string>(message_text_) : std::nullopt,
      finish_reason, usage, items, logprobs_);
  return out + event(finish_reason == "length" ? "response.incomplete" : "response.completed",
                     {{"response", final_response_}});
}

Json ResponsesWriter::reply_message() const {
  Json message = {{"role", "assistant"}, {"content", message_text_}};
  if (calls_.empty()) return message;
  message["tool_calls"] = Json::array();
  for (const StreamedCall& call : calls_)
    message["tool_calls"].push_back(
        {{"id", call.call_id},
         {"type", "function"},
         {"function", {{"name", call.name}, {"arguments", call.arguments}}}});
  return message;
}

std::string ResponsesWriter::error_event(int status, const std::string& message) {
  return event("error",
               {{"code", std::to_string(status)}, {"message", message}, {"param", nullptr}});
}

}  // namespace serval::server
