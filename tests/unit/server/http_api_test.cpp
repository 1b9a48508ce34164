// The OpenAI-compatible server end to end over real sockets, against FakeEngine.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <filesystem>
#include <functional>

#include <cstdio>
#include <fstream>

#include "server/embeddings_api.h"
#include "server/score_api.h"
#include "server/server.h"
#include "server_fixture.h"
#include "unit/server/promtool_check.h"

namespace serval::server {
namespace {

using nlohmann::json;
using testing::FakeEngine;
using testing::http;
using testing::ServerTest;
using testing::sse_events;

TEST_F(ServerTest, HealthVersionModels) {
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
  EXPECT_EQ(http(port_, "GET", "/ping").status, 200);
  EXPECT_EQ(http(port_, "POST", "/ping").status, 200);
  engine_->set_healthy(false);
  EXPECT_EQ(http(port_, "GET", "/health").status, 503);
  EXPECT_EQ(http(port_, "POST", "/ping").status, 503);
  engine_->set_healthy(true);
  auto v = http(port_, "GET", "/version");
  EXPECT_EQ(json::parse(v.body)["version"], "0.1.0");
  auto m = json::parse(http(port_, "GET", "/v1/models").body);
  EXPECT_EQ(m["object"], "list");
  const json& e = m["data"][0];
  EXPECT_EQ(e["id"], "fake-model");
  EXPECT_EQ(e["object"], "model");
  EXPECT_EQ(e["owned_by"], "serval");
  EXPECT_EQ(e["root"], "/models/fake");
  EXPECT_EQ(e["max_model_len"], 64);
  EXPECT_EQ(e["vocab_size"], 257);
  EXPECT_EQ(e["serval"]["moe_backend"], "latency");
  EXPECT_EQ(e["serval"]["architecture"], "FakeMoeForCausalLM");
  EXPECT_EQ(e["serval"]["num_parameters"], 1234);
}

TEST_F(ServerTest, CompletionEchoesPromptDeterministically) {
  auto r = post("/v1/completions", {{"model", "fake-model"}, {"prompt", "abc"}, {"max_tokens", 5}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("cmpl-"));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "fake-model");
  EXPECT_EQ(j["choices"][0]["text"], "abcab");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"],
            json({{"prompt_tokens", 3}, {"completion_tokens", 5}, {"total_tokens", 8}}));
  // Default max_tokens is 16.
  auto d = json::parse(post("/v1/completions", {{"prompt", "xy"}}).body);
  EXPECT_EQ(d["usage"]["completion_tokens"], 16);
}

TEST_F(ServerTest, BatchPromptsAndNGiveIndexedChoicesAndSeeds) {
  auto r = post("/v1/completions",
                {{"prompt", {"ab", "cd"}}, {"n", 2}, {"max_tokens", 3}, {"seed", 10}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  EXPECT_EQ(j["choices"][1]["text"], "aba");
  EXPECT_EQ(j["choices"][2]["text"], "cdc");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  auto sub = engine_->submitted();
  ASSERT_EQ(sub.size(), 4u);
  EXPECT_EQ(*sub[0].seed, 10u);
  EXPECT_EQ(*sub[1].seed, 11u);
  EXPECT_EQ(*sub[2].seed, 10u);
}

TEST_F(ServerTest, TokenPromptsEchoAndStopTokenIds) {
  auto r = post(
      "/v1/completions",
      {{"prompt", {104, 105, 33}}, {"echo", true}, {"max_tokens", 10}, {"stop_token_ids", {33}}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  // Generates "h", "i", then "!" which is a stop id and is not part of the text.
  EXPECT_EQ(j["choices"][0]["text"], "hi!hi");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
}

TEST_F(ServerTest, StopStringAcrossTokensIsRemovedAndAborts) {
  auto r = post("/v1/completions",
                {{"prompt", "hello world "}, {"max_tokens", 40}, {"stop", {"lo w", "zz"}}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], "hel");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 7);  // "hello " then the stop completes at "w"
  for (int i = 0; i < 100 && engine_->num_active() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(engine_->aborted().size(), 1u);
}

// include_stop_str_in_output keeps the matched stop string, and a stop token's text.
TEST_F(ServerTest, IncludeStopStrInOutput) {
  auto r = post("/v1/completions", {{"prompt", "hello world "},
                                    {"max_tokens", 40},
                                    {"stop", {"lo w"}},
                                    {"include_stop_str_in_output", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], "hello w");
  r = post("/v1/completions", {{"prompt", {104, 105, 33}},
                               {"max_tokens", 10},
                               {"stop_token_ids", {33}},
                               {"include_stop_str_in_output", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], "hi!");
}

// The generation config's max_new_tokens caps a request's max_tokens (the smaller wins).
TEST_F(ServerTest, GenerationConfigMaxNewTokensCapsRequests) {
  engine_->set_max_new_tokens(3);
  const json body = {{"prompt", "hello world"}, {"max_tokens", 8}};
  const json j = json::parse(post("/v1/completions", body).body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3) << j.dump();
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, CompletionLogprobsShape) {
  auto r = post("/v1/completions", {{"prompt", "ab"}, {"max_tokens", 3}, {"logprobs", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = json::parse(r.body)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b", "a"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.5, -0.5}));
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2}));
  ASSERT_EQ(lp["top_logprobs"].size(), 3u);
  EXPECT_EQ(lp["top_logprobs"][0], json({{"a", -0.5}, {"A", -1.0}, {"B", -2.0}}));
  EXPECT_EQ(engine_->submitted()[0].logprobs, 2);
}

TEST_F(ServerTest, ReturnTokensAsTokenIdsInLogprobs) {
  auto r = post(
      "/v1/completions",
      {{"prompt", "ab"}, {"max_tokens", 3}, {"logprobs", 0}, {"return_tokens_as_token_ids", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body)["choices"][0];
  EXPECT_EQ(j["logprobs"]["tokens"], json({"token_id:97", "token_id:98", "token_id:97"}));
  EXPECT_EQ(j["logprobs"]["top_logprobs"][1], json({{"token_id:98", -0.5}}));
  EXPECT_EQ(j["text"], "aba");  // the text itself is unchanged
}

TEST_F(ServerTest, ChatCompletionAndLogprobs) {
  json body = {
      {"model", "fake-model"},
      {"messages", {{{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi"}}}}}}},
      {"max_completion_tokens", 4},
      {"logprobs", true},
      {"top_logprobs", 1}};
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_TRUE(j["id"].get<std::string>().starts_with("chatcmpl-"));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"],
            "<use");  // the prompt is "<user>hi\n<assistant>"
  const json& c = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0]["token"], "<");
  EXPECT_EQ(c[0]["bytes"], json({60}));
  EXPECT_EQ(c[0]["top_logprobs"][0]["token"], "A");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 20);
  // Without max tokens the rest of the context is the limit: 64 - 20.
  body.erase("max_completion_tokens");
  ASSERT_EQ(post("/v1/chat/completions", body).status, 200);
  EXPECT_EQ(engine_->submitted().back().max_tokens, 44);
}

TEST_F(ServerTest, StreamingCompletionWithUsage) {
  auto r = post("/v1/completions", {{"prompt", "abc"},
                                    {"max_tokens", 4},
                                    {"stream", true},
                                    {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("text/event-stream"), std::string::npos);
  auto ev = sse_events(r.body);
  ASSERT_GE(ev.size(), 3u);
  EXPECT_EQ(ev.back(), "[DONE]");
  std::string text;
  for (size_t i = 0; i + 2 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    EXPECT_EQ(c["object"], "text_completion");
    text += c["choices"][0]["text"].get<std::string>();
    bool last = i + 3 == ev.size();
    EXPECT_EQ(c["choices"][0]["finish_reason"].is_null(), !last);
  }
  EXPECT_EQ(text, "abca");
  json usage = json::parse(ev[ev.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
}

// vLLM's continuous_usage_stats: every chunk carries the usage so far of its choice (the prompt's
// 3 tokens and the completion tokens up to it), the last one the request's total as before.
TEST_F(ServerTest, StreamingWithContinuousUsageStats) {
  auto r = post("/v1/completions",
                {{"prompt", "abc"},
                 {"max_tokens", 4},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}});
  ASSERT_EQ(r.status, 200);
  auto ev = sse_events(r.body);
  ASSERT_GE(ev.size(), 3u);
  int64_t previous = 0;
  for (size_t i = 0; i + 2 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    ASSERT_TRUE(c.contains("usage")) << ev[i];
    EXPECT_EQ(c["usage"]["prompt_tokens"], 3);
    const int64_t completion = c["usage"]["completion_tokens"].get<int64_t>();
    EXPECT_GE(completion, previous);
    EXPECT_LE(completion, 4);
    EXPECT_EQ(c["usage"]["total_tokens"], 3 + completion);
    previous = completion;
  }
  EXPECT_EQ(previous, 4);
  EXPECT_EQ(json::parse(ev[ev.size() - 2])["usage"]["total_tokens"], 7);

  // Without it (include_usage alone) only the last chunk has usage.
  auto plain = post("/v1/completions", {{"prompt", "abc"},
                                        {"max_tokens", 4},
                                        {"stream", true},
                                        {"stream_options", {{"include_usage", true}}}});
  auto plain_ev = sse_events(plain.body);
  for (size_t i = 0; i + 2 < plain_ev.size(); ++i)
    EXPECT_FALSE(json::parse(plain_ev[i]).contains("usage")) << plain_ev[i];
}

// vLLM's prompt_logprobs: null, then per prompt token an object from ids to logprob, rank and
// decoded token (the token itself and the top alternatives); echo with logprobs puts the prompt
// tokens' entries before the generated ones, streamed or not. Streaming refuses prompt_logprobs.
TEST_F(ServerTest, PromptLogprobsAndEchoWithLogprobs) {
  auto r = post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 2}, {"prompt_logprobs", 1}});
  ASSERT_EQ(r.status, 200) << r.body;
  json pl = json::parse(r.body)["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), 3u) << pl.dump();
  EXPECT_TRUE(pl[0].is_null());
  const std::string b = std::to_string(int('b')), c = std::to_string(int('c'));
  EXPECT_EQ(pl[1][b]["logprob"], -0.25);
  EXPECT_EQ(pl[1][b]["rank"], 1);
  EXPECT_EQ(pl[1][b]["decoded_token"], "b");
  EXPECT_EQ(pl[2][c]["rank"], 2);
  EXPECT_EQ(pl[2]["65"]["rank"], 1);  // the alternative
  EXPECT_EQ(pl[2]["65"]["decoded_token"], "A");

  auto chat = post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "xy"}}}},
                                            {"max_tokens", 1},
                                            {"prompt_logprobs", 0}});
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_TRUE(json::parse(chat.body)["prompt_logprobs"][0].is_null());

  auto echo = post("/v1/completions",
                   {{"prompt", "abc"}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}});
  ASSERT_EQ(echo.status, 200) << echo.body;
  json choice = json::parse(echo.body)["choices"][0];
  EXPECT_EQ(choice["text"], "abcab");
  json lp = choice["logprobs"];
  EXPECT_EQ(lp["tokens"], json::array({"a", "b", "c", "a", "b"}));
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -0.25);
  EXPECT_EQ(lp["token_logprobs"][3], -0.5);  // generated: the fake engine's -0.5
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][2].size(), 2u);  // "c" and one alternative
  EXPECT_EQ(lp["text_offset"], json::array({0, 1, 2, 3, 4}));
  EXPECT_FALSE(choice.contains("prompt_logprobs"));  // not asked for

