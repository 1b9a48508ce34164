// The hermes tool-call format: calls between <tool_call> tags (the last may be unclosed), the
// text before the first call as content, malformed calls leaving the text as it is; and how much
// of a stream's text may go out before a possible call.
#include "server/tool_call_parser.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>

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
  EXPECT_EQ(p.calls[0].arguments, R"({"city": "Paris", "days": 2})");  // as the model wrote it
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

// llama3_json: the reply is one or more JSON calls separated by ';' (after an optional
// <|python_tag|>), "parameters" or "arguments"; anything else is content.
TEST(Llama3JsonToolCalls, CallsMakeTheWholeReply) {
  const ParsedToolCalls one = parse_tool_calls(
      ToolCallParser::kLlama3Json,
      " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"note\": \"a } b\"}}\n");
  EXPECT_EQ(one.content, "");
  ASSERT_EQ(one.calls.size(), 1u);
  EXPECT_EQ(one.calls[0].name, "get_weather");
  EXPECT_EQ(one.calls[0].arguments, R"({"city": "Paris", "note": "a } b"})");

  const ParsedToolCalls two = parse_llama3_json_tool_calls(
      "<|python_tag|>{\"name\": \"f\", \"arguments\": {\"x\": 1}, \"parameters\": {\"y\": 2}}; "
      "{\"name\": \"g\"};");
  ASSERT_EQ(two.calls.size(), 2u);
  EXPECT_EQ(two.calls[0].arguments, R"({"x": 1})");  // the first argument key in the object
  EXPECT_EQ(two.calls[1].name, "g");
  EXPECT_EQ(two.calls[1].arguments, "{}");

  for (const char* text :
       {"The weather is {\"name\": \"f\"}", "{\"name\": \"f\"} and more", "{\"name\": \"f\"",
        "{\"name\": \"f\"} {\"name\": \"g\"}", "{\"city\": \"Paris\"}", "{\"name\": 1}",
        "{\"name\": \"f\", \"parameters\": [1]}", "{not json}", "", "  ", "[{\"name\": \"f\"}]"}) {
    const ParsedToolCalls p = parse_llama3_json_tool_calls(text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
}

TEST(Llama3JsonToolCalls, StreamHoldsBackWhatMayBeACall) {
  const auto prefix = [](std::string_view t) {
    return tool_call_content_prefix(ToolCallParser::kLlama3Json, t);
  };
  EXPECT_EQ(prefix(""), 0u);
  EXPECT_EQ(prefix(" \n"), 0u);
  EXPECT_EQ(prefix(" {\"na"), 0u);
  EXPECT_EQ(prefix("<|python"), 0u);
  EXPECT_EQ(prefix("<|python_tag|>{"), 0u);
  EXPECT_EQ(prefix("Sure"), 4u);
  EXPECT_EQ(prefix("<b>"), 3u);
  EXPECT_EQ(prefix(" It is {\"name\""), 14u);
}

// pythonic: a Python list of calls with keyword arguments of literal values.
TEST(PythonicToolCalls, LiteralsBecomeJsonArguments) {
  const ParsedToolCalls p = parse_tool_calls(
      ToolCallParser::kPythonic,
      "[get_weather(city='Paris', days=2, metric=True, note=None), "
      "search(query=\"caf\\u00e9 \\\"x\\\" \" 'y', tags=['a', \"b\",], box=(1, 2.5), one=(3), "
      "single=(4,), opts={'k': -1.5e3, 2: False}, big=12345678901234567890, sci=1e-2, "
      "octal='\\101', raw='a\\qb'), now()]");
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 3u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments, R"({"city":"Paris","days":2,"metric":true,"note":null})");
  EXPECT_EQ(p.calls[1].name, "search");
  EXPECT_EQ(p.calls[1].arguments,
            "{\"query\":\"café \\\"x\\\" y\",\"tags\":[\"a\",\"b\"],\"box\":[1,2.5],\"one\":3,"
            "\"single\":[4],\"opts\":{\"k\":-1500.0,\"2\":false},\"big\":1.2345678901234567e+19,"
            "\"sci\":0.01,\"octal\":\"A\",\"raw\":\"a\\\\qb\"}");
  EXPECT_EQ(p.calls[2].name, "now");
  EXPECT_EQ(p.calls[2].arguments, "{}");

  const ParsedToolCalls tagged =
      parse_pythonic_tool_calls(" <|python_start|>[f(x=1)]<|python_end|>\n");
  ASSERT_EQ(tagged.calls.size(), 1u);
  EXPECT_EQ(tagged.calls[0].arguments, R"({"x":1})");
}

