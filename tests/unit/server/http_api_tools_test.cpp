// Tool-call and reasoning parsers in chat outputs, plain and streamed, over real sockets against
// FakeEngine.
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

// --enable-auto-tool-choice (hermes): <tool_call> blocks of a chat output become tool_calls, the
// text before them the content, finish_reason "tool_calls"; streamed, the content stops short of
// the first block and each call comes as the model writes it: its name, then its arguments piece
// by piece. The fake engine echoes the rendered prompt one byte per token.
TEST_F(ServerTest, HermesToolCallsInChatOutputs) {
  const json tools =
      json::array({{{"type", "function"},
                    {"function", {{"name", "get_weather"}, {"parameters", json::object()}}}}});
  const std::string content =
      "Sure.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"
      "</tool_call><tool_call>{\"name\": \"f\"}</tool_call>";
  const std::string prompt = "<user>" + content + "\n<assistant>";  // the fake chat template
  json body = {{"messages", {{{"role", "user"}, {"content", content}}}},
               {"tools", tools},
               {"max_tokens", prompt.size()}};
  // Without the server flag, tools with tool_choice auto (the default) are refused, as by vLLM.
  expect_error(post("/v1/chat/completions", body), 400, "tool_choice");

  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kHermes, /*max_model_len=*/512);
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json choice = json::parse(r.body)["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  json msg = choice["message"];
  EXPECT_EQ(msg["content"], "<user>Sure.");
  ASSERT_EQ(msg["tool_calls"].size(), 2u) << msg.dump();
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()),
            json({{"city", "Paris"}}));
  EXPECT_EQ(msg["tool_calls"][1]["function"]["arguments"], "{}");
  EXPECT_NE(msg["tool_calls"][0]["id"], msg["tool_calls"][1]["id"]);

  body["stream"] = true;
  StreamedChat st = collect_chat_stream(post("/v1/chat/completions", body).body);
  EXPECT_EQ(st.content, "<user>Sure.");
  ASSERT_EQ(st.tool_calls.size(), 2u);
  EXPECT_EQ(st.tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(st.tool_calls[0]["function"]["arguments"],
            msg["tool_calls"][0]["function"]["arguments"]);
  EXPECT_EQ(st.tool_calls[1]["index"], 1);
  EXPECT_EQ(st.tool_calls[1]["function"]["name"], "f");
  EXPECT_EQ(st.tool_calls[1]["function"]["arguments"], "{}");
  EXPECT_GT(st.tool_call_entries, 5);  // the arguments came in pieces
  EXPECT_EQ(st.finish_reason, "tool_calls");
  body["parallel_tool_calls"] = false;
  st = collect_chat_stream(post("/v1/chat/completions", body).body);
  ASSERT_EQ(st.tool_calls.size(), 1u);
  EXPECT_EQ(st.tool_calls[0]["function"]["name"], "get_weather");

  // parallel_tool_calls false: the first call only.
  body["stream"] = false;
  body["parallel_tool_calls"] = false;
  const json first = json::parse(post("/v1/chat/completions", body).body)["choices"][0];
  ASSERT_EQ(first["message"]["tool_calls"].size(), 1u) << first.dump();
  EXPECT_EQ(first["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  body.erase("parallel_tool_calls");

  // tool_choice none: the text as it came.
  body["stream"] = false;
  body["tool_choice"] = "none";
  auto none = post("/v1/chat/completions", body);
  EXPECT_EQ(json::parse(none.body)["choices"][0]["message"]["content"], prompt);

  // A named function: the whole output is its arguments, one call, no content (FakeEngine echoes
  // the prompt instead of guided JSON: the plumbing only; the engine's guided decoding has its
  // own tests). Streamed: one tool_calls delta.
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const auto named = post("/v1/chat/completions", body);
  ASSERT_EQ(named.status, 200) << named.body;
  const json call = json::parse(named.body)["choices"][0]["message"];
  EXPECT_TRUE(call["content"].is_null()) << call.dump();
  ASSERT_EQ(call["tool_calls"].size(), 1u);
  EXPECT_EQ(call["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(call["tool_calls"][0]["function"]["arguments"], prompt);
  body["stream"] = true;
  st = collect_chat_stream(post("/v1/chat/completions", body).body);
  EXPECT_EQ(st.content, "");
  ASSERT_EQ(st.tool_calls.size(), 1u);
  EXPECT_GT(st.tool_call_entries, 5);
  EXPECT_EQ(st.tool_calls[0]["function"]["arguments"], prompt);

  // "required": a guided list of calls; an output that is no such list (here the echo) comes
  // back as text, streamed or not.
  body["tool_choice"] = "required";
  st = collect_chat_stream(post("/v1/chat/completions", body).body);
  EXPECT_EQ(st.content, prompt);
  EXPECT_TRUE(st.tool_calls.empty());
  body["stream"] = false;
  const json text = json::parse(post("/v1/chat/completions", body).body)["choices"][0];
  EXPECT_EQ(text["message"]["content"], prompt);
  EXPECT_FALSE(text["message"].contains("tool_calls"));

  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "f"}}}};  // not in tools
  expect_error(post("/v1/chat/completions", body), 400, "tool_choice");
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  body["response_format"] = {{"type", "json_object"}};
  expect_error(post("/v1/chat/completions", body), 400, "tool_choice");
}