  // Streamed: the chunks' logprobs concatenate to the same lists.
  auto streamed = post(
      "/v1/completions",
      {{"prompt", "abc"}, {"max_tokens", 2}, {"echo", true}, {"logprobs", 1}, {"stream", true}});
  json tokens = json::array(), token_logprobs = json::array();
  for (const std::string& ev : sse_events(streamed.body)) {
    if (ev == "[DONE]") break;
    const json c = json::parse(ev)["choices"][0];
    if (c["logprobs"].is_null()) continue;
    for (const json& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const json& t : c["logprobs"]["token_logprobs"]) token_logprobs.push_back(t);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(token_logprobs, lp["token_logprobs"]);

  expect_error(
      post("/v1/completions", {{"prompt", "abc"}, {"stream", true}, {"prompt_logprobs", 1}}), 400,
      "prompt_logprobs");
  expect_error(post("/v1/completions", {{"prompt", "abc"}, {"prompt_logprobs", 99}}), 400,
               "prompt_logprobs");
}

// CORS as vLLM's server: a preflight is answered before routing and the API key (200 with the
// allow headers), and responses to requests from an Origin carry Access-Control-Allow-Origin,
// errors included.
TEST_F(ServerTest, CorsPreflightAndAllowHeaders) {
  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "secret");
  const auto pre = http(port_, "OPTIONS", "/v1/chat/completions", "",
                        "Origin: https://app.example\r\nAccess-Control-Request-Method: POST\r\n"
                        "Access-Control-Request-Headers: authorization, content-type\r\n");
  EXPECT_EQ(pre.status, 200) << pre.body;
  EXPECT_EQ(pre.body, "OK");
  EXPECT_NE(pre.headers.find("access-control-allow-origin: *"), std::string::npos) << pre.headers;
  EXPECT_NE(pre.headers.find("access-control-allow-headers: authorization, content-type"),
            std::string::npos)
      << pre.headers;
  const auto models = http(port_, "GET", "/v1/models", "",
                           "Origin: https://app.example\r\nAuthorization: Bearer secret\r\n");
  EXPECT_EQ(models.status, 200);
  EXPECT_NE(models.headers.find("access-control-allow-origin: *"), std::string::npos);
  const auto denied = http(port_, "GET", "/v1/models", "", "Origin: https://app.example\r\n");
  EXPECT_EQ(denied.status, 401);
  EXPECT_NE(denied.headers.find("access-control-allow-origin: *"), std::string::npos);
  // No Origin: no CORS headers; OPTIONS without a preflight's method is routed (405).
  EXPECT_EQ(http(port_, "GET", "/health").headers.find("access-control"), std::string::npos);
  EXPECT_EQ(http(port_, "OPTIONS", "/v1/models", "", "Origin: https://a\r\n").status, 405);
}

