// /v1/responses over real sockets against FakeEngine: the response object, its event stream,
// stored responses, function calls and reasoning items.
#include <gtest/gtest.h>

#include <string>

#include "server_fixture.h"

namespace serval::server {
namespace {

using nlohmann::json;
using testing::collect_chat_stream;
using testing::http;
using testing::ServerTest;
using testing::sse_events;
using testing::StreamedChat;

// The texts and event types of a streamed /v1/responses reply; sequence numbers are checked
// to count up from 0.
struct StreamedResponse {
  std::vector<std::string> types;
  std::string reasoning, text;
  json final_response;
  json done_items = json::array();  // response.output_item.done's items
};
StreamedResponse collect_response_stream(const std::string& body) {
  StreamedResponse out;
  int64_t expected = 0;
  for (const std::string& data : sse_events(body)) {
    const json e = json::parse(data);
    EXPECT_EQ(e["sequence_number"], expected++) << data;
    const std::string type = e["type"];
    out.types.push_back(type);
    if (type == "response.output_text.delta") out.text += e["delta"].get<std::string>();
    if (type == "response.reasoning_text.delta") out.reasoning += e["delta"].get<std::string>();
    if (type == "response.output_item.done") out.done_items.push_back(e["item"]);
    if (type == "response.completed" || type == "response.incomplete")
      out.final_response = e["response"];
  }
  return out;
}

// /v1/responses: the response object (instructions as a system message, max_output_tokens, the
// request's settings repeated, usage in the Responses form), its stream of events in OpenAI's
// order with the same text, and 400s for what serval does not do.
TEST_F(ServerTest, ResponsesApi) {
  const json body = {{"input", "hello"},
                     {"instructions", "sys"},
                     {"max_output_tokens", 6},
                     {"metadata", {{"k", "v"}}}};
  const auto r = post("/v1/responses", body);
  ASSERT_EQ(r.status, 200) << r.body;
  const json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "response");
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("resp_"));
  EXPECT_EQ(j["status"], "incomplete");  // 6 tokens of an echoing engine
  EXPECT_EQ(j["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(j["instructions"], "sys");
  EXPECT_EQ(j["metadata"]["k"], "v");
  ASSERT_EQ(j["output"].size(), 1u);
  const json& item = j["output"][0];
  EXPECT_EQ(item["type"], "message");
  EXPECT_EQ(item["role"], "assistant");
  const std::string text = item["content"][0]["text"];
  EXPECT_EQ(item["content"][0]["type"], "output_text");
  // FakeEngine repeats the rendered prompt, a byte per token: the instructions (a system
  // message, rendered bare) before the user turn.
  EXPECT_EQ(text, "sys<us");
  EXPECT_EQ(j["usage"]["output_tokens"], 6);
  EXPECT_EQ(j["usage"]["total_tokens"],
            j["usage"]["input_tokens"].get<int>() + j["usage"]["output_tokens"].get<int>());

  json streamed = body;
  streamed["stream"] = true;
  const StreamedResponse s = collect_response_stream(post("/v1/responses", streamed).body);
  const std::vector<std::string> opening = {"response.created", "response.in_progress",
                                            "response.output_item.added",
                                            "response.content_part.added"};
  const std::vector<std::string> closing = {"response.output_text.done",
                                            "response.content_part.done",
                                            "response.output_item.done", "response.incomplete"};
  ASSERT_GT(s.types.size(), opening.size() + closing.size());
  EXPECT_TRUE(std::equal(opening.begin(), opening.end(), s.types.begin()));
  EXPECT_TRUE(std::equal(closing.begin(), closing.end(), s.types.end() - 4));
  for (size_t i = opening.size(); i < s.types.size() - closing.size(); ++i)
    EXPECT_EQ(s.types[i], "response.output_text.delta");
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.final_response["output"][0]["content"][0]["text"], text);
  EXPECT_EQ(s.done_items, s.final_response["output"]) << "items as the stream closed them";
  EXPECT_EQ(s.final_response["output"][0]["status"], "incomplete");

  // Logprobs (include or top_logprobs): an entry per output token, chat's form, streamed with the
  // deltas and whole in the done events.
  json with_logprobs = body;
  with_logprobs["top_logprobs"] = 2;
  const json lp = json::parse(post("/v1/responses", with_logprobs).body);
  const json entries = lp["output"][0]["content"][0]["logprobs"];
  ASSERT_EQ(entries.size(), 6u) << lp.dump();
  EXPECT_TRUE(entries[0]["logprob"].is_number());
  EXPECT_EQ(entries[0]["top_logprobs"].size(), 2u);
  with_logprobs.erase("top_logprobs");
  with_logprobs["include"] = {"message.output_text.logprobs"};
  with_logprobs["stream"] = true;
  size_t streamed_entries = 0;
  json done_entries;
  for (const std::string& data : sse_events(post("/v1/responses", with_logprobs).body)) {
    const json e = json::parse(data);
    if (e["type"] == "response.output_text.delta") streamed_entries += e["logprobs"].size();
    if (e["type"] == "response.output_text.done") done_entries = e["logprobs"];
  }
  EXPECT_EQ(streamed_entries, 6u);
  EXPECT_EQ(done_entries.size(), 6u);
  EXPECT_TRUE(
      json::parse(post("/v1/responses", body).body)["output"][0]["content"][0]["logprobs"].empty());

  const std::vector<std::pair<json, std::string>> bad = {
      {{{"input", "x"}, {"tools", {{{"type", "web_search"}}}}}, "tools"},
      {{{"input", "x"}, {"tools", {{{"type", "function"}, {"name", "f"}}}}}, "tool_choice"},
      {{{"input", "x"}, {"previous_response_id", 1}}, "previous_response_id"},
      {{{"instructions", "x"}}, "input"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}}, "input"},
      {{{"input", {{{"type", "function_call_output"}}}}}, "input"},
      {{{"input", {{{"type", "file_search_call"}}}}}, "input"},
      {{{"input", {{{"type", 3}, {"role", "user"}, {"content", "x"}}}}}, "input"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", 1}, {"text", "x"}}}}}}}}, "input"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_text"}, {"text", 2}}}}}}}},
       "input"},
      {{{"input", "x"}, {"text", {{"format", {{"type", "xml"}}}}}}, "text"},
      {{{"input", "x"}, {"max_output_tokens", 0}}, "max_output_tokens"},
  };
  for (const auto& [b, param] : bad) expect_error(post("/v1/responses", b), 400, param);
}