// --tool-call-parser llama3_json, pythonic, mistral and qwen3_coder: a reply that is calls
// becomes tool_calls (content null, finish_reason "tool_calls"), streamed without content
// (pythonic's each call when it is complete, the others' arguments as they come); any other reply
// is content, streamed as it comes. The fake engine echoes the prompt; a system message renders
// bare, so it is the whole output.
TEST_F(ServerTest, Llama3JsonPythonicMistralAndQwen3CoderToolCallsInChatOutputs) {
  const json parameters = {
      {"type", "object"},
      {"properties", {{"city", {{"type", "string"}}}, {"days", {{"type", "integer"}}}}}};
  const json tools =
      json::array({{{"type", "function"},
                    {"function", {{"name", "get_weather"}, {"parameters", parameters}}}}});
  const auto chat = [&](const std::string& output, bool stream) {
    const json body = {{"messages", {{{"role", "system"}, {"content", output}}}},
                       {"add_generation_prompt", false},
                       {"tools", tools},
                       {"max_tokens", output.size()},
                       {"stream", stream}};
    return post("/v1/chat/completions", body);
  };
  const std::pair<ToolCallParser, std::string> cases[] = {
      {ToolCallParser::kLlama3Json,
       "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": "
       "2}}; {\"name\": \"f\", \"parameters\": {}}"},
      {ToolCallParser::kPythonic, "[get_weather(city='Paris', days=2), f()]"},
      {ToolCallParser::kMistral,
       "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 2}[TOOL_CALLS]f[ARGS]{}"},
      {ToolCallParser::kQwen3Coder,
       "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter="
       "days>\n2\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=f>\n</function>\n"
       "</tool_call>"}};
  for (const auto& [parser, output] : cases) {
    SCOPED_TRACE(output);
    server_->shutdown(1.0);
    engine_->shutdown();
    start(0, 64, "", parser, /*max_model_len=*/512);
    const auto r = chat(output, false);
    ASSERT_EQ(r.status, 200) << r.body;
    const json choice = json::parse(r.body)["choices"][0];
    EXPECT_EQ(choice["finish_reason"], "tool_calls");
    EXPECT_TRUE(choice["message"]["content"].is_null()) << choice.dump();
    const json& calls = choice["message"]["tool_calls"];
    ASSERT_EQ(calls.size(), 2u) << choice.dump();
    EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
    const std::string arguments = parser == ToolCallParser::kPythonic
                                      ? R"({"city":"Paris","days":2})"
                                      : R"({"city": "Paris", "days": 2})";
    EXPECT_EQ(calls[0]["function"]["arguments"], arguments);
    EXPECT_EQ(calls[1]["function"]["name"], "f");
    EXPECT_EQ(calls[1]["function"]["arguments"], "{}");

    const StreamedChat st = collect_chat_stream(chat(output, true).body);
    EXPECT_EQ(st.content, "");
    ASSERT_EQ(st.tool_calls.size(), 2u);
    EXPECT_EQ(st.tool_calls[0]["function"]["arguments"], arguments);
    EXPECT_EQ(st.finish_reason, "tool_calls");
    if (parser != ToolCallParser::kPythonic) {  // the arguments in pieces (qwen3_coder: "{",
      EXPECT_GT(st.tool_call_entries, 3);       // then one per parameter, then "}")
    }
    if (parser == ToolCallParser::kMistral) {  // Mistral's templates want 9-character ids
      EXPECT_EQ(calls[0]["id"].get<std::string>().size(), 9u);
      EXPECT_EQ(st.tool_calls[0]["id"].get<std::string>().size(), 9u);
    }

    const std::string plain = "It is sunny in Paris.";
    EXPECT_EQ(json::parse(chat(plain, false).body)["choices"][0]["message"]["content"], plain);
    const StreamedChat text = collect_chat_stream(chat(plain, true).body);
    EXPECT_EQ(text.content, plain);
    EXPECT_TRUE(text.tool_calls.empty());
  }
}