// One request over a Unix domain socket; the whole response as read until the server closes.
std::string unix_socket_exchange(const std::string& path, const std::string& request) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)::write(fd, request.data(), request.size());
  std::string response;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) response.append(buf, size_t(n));
  ::close(fd);
  return response;
}

// --uds: the server listens on a Unix domain socket instead of a TCP port; the socket file is
// removed when it stops.
TEST_F(ServerTest, ServesOnAUnixDomainSocket) {
  server_->shutdown(1.0);
  engine_->shutdown();
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("serval_uds_test_" + std::to_string(::getpid()) + ".sock"))
                               .string();
  start(0, 64, "", ToolCallParser::kNone, 64, ReasoningParser::kNone, false,
        [&](ServerOptions& o) { o.uds = path; });
  EXPECT_EQ(port_, 0);
  EXPECT_TRUE(std::filesystem::is_socket(path));
  const std::string body = R"({"prompt": "abc", "max_tokens": 2})";
  const std::string response = unix_socket_exchange(
      path,
      "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n"
      "Content-Type: application/json\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_TRUE(response.starts_with("HTTP/1.1 200")) << response;
  EXPECT_NE(response.find("\"text_completion\""), std::string::npos) << response;
  server_->shutdown(1.0);
  EXPECT_FALSE(std::filesystem::exists(path));
  engine_->shutdown();
  start();  // for TearDown
}