// Stored responses (`store`, true by default): previous_response_id continues the conversation
// (its instructions not carried over), GET /v1/responses/{id} returns the response, DELETE forgets
// it; store false keeps nothing; an unknown id is a 404.
TEST_F(ServerTest, ResponsesApiStoresResponses) {
  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kNone, /*max_model_len=*/512);
  const json first = json::parse(
      post("/v1/responses", {{"input", "hi"}, {"instructions", "sys"}, {"max_output_tokens", 4}})
          .body);
  const std::string id = first["id"];
  EXPECT_EQ(first["store"], true);
  EXPECT_EQ(first["output"][0]["content"][0]["text"], "sys<");  // echoed: instructions first
  const auto got = http(port_, "GET", "/v1/responses/" + id);
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(json::parse(got.body), first);

  // The next turn's prompt: the stored conversation (no instructions), its reply, the new input.
  const std::string prompt = "<user>hi\n<assistant>sys<\n<user>again\n<assistant>";
  const json second = json::parse(
      post("/v1/responses",
           {{"input", "again"}, {"previous_response_id", id}, {"max_output_tokens", prompt.size()}})
          .body);
  EXPECT_EQ(second["previous_response_id"], id);
  EXPECT_EQ(second["output"][0]["content"][0]["text"], prompt);

  // Streamed responses are kept too, as the stream's final object.
  const StreamedResponse s = collect_response_stream(
      post("/v1/responses", {{"input", "hi"}, {"max_output_tokens", 3}, {"stream", true}}).body);
  const auto streamed =
      http(port_, "GET", "/v1/responses/" + s.final_response["id"].get<std::string>());
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(json::parse(streamed.body), s.final_response);

  const auto deleted = http(port_, "DELETE", "/v1/responses/" + id);
  ASSERT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_EQ(json::parse(deleted.body)["deleted"], true);
  expect_error(http(port_, "GET", "/v1/responses/" + id), 404, "");
  expect_error(http(port_, "DELETE", "/v1/responses/" + id), 404, "");
  expect_error(post("/v1/responses", {{"input", "x"}, {"previous_response_id", id}}), 404,
               "previous_response_id");

  const json unstored = json::parse(
      post("/v1/responses", {{"input", "hi"}, {"max_output_tokens", 2}, {"store", false}}).body);
  EXPECT_EQ(unstored["store"], false);
  expect_error(http(port_, "GET", "/v1/responses/" + unstored["id"].get<std::string>()), 404, "");
  EXPECT_EQ(http(port_, "PUT", "/v1/responses/" + id).status, 405);
}

