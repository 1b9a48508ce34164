// The hermes tool-call format: calls between <tool_call> tags (the last may be unclosed), the
// text before the first call as content, malformed calls leaving the text as it is; and how much
// of a stream's text may go out before a possible call.
#include "server/tool_call_parser.h"

#include <gtest/gtest.h>

namespace serval::server {
namespace {

TEST(HermesToolCalls, CallsAndContent) {
  const ParsedToolCalls p = parse_hermes_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": "
      "\"{}\"}</tool_call>trailing");
  EXPECT_EQ(p.content, "Let me check.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(p.calls[1].name, "now");
  EXPECT_EQ(p.calls[1].arguments, "{}");  // a string argument is passed on as it is
}

TEST(HermesToolCalls, UnclosedLastCallAndNoCall) {
  const ParsedToolCalls cut = parse_hermes_tool_calls("<tool_call>{\"name\": \"f\"}");
  EXPECT_EQ(cut.content, "");
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, "{}");
  EXPECT_TRUE(parse_hermes_tool_calls("plain text").calls.empty());
  EXPECT_EQ(parse_hermes_tool_calls("plain text").content, "plain text");
}

TEST(HermesToolCalls, MalformedCallsLeaveTheText) {
  for (const char* text :
       {"a<tool_call>{\"name\": 3}</tool_call>", "a<tool_call>not json</tool_call>",
        "a<tool_call>{\"arguments\": {}}</tool_call>",
        "a<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
        "a<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{</tool_call>",
        "a<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": "}) {
    const ParsedToolCalls p = parse_hermes_tool_calls(text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

TEST(HermesToolCalls, StreamContentStopsBeforeAPossibleCall) {
  EXPECT_EQ(hermes_content_prefix("hello"), 5u);
  EXPECT_EQ(hermes_content_prefix("hello <tool"), 6u);  // "<tool" may begin a call
  EXPECT_EQ(hermes_content_prefix("hello <tool_call>{"), 6u);
  EXPECT_EQ(hermes_content_prefix("a < b"), 5u);  // "<" followed by " " cannot
  EXPECT_EQ(hermes_content_prefix("x<"), 1u);
  EXPECT_EQ(hermes_content_prefix(""), 0u);
}

// tool_choice "required" outputs: a JSON list of {"name", "parameters"}; anything else (a list
// cut short, another shape) gives no calls.
TEST(ToolCallList, ParsesGuidedLists) {
  const std::vector<ToolCall> calls = parse_tool_call_list(
      R"([{"name": "f", "parameters": {"a": [1, "x"]}}, {"name": "g", "parameters": {}}])");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "f");
  EXPECT_EQ(calls[0].arguments, R"({"a":[1,"x"]})");
  EXPECT_EQ(calls[1].arguments, "{}");
  for (const char* bad : {"", "[]", R"([{"name": "f", "parameters": {})", R"({"name": "f"})",
                          R"([{"name": 1, "parameters": {}}])", R"([{"name": "f"}])"})
    EXPECT_TRUE(parse_tool_call_list(bad).empty()) << bad;
}

}  // namespace
}  // namespace serval::server