// Request ids (vLLM): a response's id carries the X-Request-Id header or the body's request_id;
// with --enable-request-id-headers every response has an X-Request-Id header, its own or new.
TEST_F(ServerTest, RequestIdsFromTheHeaderOrTheBody) {
  const json body = {{"prompt", "abc"}, {"max_tokens", 2}};
  const auto plain = http(port_, "POST", "/v1/completions", body.dump());
  EXPECT_EQ(plain.headers.find("x-request-id"), std::string::npos) << plain.headers;
  const auto from_header =
      http(port_, "POST", "/v1/completions", body.dump(), "X-Request-Id: trace-42\r\n");
  EXPECT_EQ(json::parse(from_header.body)["id"], "cmpl-trace-42");
  json with_id = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                  {"max_tokens", 2},
                  {"request_id", "body-7"}};
  EXPECT_EQ(json::parse(post("/v1/chat/completions", with_id).body)["id"], "chatcmpl-body-7");
  with_id["request_id"] = 3;
  expect_error(post("/v1/chat/completions", with_id), 400, "request_id");

  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kNone, 64, ReasoningParser::kNone, false,
        [](ServerOptions& o) { o.request_id_headers = true; });
  const auto echoed =
      http(port_, "POST", "/v1/completions", body.dump(), "X-Request-Id: trace-42\r\n");
  EXPECT_NE(echoed.headers.find("x-request-id: trace-42"), std::string::npos) << echoed.headers;
  const auto fresh = http(port_, "GET", "/v1/models");
  const size_t at = fresh.headers.find("x-request-id: ");
  ASSERT_NE(at, std::string::npos) << fresh.headers;
  EXPECT_EQ(fresh.headers.find("\r\n", at) - at, std::string("x-request-id: ").size() + 32);
}

// --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens from the engine's
// updates, each prompt counted once whatever n is; absent without the flag.
TEST_F(ServerTest, PromptTokensDetailsReportCachedTokens) {
  const std::string prompt(70, 'a');  // 70 byte tokens: FakeEngine reports 32 cached
  const json body = {
      {"prompt", json::array({prompt, prompt.substr(0, 40)})}, {"max_tokens", 3}, {"n", 2}};
  json usage = json::parse(post("/v1/completions", body).body)["usage"];
  EXPECT_FALSE(usage.contains("prompt_tokens_details")) << usage.dump();

  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kNone, /*max_model_len=*/512, ReasoningParser::kNone,
        /*prompt_tokens_details=*/true);
  usage = json::parse(post("/v1/completions", body).body)["usage"];
  EXPECT_EQ(usage["prompt_tokens"], 110);
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"],
            testing::fake_cached_tokens(70) + testing::fake_cached_tokens(40))
      << usage.dump();
  json stream_body = body;
  stream_body["stream"] = true;
  stream_body["stream_options"] = {{"include_usage", true}};
  std::optional<json> last;
  for (const std::string& ev : sse_events(post("/v1/completions", stream_body).body))
    if (ev != "[DONE]") last = json::parse(ev);
  ASSERT_TRUE(last && (*last)["usage"].is_object());
  EXPECT_EQ((*last)["usage"]["prompt_tokens_details"]["cached_tokens"], 48);
}