// /v1/responses with function tools (hermes, as chat): calls become function_call items after
// the message (which is left out when the reply is only calls), streamed as their events; the
// conversation's earlier calls and outputs go into the prompt as assistant tool_calls and tool
// messages.
TEST_F(ServerTest, ResponsesApiFunctionCalls) {
  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kHermes, /*max_model_len=*/512);
  const json tools = json::array(
      {{{"type", "function"}, {"name", "get_weather"}, {"parameters", json::object()}}});
  const std::string content =
      "Sure.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
      "</tool_call>";
  const std::string prompt = "<user>" + content + "\n<assistant>";
  json body = {{"input", content}, {"tools", tools}, {"max_output_tokens", prompt.size()}};
  const json j = json::parse(post("/v1/responses", body).body);
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  EXPECT_EQ(j["output"][0]["type"], "message");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "<user>Sure.");
  const json& call = j["output"][1];
  EXPECT_EQ(call["type"], "function_call");
  EXPECT_EQ(call["name"], "get_weather");
  EXPECT_EQ(json::parse(call["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_TRUE(call["id"].get<std::string>().starts_with("fc_"));
  EXPECT_FALSE(call["call_id"].get<std::string>().empty());
  EXPECT_EQ(j["tools"], tools);

  body["stream"] = true;
  const auto streamed = post("/v1/responses", body);
  const StreamedResponse s = collect_response_stream(streamed.body);
  EXPECT_EQ(s.text, "<user>Sure.");
  // The call streams as it is parsed: its item (named, no arguments yet), the arguments in
  // pieces that add up to the done event's and the final object's, under one item id.
  std::string arguments, pieces, added_id, added_name;
  int deltas = 0;
  for (const std::string& data : sse_events(streamed.body)) {
    const json e = json::parse(data);
    if (e["type"] == "response.output_item.added" && e["item"]["type"] == "function_call") {
      added_id = e["item"]["id"];
      added_name = e["item"]["name"];
      EXPECT_EQ(e["item"]["arguments"], "");
    }
    if (e["type"] == "response.function_call_arguments.delta") {
      EXPECT_EQ(e["item_id"], added_id);
      pieces += e["delta"].get<std::string>();
      ++deltas;
    }
    if (e["type"] == "response.function_call_arguments.done") arguments = e["arguments"];
  }
  EXPECT_EQ(added_name, "get_weather");
  EXPECT_GT(deltas, 5);
  EXPECT_EQ(pieces, arguments);
  EXPECT_EQ(arguments, call["arguments"]);
  ASSERT_EQ(s.final_response["output"].size(), 2u);
  EXPECT_EQ(s.final_response["output"][1]["name"], "get_weather");
  EXPECT_EQ(s.final_response["output"][1]["id"], added_id);
  EXPECT_EQ(s.final_response["output"][1]["arguments"], arguments);

  // parallel_tool_calls false reaches the chat machinery: one call at most.
  json single = body;
  single["stream"] = false;
  single["parallel_tool_calls"] = false;
  const std::string two_calls = content + "<tool_call>{\"name\": \"f\"}</tool_call>";
  single["input"] = two_calls;
  single["max_output_tokens"] = ("<user>" + two_calls + "\n<assistant>").size();
  const auto one_reply = post("/v1/responses", single);
  ASSERT_EQ(one_reply.status, 200) << one_reply.body;
  const json one = json::parse(one_reply.body);
  EXPECT_EQ(one["parallel_tool_calls"], false);
  int calls = 0;
  for (const json& item : one["output"]) calls += item["type"] == "function_call";
  EXPECT_EQ(calls, 1) << one.dump();

  // A named function: only the call, no message item.
  body["stream"] = false;
  body["tool_choice"] = {{"type", "function"}, {"name", "get_weather"}};
  const json named = json::parse(post("/v1/responses", body).body);
  ASSERT_EQ(named["output"].size(), 1u) << named.dump();
  EXPECT_EQ(named["output"][0]["type"], "function_call");
  EXPECT_EQ(named["output"][0]["arguments"], prompt);  // FakeEngine echoes: the plumbing only

  // An earlier call and its output, rendered into the prompt.
  const json turn = {{"input",
                      {{{"role", "user"}, {"content", "weather?"}},
                       {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", json::array()}},
                       {{"type", "function_call"},
                        {"call_id", "c1"},
                        {"name", "get_weather"},
                        {"arguments", "{}"}},
                       {{"type", "function_call_output"}, {"call_id", "c1"}, {"output", "sunny"}}}},
                     {"tools", tools},
                     {"tool_choice", "none"},
                     {"max_output_tokens", 400}};
  const auto followed = post("/v1/responses", turn);
  ASSERT_EQ(followed.status, 200) << followed.body;
  const std::string echoed =
      json::parse(followed.body)["output"][0]["content"][0]["text"].get<std::string>();
  EXPECT_NE(echoed.find("sunny"), std::string::npos) << echoed;
}

// With a reasoning parser: a reasoning item before the message, streamed before it too.
TEST_F(ServerTest, ResponsesApiReasoning) {
  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kNone, /*max_model_len=*/512, ReasoningParser::kQwen3);
  const json body = {{"input", "plan</think>Sure."}, {"max_output_tokens", 40}};
  const json j = json::parse(post("/v1/responses", body).body);
  ASSERT_EQ(j["output"].size(), 2u) << j.dump();
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  const std::string reasoning = j["output"][0]["content"][0]["text"];
  const std::string text = j["output"][1]["content"][0]["text"];
  EXPECT_EQ(reasoning, "<user>plan");
  EXPECT_TRUE(text.starts_with("Sure.")) << text;
  json streamed = body;
  streamed["stream"] = true;
  const StreamedResponse s = collect_response_stream(post("/v1/responses", streamed).body);
  EXPECT_EQ(s.reasoning, reasoning);
  EXPECT_EQ(s.text, text);
  EXPECT_EQ(s.done_items, s.final_response["output"]) << "items as the stream closed them";
  json streamed_items = s.final_response["output"], items = j["output"];
  for (json* list : {&streamed_items, &items})
    for (json& it : *list) it.erase("id");
  EXPECT_EQ(streamed_items, items) << "the same items, ids aside";
}

}  // namespace
}  // namespace serval::server