// --reasoning-parser mistral (Magistral): the reply starts as content; [THINK] … [/THINK] is the
// reasoning, content around it; with the mistral tool parser a call after the block is a call.
TEST_F(ServerTest, MistralReasoningParserSplitsChatOutputs) {
  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kMistral, /*max_model_len=*/512, ReasoningParser::kMistral);
  const std::string message = "[THINK]plan [TOOL_CALLS]g{}[/THINK]Sure.";
  const std::string prompt = "<user>" + message + "\n<assistant>";
  json body = {{"messages", {{{"role", "user"}, {"content", message}}}},
               {"max_tokens", prompt.size()}};
  json msg = json::parse(post("/v1/chat/completions", body).body)["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning"], "plan [TOOL_CALLS]g{}");
  EXPECT_EQ(msg["content"], "<user>Sure.\n<assistant>");
  body["stream"] = true;
  const StreamedChat s = collect_chat_stream(post("/v1/chat/completions", body).body);
  EXPECT_EQ(s.reasoning, msg["reasoning"]);
  EXPECT_EQ(s.content, msg["content"]);

  const std::string with_call = "[THINK]plan[/THINK][TOOL_CALLS]f[ARGS]{\"a\": 1}";
  body = {{"messages", {{{"role", "system"}, {"content", with_call}}}},
          {"tools", json::array({{{"type", "function"},
                                  {"function", {{"name", "f"}, {"parameters", json::object()}}}}})},
          {"max_tokens", with_call.size()}};
  const json choice = json::parse(post("/v1/chat/completions", body).body)["choices"][0];
  EXPECT_EQ(choice["message"]["reasoning"], "plan");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice.dump();
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
}

// --reasoning-parser qwen3: text before </think> is `reasoning` (and `reasoning_content`), the rest
// `content`, streamed or not; enable_thinking false makes it all content; include_reasoning false
// drops the reasoning; tool calls are parsed out of the content part only. The fake engine echoes
// the rendered prompt "<user>" + message + "\n<assistant>".
TEST_F(ServerTest, ReasoningParserSplitsChatOutputs) {
  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kHermes, /*max_model_len=*/512, ReasoningParser::kQwen3);
  const std::string message = "plan <tool_call>{\"name\": \"g\"}</tool_call></think>Sure.";
  const std::string prompt = "<user>" + message + "\n<assistant>";
  json body = {{"messages", {{{"role", "user"}, {"content", message}}}},
               {"max_tokens", prompt.size()}};
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json msg = json::parse(r.body)["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning"], "<user>plan <tool_call>{\"name\": \"g\"}</tool_call>");
  EXPECT_EQ(msg["reasoning_content"], msg["reasoning"]);
  EXPECT_EQ(msg["content"], "Sure.\n<assistant>");
  EXPECT_FALSE(msg.contains("tool_calls")) << "a call inside the reasoning is not a call";

  body["stream"] = true;
  StreamedChat s = collect_chat_stream(post("/v1/chat/completions", body).body);
  EXPECT_EQ(s.reasoning, msg["reasoning"]);
  EXPECT_EQ(s.reasoning_content, msg["reasoning"]);
  EXPECT_EQ(s.content, msg["content"]);
  EXPECT_EQ(s.finish_reason, "length");

  // Thinking off: all content; the reasoning fields are there, null.
  body["stream"] = false;
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  msg = json::parse(post("/v1/chat/completions", body).body)["choices"][0]["message"];
  EXPECT_EQ(msg["content"], prompt);
  EXPECT_TRUE(msg["reasoning"].is_null());
  body.erase("chat_template_kwargs");
  body["include_reasoning"] = false;
  msg = json::parse(post("/v1/chat/completions", body).body)["choices"][0]["message"];
  EXPECT_TRUE(msg["reasoning"].is_null());
  EXPECT_EQ(msg["content"], "Sure.\n<assistant>");
  body["stream"] = true;
  s = collect_chat_stream(post("/v1/chat/completions", body).body);
  EXPECT_EQ(s.reasoning, "");
  EXPECT_EQ(s.content, "Sure.\n<assistant>");

  // A call after </think> is one, streamed or not.
  const std::string with_call = "plan</think>Ok.<tool_call>{\"name\": \"f\"}</tool_call>";
  body = {{"messages", {{{"role", "user"}, {"content", with_call}}}},
          {"tools", json::array({{{"type", "function"},
                                  {"function", {{"name", "f"}, {"parameters", json::object()}}}}})},
          {"max_tokens", with_call.size() + 20}};
  r = post("/v1/chat/completions", body);
  json choice = json::parse(r.body)["choices"][0];
  EXPECT_EQ(choice["message"]["reasoning"], "<user>plan");
  EXPECT_EQ(choice["message"]["content"], "Ok.");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.body;
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  body["stream"] = true;
  s = collect_chat_stream(post("/v1/chat/completions", body).body);
  EXPECT_EQ(s.reasoning, "<user>plan");
  EXPECT_EQ(s.content, "Ok.");
  ASSERT_EQ(s.tool_calls.size(), 1u);
  EXPECT_EQ(s.tool_calls[0]["function"]["name"], "f");
  EXPECT_EQ(s.finish_reason, "tool_calls");
}

}  // namespace
}  // namespace serval::server