TEST_F(ServerTest, StreamingChatStartsWithRoleAndHoldsBackStops) {
  json body = {{"messages", {{{"role", "user"}, {"content", "xy"}}}},
               {"max_tokens", 30},
               {"stream", true},
               {"stop", "xy\n<"}};
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200);
  auto ev = sse_events(r.body);
  ASSERT_GE(ev.size(), 3u);
  json first = json::parse(ev[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  std::string text;
  std::string reason;
  for (size_t i = 1; i + 1 < ev.size(); ++i) {
    json c = json::parse(ev[i]);
    if (c["choices"][0]["delta"].contains("content"))
      text += c["choices"][0]["delta"]["content"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) reason = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "<user>");  // prompt "<user>xy\n<assistant>" echoed up to the stop string
  EXPECT_EQ(reason, "stop");
  EXPECT_EQ(ev.back(), "[DONE]");
}

// The role chunk goes out with the first output, not on arrival: clients that time the first
// chunk (vLLM's bench serve) measure the time to the first token.
TEST_F(ServerTest, StreamingChatRoleChunkWaitsForTheFirstToken) {
  engine_->set_paused(true);
  const int fd = testing::connect_to(port_);
  const std::string body = json({{"messages", {{{"role", "user"}, {"content", "ab"}}}},
                                 {"max_tokens", 2},
                                 {"stream", true}})
                               .dump();
  testing::send_all(fd, testing::request_text("POST", "/v1/chat/completions", body, ""));
  for (int i = 0; i < 400 && engine_->num_active() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(engine_->num_active(), 1);
  std::string raw;
  char buf[4096];
  const auto read_for = [&](int ms) {  // what arrives within `ms`
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, ms) > 0) {
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      raw.append(buf, static_cast<size_t>(n));
    }
  };
  read_for(100);
  EXPECT_EQ(raw.find("data:"), std::string::npos) << raw;
  engine_->set_paused(false);
  while (raw.find("[DONE]") == std::string::npos) {
    const size_t before = raw.size();
    read_for(2000);
    ASSERT_GT(raw.size(), before) << raw;
  }
  ::close(fd);
  const size_t first = raw.find("data: ");
  ASSERT_NE(first, std::string::npos);
  const json chunk = json::parse(raw.substr(first + 6, raw.find('\n', first) - first - 6));
  EXPECT_EQ(chunk["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
}

// --runner pooling: /v1/embeddings takes OpenAI's inputs (a string, strings, token ids, lists of
// them), returns each input's vector normalized (or raw with normalize false), cut to
// `dimensions`, as floats or base64; generation routes are refused, as the other way round.
TEST_F(ServerTest, EmbeddingsApi) {
  expect_error(post("/v1/embeddings", {{"input", "ab"}}), 400, "");
  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kNone, 64, ReasoningParser::kNone, false);
  engine_->set_pooling();
  const auto raw = [](const std::vector<int32_t>& ids) { return FakeEngine::fake_embedding(ids); };
  const auto unit = [](std::vector<float> v) {
    double n = 0;
    for (float x : v) n += double(x) * x;
    for (float& x : v) x = float(x / std::sqrt(n));
    return v;
  };
  const auto floats = [](const json& e) { return e.get<std::vector<float>>(); };
  const auto expect_near = [](const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << i;
  };

  auto r = post("/v1/embeddings", {{"input", {"ab", "xyz"}}, {"model", "fake-model"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["model"], "fake-model");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][1]["index"], 1);
  EXPECT_EQ(j["data"][1]["object"], "embedding");
  expect_near(floats(j["data"][0]["embedding"]), unit(raw({'a', 'b'})));
  expect_near(floats(j["data"][1]["embedding"]), unit(raw({'x', 'y', 'z'})));
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["total_tokens"], 5);

  j = json::parse(post("/v1/embeddings", {{"input", {7, 8, 9}}, {"normalize", false}}).body);
  expect_near(floats(j["data"][0]["embedding"]), raw({7, 8, 9}));
  j = json::parse(post("/v1/embeddings", {{"input", {{7, 8}, {9}}}, {"dimensions", 2}}).body);
  expect_near(floats(j["data"][0]["embedding"]), unit({2, 15}));
  expect_near(floats(j["data"][1]["embedding"]), unit({1, 9}));

  // base64: the float32 bytes, little-endian.
  j = json::parse(post("/v1/embeddings",
                       {{"input", {7, 8, 9}}, {"encoding_format", "base64"}, {"normalize", false}})
                      .body);
  const std::vector<float> want = raw({7, 8, 9});
  EXPECT_EQ(j["data"][0]["embedding"], base64_encode(want.data(), want.size() * sizeof(float)));
  EXPECT_EQ(base64_encode("Ma", 2), "TWE=");
  EXPECT_EQ(base64_encode("Man", 3), "TWFu");

  expect_error(post("/v1/embeddings", {{"input", "ab"}, {"dimensions", 5}}), 400, "dimensions");
  expect_error(post("/v1/embeddings", {{"input", "ab"}, {"encoding_format", "hex"}}), 400,
               "encoding_format");
  expect_error(post("/v1/embeddings", {{"input", json::array()}}), 400, "input");
  expect_error(post("/v1/embeddings", {{"input", std::string(65, 'a')}}), 400, "input");
  expect_error(post("/v1/embeddings", {{"input", "ab"}, {"model", "other"}}), 404, "model");
  expect_error(post("/v1/completions", {{"prompt", "ab"}}), 400, "");
  expect_error(post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "a"}}}}}),
               400, "");
  EXPECT_EQ(json::parse(http(port_, "GET", "/v1/models").body)["data"][0]["serval"]["runner"],
            "pooling");

  // --pooler-config '{"normalize": false}': raw vectors unless a request asks otherwise.
  server_->shutdown(1.0);
  engine_->shutdown();
  start(0, 64, "", ToolCallParser::kNone, 64, ReasoningParser::kNone, false,
        [](ServerOptions& o) { o.embed_normalize = false; });
  engine_->set_pooling();
  j = json::parse(post("/v1/embeddings", {{"input", {7, 8, 9}}}).body);
  expect_near(floats(j["data"][0]["embedding"]), raw({7, 8, 9}));
  j = json::parse(post("/v1/embeddings", {{"input", {7, 8, 9}}, {"normalize", true}}).body);
  expect_near(floats(j["data"][0]["embedding"]), unit(raw({7, 8, 9})));
}