TEST(PythonicToolCalls, AnythingElseIsContent) {
  for (const char* text :
       {"[f(1)]", "[f(x=1, x=2)]", "[f(x=y)]", "[f(x=1 + 2)]", "[f(x=1)", "[f(x='a)]", "[]",
        "[f(x=1)] and more", "Sure: [f(x=1)]", "[f(x={1, 2})]", "[f(x=0x1F)]", "[a.b(x=1)]",
        "[f(x='\\ud800')]", "[f(x=1e999)]", "[f(x='\xff')]", "f(x=1)", "[f(x='line\nbreak')]", "",
        "[[f(x=1)]]"}) {
    const ParsedToolCalls p = parse_pythonic_tool_calls(text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // Deep nesting is refused, not recursed into without bound.
  const std::string deep = "[f(x=" + std::string(5000, '[') + std::string(5000, ']') + ")]";
  EXPECT_TRUE(parse_pythonic_tool_calls(deep).calls.empty());
  const std::string shallow = "[f(x=" + std::string(60, '[') + std::string(60, ']') + ")]";
  EXPECT_EQ(parse_pythonic_tool_calls(shallow).calls.size(), 1u);
}

TEST(PythonicToolCalls, StreamHoldsBackWhatMayBeACall) {
  const auto prefix = [](std::string_view t) {
    return tool_call_content_prefix(ToolCallParser::kPythonic, t);
  };
  EXPECT_EQ(prefix(" [get_"), 0u);
  EXPECT_EQ(prefix("<|python_st"), 0u);
  EXPECT_EQ(prefix("Hello ["), 7u);
  EXPECT_EQ(tool_call_content_prefix(ToolCallParser::kHermes, "hi <tool"), 3u);
  EXPECT_EQ(tool_call_content_prefix(ToolCallParser::kNone, "[f(x=1)]"), 8u);
}

// mistral: content, then [TOOL_CALLS] and a JSON list of calls, or each call as name[ARGS]{...};
// ids of 9 letters and digits.
TEST(MistralToolCalls, BothFormsAndTheirStreams) {
  const std::pair<const char*, const char*> forms[] = {
      // (text, its content)
      {"Checking.[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
       "{\"name\": \"now\", \"arguments\": {}}]",
       "Checking."},
      {"[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]now[ARGS]{}", ""}};
  for (const auto& [text, content] : forms) {
    const ParsedToolCalls p = parse_tool_calls(ToolCallParser::kMistral, text);
    EXPECT_EQ(p.content, content);
    ASSERT_EQ(p.calls.size(), 2u) << text;
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, R"({"city": "Paris"})");
    EXPECT_EQ(p.calls[1].name, "now");
    EXPECT_EQ(p.calls[1].arguments, "{}");
  }

  for (const char* bad :
       {"[TOOL_CALLS]f[ARGS]{\"a\": ", "[TOOL_CALLS]f[ARGS]{\"a\" 1}", "[TOOL_CALLS]f g[ARGS]{}",
        "[TOOL_CALLS][{\"name\": 1}]", "[TOOL_CALLS]f[ARGS]{} and more", "no calls"}) {
    const ParsedToolCalls p = parse_tool_calls(ToolCallParser::kMistral, bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
    EXPECT_EQ(p.content, bad);
  }

  const std::vector<ToolCall> streamed = streamed_tool_calls(
      ToolCallParser::kMistral, "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{\"x\": [1");
  ASSERT_EQ(streamed.size(), 2u);
  EXPECT_EQ(streamed[1].name, "g");
  EXPECT_EQ(streamed[1].arguments, R"({"x": [1)");
  EXPECT_TRUE(streamed_tool_calls(ToolCallParser::kMistral, "[TOOL_CALLS]get_wea").empty());
  EXPECT_EQ(tool_call_content_prefix(ToolCallParser::kMistral, "Hi [TOOL_"), 3u);

  const std::string id = new_tool_call_id(ToolCallParser::kMistral);
  EXPECT_EQ(id.size(), 9u);
  EXPECT_TRUE(
      std::ranges::all_of(id, [](char c) { return std::isalnum(static_cast<unsigned char>(c)); }));
  EXPECT_NE(id, new_tool_call_id(ToolCallParser::kMistral));
  EXPECT_TRUE(new_tool_call_id(ToolCallParser::kHermes).starts_with("chatcmpl-tool-"));
}

// deepseek_v3 (fenced JSON after "function<｜tool▁sep｜>name") and deepseek_v31 (the object right
// after the separator), with and without the closing <｜tool▁calls▁end｜>, and their streams.
TEST(DeepSeekToolCalls, BothFormsAndTheirStreams) {
  const std::string v3 =
      "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
      "```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function"
      "<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  const std::string v31 =
      "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
      "{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}"
      "<｜tool▁call▁end｜>";
  for (const auto& [parser, text] :
       {std::pair{ToolCallParser::kDeepSeekV3, v3}, std::pair{ToolCallParser::kDeepSeekV31, v31}}) {
    const ParsedToolCalls p = parse_tool_calls(parser, text);
    EXPECT_EQ(p.content, "Let me check.");
    ASSERT_EQ(p.calls.size(), 2u) << text;
    EXPECT_EQ(p.calls[0].name, "get_weather");
    EXPECT_EQ(p.calls[0].arguments, R"({"city": "Paris"})");
    EXPECT_EQ(p.calls[1].name, "now");
    EXPECT_EQ(p.calls[1].arguments, "{}");
    // Every prefix streams calls the finished text extends; the content stops at the marker.
    for (size_t n = 0; n <= text.size(); ++n) {
      const std::vector<ToolCall> s = streamed_tool_calls(parser, text.substr(0, n));
      ASSERT_LE(s.size(), 2u);
      for (size_t i = 0; i < s.size(); ++i) {
        EXPECT_EQ(s[i].name, p.calls[i].name) << n;
        EXPECT_TRUE(p.calls[i].arguments.starts_with(s[i].arguments)) << n;
      }
      EXPECT_LE(tool_call_content_prefix(parser, text.substr(0, n)), 13u);
    }
  }
  EXPECT_EQ(tool_call_content_prefix(ToolCallParser::kDeepSeekV3, "Hi <｜tool"), 3u);
  EXPECT_EQ(
      parse_tool_calls(ToolCallParser::kDeepSeekV31, v31 + "<｜tool▁calls▁end｜>\n").calls.size(),
      2u);
  for (const char* bad :
       {"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": ",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f g\n```json\n{}\n```"
        "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
        "<｜tool▁call▁end｜> and more",
        "no calls"}) {
    const ParsedToolCalls p = parse_tool_calls(ToolCallParser::kDeepSeekV3, bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
    EXPECT_EQ(p.content, bad);
  }
}

// qwen3_coder: XML calls after the content, values typed by the tools' schemas; a stream sends
// "{", each parameter once complete, then "}".
TEST(Qwen3CoderToolCalls, TypedValuesAndTheirStream) {
  const ToolParameterTypes types = {{"get_weather",
                                     {{"city", "string"},
                                      {"days", "integer"},
                                      {"metric", "boolean"},
                                      {"at", "number"},
                                      {"tags", "array"},
                                      {"opts", "object"}}}};
  const std::string text =
      "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n"
      "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nfalse\n</parameter>\n"
      "<parameter=at>\n1.5\n</parameter>\n<parameter=tags>\n['a', \"b\"]\n</parameter>\n"
      "<parameter=opts>\n{\"x\": null}\n</parameter>\n<parameter=extra>\n42\n</parameter>\n"
      "</function>\n</tool_call>\n<tool_call>\n<function=now>\n</function>\n</tool_call>";
  const ParsedToolCalls p = parse_tool_calls(ToolCallParser::kQwen3Coder, text, types);
  EXPECT_EQ(p.content, "Let me look.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(p.calls[0].arguments,
            R"({"city": "San Jose", "days": 3, "metric": false, "at": 1.5, "tags": ["a","b"], )"
            R"("opts": {"x":null}, "extra": "42"})");  // no schema for "extra": text
  EXPECT_EQ(p.calls[1].arguments, "{}");
  // Typed values that do not read as their type stay text; "null" is null.
  EXPECT_EQ(parse_tool_calls(ToolCallParser::kQwen3Coder,
                             "<function=get_weather><parameter=days>three</parameter>"
                             "<parameter=city>null</parameter></function>",
                             types)
                .calls.at(0)
                .arguments,
            R"({"days": "three", "city": null})");

  const auto streamed = [&](size_t len) {
    const std::vector<ToolCall> c = streamed_tool_calls(
        ToolCallParser::kQwen3Coder, std::string_view(text).substr(0, len), types);
    return c.empty() ? std::string("-") : c[0].name + "|" + c[0].arguments;
  };
  EXPECT_EQ(streamed(text.find("get_weather")), "-");
  EXPECT_EQ(streamed(text.find("<parameter=city>")), "get_weather|{");
  EXPECT_EQ(streamed(text.find("<parameter=days>")), R"(get_weather|{"city": "San Jose")");
  EXPECT_EQ(tool_call_content_prefix(ToolCallParser::kQwen3Coder, "Hi <tool_c"), 3u);
  EXPECT_EQ(tool_call_content_prefix(ToolCallParser::kQwen3Coder, "Hi <functio"), 3u);
  EXPECT_TRUE(parse_tool_calls(ToolCallParser::kQwen3Coder, "<function=bad name></function>")
                  .calls.empty());
}

// A stream's calls as far as its text shows them: a call appears once its name is complete, its
// arguments grow as the model writes them (a string's value only when the string is complete).
TEST(StreamedToolCalls, NamesFirstThenArgumentsAsTheyGrow) {
  const auto streamed = [](ToolCallParser p, std::string_view t) {
    std::vector<std::string> out;
    for (const ToolCall& c : streamed_tool_calls(p, t)) out.push_back(c.name + "|" + c.arguments);
    return out;
  };
  using V = std::vector<std::string>;
  constexpr ToolCallParser kHermes = ToolCallParser::kHermes;
  EXPECT_EQ(streamed(kHermes, "Sure.<tool_call>\n{\"name\": \"get_w"), V{});
  EXPECT_EQ(streamed(kHermes, "<tool_call>{\"name\": \"get_weather\""), V{"get_weather|"});
  EXPECT_EQ(streamed(kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Pa"),
            V{"f|{\"city\": \"Pa"});
  EXPECT_EQ(streamed(kHermes,
                     "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n"
                     "<tool_call>{\"name\": \"g\"}"),
            (V{"f|{}", "g|{}"}));
  EXPECT_EQ(streamed(kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a"),
            V{"f|"});  // string arguments: only once complete
  EXPECT_EQ(streamed(kHermes, "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\", "),
            V{"f|{\"a\": 1}"});
  EXPECT_EQ(streamed(kHermes, "<tool_call>{\"name\": 3"), V{});  // not a call
  EXPECT_EQ(streamed(ToolCallParser::kLlama3Json,
                     "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\""),
            V{"f|{\"x\": 1}"});
  EXPECT_EQ(streamed(ToolCallParser::kLlama3Json, "It is {\"name\": \"f\"}"), V{});
  EXPECT_EQ(streamed(ToolCallParser::kPythonic, "[f(x=1), g(y='a"), V{"f|{\"x\":1}"});  // whole
  EXPECT_EQ(streamed(ToolCallParser::kPythonic, "Say [f(x=1)]"), V{});
  const std::vector<ToolCall> list =
      streamed_tool_call_list(R"([{"name": "f", "parameters": {"a": 1}}, {"name": "g", "par)");
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].arguments, R"({"a": 1})");
  EXPECT_EQ(list[1].name, "g");
  EXPECT_EQ(list[1].arguments, "");
}

// tool_choice "required" outputs: a JSON list of {"name", "parameters"}; anything else (a list
// cut short, another shape) gives no calls.
TEST(ToolCallList, ParsesGuidedLists) {
  const std::vector<ToolCall> calls = parse_tool_call_list(
      R"([{"name": "f", "parameters": {"a": [1, "x"]}}, {"name": "g", "parameters": {}}])");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "f");
  EXPECT_EQ(calls[0].arguments, R"({"a": [1, "x"]})");
  EXPECT_EQ(calls[1].arguments, "{}");
  for (const char* bad : {"", "[]", R"([{"name": "f", "parameters": {})", R"({"name": "f"})",
                          R"([{"name": 1, "parameters": {}}])", R"([{"name": "f"}])"})
    EXPECT_TRUE(parse_tool_call_list(bad).empty()) << bad;
}

}  // namespace
}  // namespace serval::server
