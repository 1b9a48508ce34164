// Fuzzing of the hermes tool-call parser on model output it cannot trust: texts stitched from
// pieces of real calls (tags, cut tags, JSON fragments, names and arguments of every type) and
// random bytes, invalid UTF-8 included. Whatever the text, parsing must not throw, and
//   - without calls the content is the whole text; with calls it is the text before the first
//     <tool_call>, and every call's name and arguments serialize as JSON (they reach the client);
//   - the streamed content prefix never contains a <tool_call>, never shrinks as the text grows
//     (what went out cannot be taken back), and stops exactly at the first <tool_call>.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/tool_call_parser.h"
#include "support/fuzz_budget.h"

namespace serval::server {
namespace {

const std::vector<std::string> kPieces = {"<tool_call>",
                                          "</tool_call>",
                                          "<tool_",
                                          "<tool_call",
                                          "</tool",
                                          "<",
                                          ">",
                                          "\n",
                                          " ",
                                          "{",
                                          "}",
                                          "[",
                                          "]",
                                          ":",
                                          ",",
                                          "\"",
                                          "\"name\"",
                                          "\"arguments\"",
                                          "\"get_weather\"",
                                          "{\"city\": \"Paris\"}",
                                          "\"{}\"",
                                          "1",
                                          "null",
                                          "true",
                                          "[1, 2]",
                                          "\\u00e9",
                                          "\\",
                                          "text",
                                          "é",
                                          "\xff",
                                          "\xc3",
                                          "\x80",
                                          std::string(1, '\0')};

// A call that parses, so that the fuzzer also sees texts with several good calls around bad ones.
std::string good_call(std::mt19937& rng) {
  const char* args[] = {"{\"x\": 1}", "\"{\\\"y\\\": 2}\"", "{}", "{\"nested\": {\"a\": [1]}}"};
  std::string call = "<tool_call>\n{\"name\": \"f" + std::to_string(rng() % 10) + "\"";
  if (rng() % 4 != 0) call += ", \"arguments\": " + std::string(args[rng() % 4]);
  call += "}";
  if (rng() % 5 != 0) call += "\n</tool_call>";
  return call;
}

std::string random_text(std::mt19937& rng) {
  std::string text;
  const int parts = int(rng() % 24);
  for (int i = 0; i < parts; ++i) {
    switch (rng() % 8) {
      case 0:
        text += good_call(rng);
        break;
      case 1:
        text += char(rng() % 256);
        break;
      default:
        text += kPieces[rng() % kPieces.size()];
    }
  }
  return text;
}

TEST(HermesToolCallsFuzz, ParseAndStreamPrefixKeepTheirContracts) {
  std::mt19937 rng(serval::testing::fuzz_seed(20261206));
  const int iterations = serval::testing::fuzz_iterations(20000);
  int with_calls = 0;
  for (int it = 0; it < iterations; ++it) {
    const std::string text = random_text(rng);
    SCOPED_TRACE(::testing::Message() << "iteration " << it << ", text '" << text << "'");
    ParsedToolCalls parsed;
    ASSERT_NO_THROW(parsed = parse_hermes_tool_calls(text));
    const size_t open = text.find(kToolCallOpen);
    if (parsed.calls.empty()) {
      EXPECT_EQ(parsed.content, text);
    } else {
      ++with_calls;
      ASSERT_NE(open, std::string::npos);
      EXPECT_EQ(parsed.content, text.substr(0, open));
      for (const ToolCall& call : parsed.calls) {
        EXPECT_NO_THROW((void)nlohmann::json(call.name).dump());
        EXPECT_NO_THROW((void)nlohmann::json(call.arguments).dump());
      }
    }
    size_t last = 0;
    for (size_t len = 0; len <= text.size(); ++len) {
      const std::string_view grown(text.data(), len);
      const size_t prefix = hermes_content_prefix(grown);
      ASSERT_LE(prefix, len);
      ASSERT_GE(prefix, last) << "the content prefix shrank at length " << len;
      ASSERT_EQ(grown.substr(0, prefix).find(kToolCallOpen), std::string_view::npos);
      if (const size_t at = grown.find(kToolCallOpen); at != std::string_view::npos) {
        ASSERT_EQ(prefix, at);
      }
      last = prefix;
    }
  }
  // The generator must reach the interesting case often, or the test checks little.
  EXPECT_GT(with_calls, iterations / 10);
}

}  // namespace
}  // namespace serval::server