// /score and /rerank on an embedding model: cosine similarities of the texts' embeddings (1:N
// and N:N pairs; documents ranked, top_n), and their errors.
TEST_F(ServerTest, ScoreAndRerank) {
  expect_error(post("/score", {{"text_1", "a"}, {"text_2", "b"}}), 400, "");
  engine_->set_pooling();
  const auto emb = [](const std::string& s) {
    return FakeEngine::fake_embedding(std::vector<int32_t>(s.begin(), s.end()));
  };
  const auto cosine = [&](const std::string& a, const std::string& b) {
    return cosine_similarity(emb(a), emb(b));
  };
  json j = json::parse(post("/v1/score", {{"text_1", "ab"}, {"text_2", {"ab", "zzzz", "b"}}}).body);
  ASSERT_EQ(j["data"].size(), 3u) << j.dump();
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][1]["object"], "score");
  EXPECT_NEAR(j["data"][0]["score"].get<double>(), 1.0, 1e-6);  // a text with itself
  EXPECT_NEAR(j["data"][1]["score"].get<double>(), cosine("ab", "zzzz"), 1e-6);
  EXPECT_NEAR(j["data"][2]["score"].get<double>(), cosine("ab", "b"), 1e-6);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 2 + 2 + 4 + 1);
  j = json::parse(post("/score", {{"text_1", {"ab", "c"}}, {"text_2", {"b", "cc"}}}).body);
  EXPECT_NEAR(j["data"][1]["score"].get<double>(), cosine("c", "cc"), 1e-6);
  expect_error(post("/score", {{"text_1", {"a", "b"}}, {"text_2", {"a", "b", "c"}}}), 400,
               "text_2");
  expect_error(post("/score", {{"text_1", 3}, {"text_2", "b"}}), 400, "text_1");

  const std::vector<std::string> docs = {"zzzz", "ab", "abc", "b"};
  std::vector<size_t> order = {0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return cosine("ab", docs[a]) > cosine("ab", docs[b]);
  });
  j = json::parse(post("/v2/rerank", {{"query", "ab"}, {"documents", docs}, {"top_n", 2}}).body);
  ASSERT_EQ(j["results"].size(), 2u) << j.dump();
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(j["results"][r]["index"], order[r]);
    EXPECT_EQ(j["results"][r]["document"]["text"], docs[order[r]]);
    EXPECT_NEAR(j["results"][r]["relevance_score"].get<double>(), cosine("ab", docs[order[r]]),
                1e-6);
  }
  EXPECT_EQ(j["usage"]["total_tokens"], 2 + 4 + 2 + 3 + 1);
  EXPECT_EQ(
      json::parse(post("/rerank", {{"query", "ab"}, {"documents", docs}}).body)["results"].size(),
      4u);
  expect_error(post("/v1/rerank", {{"query", "ab"}, {"documents", json::array()}}), 400,
               "documents");
  expect_error(post("/rerank", {{"documents", docs}}), 400, "query");
  expect_error(post("/rerank", {{"query", "ab"}, {"documents", docs}, {"top_n", -1}}), 400,
               "top_n");
}

TEST_F(ServerTest, TokenizeAndDetokenize) {
  auto t = json::parse(post("/tokenize", {{"prompt", "hi!"}}).body);
  EXPECT_EQ(t["tokens"], json({104, 105, 33}));
  EXPECT_EQ(t["count"], 3);
  EXPECT_EQ(t["max_model_len"], 64);
  auto m =
      json::parse(post("/tokenize", {{"messages", {{{"role", "user"}, {"content", "a"}}}}}).body);
  EXPECT_EQ(m["count"], 19);  // "<user>a\n<assistant>"
  auto d = json::parse(post("/detokenize", {{"tokens", {104, 105, 256}}}).body);
  EXPECT_EQ(d["prompt"], "hi<|eos|>");
  expect_error(post("/detokenize", {{"tokens", {999}}}), 400, "tokens");
}

