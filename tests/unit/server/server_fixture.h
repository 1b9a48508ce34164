// The server tests' fixture: a Server on a loopback port in front of FakeEngine, with helpers
// to post requests, check OpenAI error bodies and read streamed chat outputs.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "server/server.h"
#include "server_test_support.h"

namespace serval::server::testing {

using nlohmann::json;

class ServerTest : public ::testing::Test {
 protected:
  void start(int delay_ms = 0, int queue_cap = 64, std::string api_key = "",
             ToolCallParser tool_call_parser = ToolCallParser::kNone, int max_model_len = 64,
             ReasoningParser reasoning_parser = ReasoningParser::kNone,
             bool prompt_tokens_details = false,
             const std::function<void(ServerOptions&)>& more = nullptr) {
    engine_ = std::make_unique<FakeEngine>(delay_ms, queue_cap, max_model_len);
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.api_key = std::move(api_key);
    o.max_logprobs = 5;
    o.tool_call_parser = tool_call_parser;
    o.reasoning_parser = reasoning_parser;
    o.prompt_tokens_details = prompt_tokens_details;
    if (more) more(o);
    server_ = std::make_unique<Server>(*engine_, o);
    port_ = server_->start();
  }
  void SetUp() override { start(); }
  void TearDown() override {
    server_->shutdown(1.0);
    engine_->shutdown();
  }
  testing::HttpResult post(const std::string& path, const json& body) {
    return http(port_, "POST", path, body.dump());
  }
  // Asserts an OpenAI error with `status` naming `param` (if non-empty).
  static void expect_error(const testing::HttpResult& r, int status, const std::string& param) {
    EXPECT_EQ(r.status, status) << r.body;
    json j = json::parse(r.body);
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"]["type"].is_string());
    EXPECT_EQ(j["error"]["code"], status);
    if (!param.empty()) {
      EXPECT_EQ(j["error"]["param"], param) << r.body;
    }
  }

  std::unique_ptr<FakeEngine> engine_;
  std::unique_ptr<Server> server_;
  int port_ = 0;
};

// The chat output streamed: concatenated reasoning, content and tool calls of its deltas. Tool
// calls are merged as the openai client merges them: a call's first entry (a new index, in order)
// has its id, type and name, later ones only more arguments.
struct StreamedChat {
  std::string reasoning, reasoning_content, content;
  json tool_calls = json::array();
  int tool_call_entries = 0;
  std::string finish_reason;
};
inline void merge_tool_call_entry(const json& entry, json& calls) {
  const size_t index = entry.at("index").get<size_t>();
  if (index == calls.size()) {
    EXPECT_TRUE(entry.contains("id") && entry.contains("type")) << entry.dump();
    calls.push_back(entry);
    return;
  }
  ASSERT_LT(index, calls.size()) << entry.dump();
  EXPECT_FALSE(entry.contains("id") || entry["function"].contains("name")) << entry.dump();
  calls[index]["function"]["arguments"] = calls[index]["function"]["arguments"].get<std::string>() +
                                          entry["function"]["arguments"].get<std::string>();
}
inline StreamedChat collect_chat_stream(const std::string& body) {
  StreamedChat out;
  for (const std::string& ev : sse_events(body)) {
    if (ev == "[DONE]") break;
    const json c = json::parse(ev)["choices"][0];
    const json& d = c["delta"];
    if (d.contains("reasoning")) out.reasoning += d["reasoning"].get<std::string>();
    if (d.contains("reasoning_content"))
      out.reasoning_content += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) out.content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const json& t : d["tool_calls"]) merge_tool_call_entry(t, out.tool_calls);
      out.tool_call_entries += static_cast<int>(d["tool_calls"].size());
    }
    if (c["finish_reason"].is_string()) out.finish_reason = c["finish_reason"];
  }
  return out;
}

}  // namespace serval::server::testing