TEST_F(ServerTest, ValidationErrors) {
  auto bad = [&](const json& extra, const std::string& param) {
    json body = {{"prompt", "ab"}};
    body.update(extra);
    SCOPED_TRACE(body.dump());
    expect_error(post("/v1/completions", body), 400, param);
  };
  bad({{"max_tokens", -1}}, "max_tokens");
  bad({{"max_tokens", "5"}}, "max_tokens");
  bad({{"temperature", -0.1}}, "temperature");
  bad({{"top_p", 0}}, "top_p");
  bad({{"top_p", 1.5}}, "top_p");
  bad({{"n", 0}}, "n");
  bad({{"top_k", -2}}, "top_k");
  bad({{"min_p", 2}}, "min_p");
  bad({{"logprobs", 6}}, "logprobs");
  bad({{"stop", {"a", "b", "c", "d", "e"}}}, "stop");
  bad({{"stop", 3}}, "stop");
  bad({{"stream_options", {{"include_usage", true}}}}, "stream_options");
  bad({{"prompt", json::array()}}, "prompt");
  bad({{"prompt", {1, 99999}}}, "prompt");
  bad({{"prompt", 5}}, "prompt");
  // prompt (2) + max_tokens (63) > max_model_len (64): the message names the numbers.
  auto r = post("/v1/completions", {{"prompt", "ab"}, {"max_tokens", 63}});
  expect_error(r, 400, "max_tokens");
  EXPECT_NE(r.body.find("64"), std::string::npos);
  EXPECT_NE(r.body.find("63"), std::string::npos);
  expect_error(http(port_, "POST", "/v1/completions", "{not json"), 400, "");
  std::string deep = std::string(100, '[') + std::string(100, ']');
  expect_error(http(port_, "POST", "/v1/completions", "{\"prompt\":" + deep + "}"), 400, "");
  expect_error(
      post("/v1/chat/completions", {{"messages", {{{"role", "wizard"}, {"content", "x"}}}}}), 400,
      "messages");
  expect_error(post("/v1/chat/completions",
                    {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"top_logprobs", 2}}),
               400, "top_logprobs");
}

TEST_F(ServerTest, RoutingErrorsAndUnknownModel) {
  expect_error(http(port_, "GET", "/nope"), 404, "");
  expect_error(http(port_, "GET", "/v1/completions"), 405, "");
  expect_error(http(port_, "POST", "/health"), 405, "");
  const auto wrong = http(port_, "DELETE", "/ping");
  expect_error(wrong, 405, "");
  EXPECT_NE(wrong.body.find("GET or POST"), std::string::npos) << wrong.body;
  expect_error(post("/v1/completions", {{"model", "gpt-4"}, {"prompt", "a"}}), 404, "model");
}

TEST_F(ServerTest, BodyOverLimitIs413) {
  std::string big = "{\"prompt\":\"" + std::string((32u << 20) + 10, 'a') + "\"}";
  expect_error(http(port_, "POST", "/v1/completions", big), 413, "");
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);  // still serving
}

TEST_F(ServerTest, KeepAliveServesSeveralRequestsOnOneConnection) {
  int fd = testing::connect_to(port_);
  std::string body = json({{"prompt", "ab"}, {"max_tokens", 2}}).dump();
  testing::send_all(fd, testing::request_text("POST", "/v1/completions", body, "", false) +
                            testing::request_text("GET", "/version", "", "", true));
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  EXPECT_NE(raw.find("\"text\":\"ab\""), std::string::npos) << raw;
  EXPECT_NE(raw.find("0.1.0"), std::string::npos) << raw;
}

// "Expect: 100-continue" (curl's habit for large bodies): the server answers the headers with an
// interim "100 Continue" before the client sends the body, then the response; a body over the
// limit by its Content-Length is refused at once (413) instead.
TEST_F(ServerTest, ExpectContinueGetsAnInterimResponse) {
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  const auto head = [](size_t length) {
    return "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Expect: 100-continue\r\nConnection: close\r\nContent-Length: " +
           std::to_string(length) + "\r\n\r\n";
  };
  const auto read_some = [](int fd) {
    timeval tv{2, 0};  // a server that never answers fails the test instead of hanging it
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, size_t(n)) : std::string();
  };
  int fd = testing::connect_to(port_);
  testing::send_all(fd, head(body.size()));
  EXPECT_EQ(read_some(fd), "HTTP/1.1 100 Continue\r\n\r\n");
  testing::send_all(fd, body);
  std::string raw, piece;
  while (!(piece = read_some(fd)).empty()) raw += piece;
  ::close(fd);
  const testing::HttpResult r = testing::parse_response(raw);
  EXPECT_EQ(r.status, 200) << raw;
  EXPECT_EQ(json::parse(r.body)["object"], "text_completion");

  fd = testing::connect_to(port_);
  testing::send_all(fd, head(size_t{1} << 30));
  const std::string refused = read_some(fd);
  ::close(fd);
  EXPECT_TRUE(refused.starts_with("HTTP/1.1 413")) << refused;
}

TEST_F(ServerTest, HeadIsGetWithoutBodyAndKeepsTheConnectionUsable) {
  auto get = http(port_, "GET", "/v1/models");
  int fd = testing::connect_to(port_);
  testing::send_all(fd, testing::request_text("HEAD", "/v1/models", "", "", false) +
                            testing::request_text("GET", "/version", "", "", true));
  std::string raw;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) raw.append(buf, static_cast<size_t>(n));
  ::close(fd);
  // The HEAD answer: 200 with the GET's Content-Length and no body, then the GET right after.
  ASSERT_TRUE(raw.starts_with("HTTP/1.1 200")) << raw;
  EXPECT_NE(raw.find("Content-Length: " + std::to_string(get.body.size()) + "\r\n"),
            std::string::npos)
      << raw;
  size_t second = raw.find("\r\n\r\n") + 4;
  EXPECT_TRUE(raw.substr(second).starts_with("HTTP/1.1 200")) << raw;
  EXPECT_EQ(raw.find("\"object\":\"list\""), std::string::npos) << raw;
  EXPECT_NE(raw.find("0.1.0"), std::string::npos) << raw;
}

TEST_F(ServerTest, MetricsPageIsValidPrometheus) {
  ASSERT_EQ(post("/v1/completions", {{"prompt", "ab"}, {"max_tokens", 3}}).status, 200);
  auto r = http(port_, "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("text/plain; version=0.0.4"), std::string::npos);
  const std::string& m = r.body;
  EXPECT_NE(m.find("serval:moe_backend_info{model_name=\"fake-model\",backend=\"latency\"} 1"),
            std::string::npos);
  EXPECT_NE(
      m.find(
          "serval:request_success_total{model_name=\"fake-model\",finished_reason=\"length\"} 1"),
      std::string::npos);
  EXPECT_NE(m.find("serval:kv_cache_usage_perc{model_name=\"fake-model\"} 0.25"),
            std::string::npos);
  EXPECT_NE(m.find("serval:time_to_first_token_seconds_count{model_name=\"fake-model\"} 1"),
            std::string::npos);
  EXPECT_NE(m.find("serval:inter_token_latency_seconds_count{model_name=\"fake-model\"} 2"),
            std::string::npos);
  EXPECT_NE(
      m.find("serval:e2e_request_latency_seconds_bucket{model_name=\"fake-model\",le=\"+Inf\"} 1"),
      std::string::npos);
  server::testing::expect_promtool_accepts(m, "serval_metrics.txt");
}

class SlowServerTest : public ServerTest {
 protected:
  void SetUp() override { start(/*delay_ms=*/20, /*queue_cap=*/1, "secret"); }
};

TEST_F(SlowServerTest, ApiKeyRequiredOnV1) {
  expect_error(http(port_, "GET", "/v1/models"), 401, "");
  expect_error(http(port_, "GET", "/v1/models", "", "Authorization: Bearer wrong\r\n"), 401, "");
  EXPECT_EQ(http(port_, "GET", "/v1/models", "", "Authorization: Bearer secret\r\n").status, 200);
  EXPECT_EQ(http(port_, "GET", "/health").status, 200);
}

TEST_F(SlowServerTest, DisconnectMidStreamAbortsAndQueueFullIs503) {
  const std::string auth = "Authorization: Bearer secret\r\n";
  int fd = testing::connect_to(port_);
  std::string body = json({{"prompt", "abc"}, {"max_tokens", 50}, {"stream", true}}).dump();
  testing::send_all(fd, testing::request_text("POST", "/v1/completions", body, auth));
  std::string raw;
  char buf[4096];
  while (raw.find("\"text\"") == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0);
    raw.append(buf, static_cast<size_t>(n));
  }
  // The one queue slot is taken: a second request is refused with 503.
  auto busy = http(port_, "POST", "/v1/completions", json({{"prompt", "a"}}).dump(), auth);
  expect_error(busy, 503, "");
  ::close(fd);
  for (int i = 0; i < 200 && engine_->aborted().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(engine_->aborted().size(), 1u);
}

TEST_F(SlowServerTest, DisconnectWhileWaitingNonStreamingAborts) {
  int fd = testing::connect_to(port_);
  std::string body = json({{"prompt", "abc"}, {"max_tokens", 50}}).dump();
  testing::send_all(fd, testing::request_text("POST", "/v1/completions", body,
                                              "Authorization: Bearer secret\r\n"));
  for (int i = 0; i < 200 && engine_->num_active() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ::close(fd);
  for (int i = 0; i < 200 && engine_->aborted().empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(engine_->aborted().size(), 1u);
}

}  // namespace
}  // namespace serval::server
