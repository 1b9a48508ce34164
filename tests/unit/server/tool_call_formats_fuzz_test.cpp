// The tool-call parsers against an oracle and on untrusted text.
//   - Round trip: random argument values (nested lists and objects, strings with quotes,
//     escapes and non-ASCII, ints, floats, booleans, null) written as the model would write them
//     (Python literals in random styles: either quote, escapes, tuples, trailing commas, adjacent
//     strings, spaces and newlines; or JSON with random separators) must parse back to the same
//     values, in order.
//   - Fuzzing: texts stitched from pieces of calls and random bytes must never throw; without
//     calls the content is the whole text, with calls it is empty and every argument text is a
//     JSON object; the streamed content prefix never shrinks and is always a prefix of what the
//     finished text's content turns out to be; the calls streamed over the text's prefixes
//     never contradict what was sent before (a call's name fixed, its arguments only extended)
//     and, when the finished text is calls, the finished calls extend them.
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "server/tool_call_parser.h"
#include "support/fuzz_budget.h"

namespace serval::server {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Characters a string value is made of: ASCII with the quoting and escaping troublemakers, and
// two- to four-byte UTF-8.
const std::vector<std::string> kChars = {"a", "Z", "0", " ", "'", "\"", "\\", "\n", "\t", "é",
                                         "€", "😀", "(", ")", "[", "]",  ",",  "=",  "{",  ":"};

OrderedJson random_value(std::mt19937& rng, int depth) {
  switch (rng() % (depth < 3 ? 8 : 5)) {
    case 0: {
      std::string s;
      for (int i = int(rng() % 6); i > 0; --i) s += kChars[rng() % kChars.size()];
      return s;
    }
    case 1:
      return int64_t(rng() % 2000001) - 1000000;
    case 2:
      return double(int64_t(rng() % 200001) - 100000) / 64.0;  // exact in binary
    case 3:
      return rng() % 2 == 0;
    case 4:
      return nullptr;
    case 5:
    case 6: {
      OrderedJson a = OrderedJson::array();
      for (int i = int(rng() % 4); i > 0; --i) a.push_back(random_value(rng, depth + 1));
      return a;
    }
    default: {
      OrderedJson o = OrderedJson::object();
      for (int i = int(rng() % 4); i > 0; --i)
        o[std::string(1, 'k') += std::to_string(rng() % 6)] = random_value(rng, depth + 1);
      return o;
    }
  }
}

std::string space(std::mt19937& rng) {
  static const char* kSpaces[] = {"", "", " ", "\n  ", "\t"};
  return kSpaces[rng() % 5];
}

// A Python string literal of s in a random style.
std::string python_string(const std::string& s, std::mt19937& rng) {
  const char quote = rng() % 2 ? '\'' : '"';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += rng() % 2 ? "\\t" : "\\x09";
    } else if (c == 'a' && rng() % 3 == 0) {
      out += "\\u0061";
    } else {
      out += c;
    }
  }
  out += quote;
  if (rng() % 6 == 0) {  // an adjacent empty literal: "a" "" is "a"
    out += space(rng);
    out += quote;
    out += quote;
  }
  return out;
}

std::string python_literal(const OrderedJson& v, std::mt19937& rng) {
  if (v.is_string()) return python_string(v.get<std::string>(), rng);
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_number_integer()) return std::to_string(v.get<int64_t>());
  if (v.is_number_float()) {
    char buf[40];
    std::snprintf(buf, sizeof buf, rng() % 2 ? "%.17g" : "%.17e", v.get<double>());
    return buf;
  }
  const bool object = v.is_object();
  const bool tuple = !object && !v.empty() && rng() % 3 == 0;
  std::string out = object ? "{" : tuple ? "(" : "[";
  size_t i = 0;
  for (auto it = v.begin(); it != v.end(); ++it, ++i) {
    if (i > 0) {
      out += ',';
      out += space(rng);
    }
    if (object) {
      out += python_string(it.key(), rng);
      out += ':';
      out += space(rng);
    }
    out += python_literal(*it, rng);
  }
  if (tuple && v.size() == 1) {
    out += ",";  // (x,) is a tuple, (x) is x
  } else if (!v.empty() && rng() % 4 == 0) {
    out += ",";
  }
  out += object ? "}" : tuple ? ")" : "]";
  return out;
}

struct Call {
  std::string name;
  OrderedJson args;
};

std::vector<Call> random_calls(std::mt19937& rng) {
  std::vector<Call> calls(1 + rng() % 3);
  for (Call& c : calls) {
    c.name = "fn_";
    c.name += std::to_string(rng() % 10);
    c.args = OrderedJson::object();
    for (int i = int(rng() % 4); i > 0; --i)
      c.args[std::string(1, 'a') += std::to_string(rng() % 5)] = random_value(rng, 0);
  }
  return calls;
}

void expect_calls(const ParsedToolCalls& parsed, const std::vector<Call>& calls,
                  const std::string& text) {
  ASSERT_EQ(parsed.calls.size(), calls.size()) << text;
  EXPECT_EQ(parsed.content, "");
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(parsed.calls[i].name, calls[i].name);
    EXPECT_EQ(OrderedJson::parse(parsed.calls[i].arguments), calls[i].args) << text;
  }
}

// The calls as a pythonic reply.
std::string pythonic_text(const std::vector<Call>& calls, std::mt19937& rng) {
  std::string text = space(rng);
  text += '[';
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i > 0) {
      text += ',';
      text += space(rng);
    }
    text += calls[i].name;
    text += '(';
    text += space(rng);
    size_t j = 0;
    for (auto a = calls[i].args.begin(); a != calls[i].args.end(); ++a, ++j) {
      if (j > 0) text += ", ";
      text += a.key();
      text += '=';
      text += python_literal(*a, rng);
    }
    text += space(rng);
    text += ')';
  }
  text += ']';
  text += space(rng);
  return text;
}

// The calls as a llama3_json reply.
std::string llama3_json_text(const std::vector<Call>& calls, std::mt19937& rng) {
  std::string text = space(rng);
  if (rng() % 3 == 0) text += "<|python_tag|>";
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i > 0) {
      text += space(rng);
      text += ';';
      text += space(rng);
    }
    const OrderedJson call = {{"name", calls[i].name},
                              {rng() % 2 ? "parameters" : "arguments", calls[i].args}};
    text += call.dump(rng() % 2 ? -1 : 2);
  }
  if (rng() % 4 == 0) text += ';';
  text += space(rng);
  return text;
}

// The calls as a hermes reply: some content, then tagged calls (the last one may be unclosed).
std::string hermes_text(const std::vector<Call>& calls, std::mt19937& rng) {
  std::string text = rng() % 2 ? "Let me check." : "";
  for (size_t i = 0; i < calls.size(); ++i) {
    text += space(rng);
    text += "<tool_call>";
    text += space(rng);
    text += OrderedJson({{"name", calls[i].name}, {"arguments", calls[i].args}})
                .dump(rng() % 2 ? -1 : 2);
    text += space(rng);
    if (i + 1 < calls.size() || rng() % 4 != 0) text += "</tool_call>";
  }
  return text;
}

// What a stream sends of the calls, checked over every prefix of `text`: a call begun keeps its
// name and its arguments only grow (as the server's `sent` state would see them); when the
// finished text is calls, they extend what was sent.
void expect_streamed_calls_contract(ToolCallParser parser, const std::string& text,
                                    const std::vector<ToolCall>& finished,
                                    const ToolParameterTypes& types = {}) {
  std::vector<ToolCall> sent;
  for (size_t len = 0; len <= text.size(); ++len) {
    const std::vector<ToolCall> now =
        streamed_tool_calls(parser, std::string_view(text).substr(0, len), types);
    for (size_t i = 0; i < now.size(); ++i) {
      if (i == sent.size()) {
        sent.push_back(now[i]);
        continue;
      }
      ASSERT_EQ(now[i].name, sent[i].name) << "at length " << len;
      ASSERT_TRUE(now[i].arguments.starts_with(sent[i].arguments))
          << "at length " << len << ": '" << now[i].arguments << "' after '" << sent[i].arguments
          << "'";
      sent[i].arguments = now[i].arguments;
    }
  }
  if (finished.empty()) return;
  ASSERT_LE(sent.size(), finished.size());
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(finished[i].name, sent[i].name);
    EXPECT_TRUE(finished[i].arguments.starts_with(sent[i].arguments)) << finished[i].arguments;
  }
  EXPECT_EQ(sent.size(), finished.size());
}

// The calls as a mistral reply: some content, [TOOL_CALLS], then a JSON list of the calls or each
// one as name[ARGS]{...} after its own [TOOL_CALLS].
std::string mistral_text(const std::vector<Call>& calls, std::mt19937& rng) {
  std::string text = rng() % 2 ? "Let me check." : "";
  const bool list = rng() % 2 == 0;
  if (list) {
    text += "[TOOL_CALLS]";
    text += space(rng);
    OrderedJson all = OrderedJson::array();
    for (const Call& c : calls) all.push_back({{"name", c.name}, {"arguments", c.args}});
    return text + all.dump(rng() % 2 ? -1 : 2);
  }
  for (const Call& c : calls) {
    text += "[TOOL_CALLS]";
    text += c.name;
    text += "[ARGS]";
    text += c.args.dump(rng() % 2 ? -1 : 2);
  }
  return text;
}

// The calls as a DeepSeek reply: some content, <｜tool▁calls▁begin｜>, each call (v31: name, the
// separator and the object; v3: "function", the separator, the name and a fenced object), and
// (or not) the closing marker.
std::string deepseek_text(const std::vector<Call>& calls, bool v31, std::mt19937& rng) {
  std::string text = rng() % 2 ? "Let me check." : "";
  text += "<｜tool▁calls▁begin｜>";
  for (const Call& c : calls) {
    text += "<｜tool▁call▁begin｜>";
    const std::string args = c.args.dump(rng() % 2 ? -1 : 2);
    text += v31 ? c.name + "<｜tool▁sep｜>" + args
                : "function<｜tool▁sep｜>" + c.name + "\n```json\n" + args + "\n```";
    text += "<｜tool▁call▁end｜>";
    text += space(rng);
  }
  return text + (rng() % 2 ? "<｜tool▁calls▁end｜>" : "");
}

// The calls as a qwen3_coder reply, with the tools' parameter types that read the values back: a
// string as text, every other value as its JSON (typed integer, number, boolean, or object).
// Each call gets a name of its own, so that its types are its own.
std::string qwen3_coder_text(std::vector<Call>& calls, ToolParameterTypes& types,
                             std::mt19937& rng) {
  std::string text = rng() % 2 ? "Let me check.\n" : "";
  for (size_t i = 0; i < calls.size(); ++i) {
    Call& c = calls[i];
    c.name += "_" + std::to_string(i);
    text += rng() % 2 ? "<tool_call>\n" : "";
    text += "<function=" + c.name + ">\n";
    for (auto a = c.args.begin(); a != c.args.end(); ++a) {
      const OrderedJson& v = *a;
      types[c.name][a.key()] = v.is_string()           ? "string"
                               : v.is_number_integer() ? "integer"
                               : v.is_number_float()   ? "number"
                               : v.is_boolean()        ? "boolean"
                                                       : "object";
      text += "<parameter=" + a.key() + ">\n";
      text += v.is_string() ? v.get<std::string>() : v.dump();
      text += "\n</parameter>\n";
    }
    text += "</function>";
    text += rng() % 2 ? "\n</tool_call>\n" : "\n";
  }
  return text;
}

// The calls as a reply in `parser`'s format (qwen3_coder: renamed, with `types` to read them).
std::string reply_text(ToolCallParser parser, std::vector<Call>& calls, std::mt19937& rng,
                       ToolParameterTypes& types) {
  if (parser == ToolCallParser::kQwen3Coder) return qwen3_coder_text(calls, types, rng);
  if (parser == ToolCallParser::kPythonic) return pythonic_text(calls, rng);
  if (parser == ToolCallParser::kHermes) return hermes_text(calls, rng);
  if (parser == ToolCallParser::kMistral) return mistral_text(calls, rng);
  if (parser == ToolCallParser::kDeepSeekV3 || parser == ToolCallParser::kDeepSeekV31)
    return deepseek_text(calls, parser == ToolCallParser::kDeepSeekV31, rng);
  return llama3_json_text(calls, rng);
}

// Random calls written as `parser`'s replies parse back to themselves (hermes: after the content
// before them) and stream by the contract.
void expect_round_trips(ToolCallParser parser, uint32_t seed, int iterations) {
  std::mt19937 rng(serval::testing::fuzz_seed(seed));
  for (int it = 0; it < serval::testing::fuzz_iterations(iterations); ++it) {
    std::vector<Call> calls = random_calls(rng);
    ToolParameterTypes types;
    const std::string text = reply_text(parser, calls, rng, types);
    SCOPED_TRACE(::testing::Message() << "iteration " << it << ": " << text);
    ParsedToolCalls parsed = parse_tool_calls(parser, text, types);
    if (parser != ToolCallParser::kPythonic && parser != ToolCallParser::kLlama3Json) {
      EXPECT_TRUE(text.starts_with(parsed.content));
      parsed.content.clear();
    }
    expect_calls(parsed, calls, text);
    expect_streamed_calls_contract(parser, text, parsed.calls, types);
  }
}

TEST(PythonicToolCallsFuzz, RandomLiteralsRoundTrip) {
  expect_round_trips(ToolCallParser::kPythonic, 20261207, 3000);
}

TEST(Llama3JsonToolCallsFuzz, RandomCallsRoundTrip) {
  expect_round_trips(ToolCallParser::kLlama3Json, 20261208, 3000);
}

TEST(HermesToolCallsFuzz, RandomCallsRoundTripAndStream) {
  expect_round_trips(ToolCallParser::kHermes, 20261210, 2000);
}

TEST(MistralToolCallsFuzz, RandomCallsRoundTripAndStream) {
  expect_round_trips(ToolCallParser::kMistral, 20261211, 2000);
}

TEST(DeepSeekToolCallsFuzz, RandomCallsRoundTripAndStream) {
  expect_round_trips(ToolCallParser::kDeepSeekV3, 20261212, 1000);
  expect_round_trips(ToolCallParser::kDeepSeekV31, 20261213, 1000);
}

TEST(Qwen3CoderToolCallsFuzz, RandomCallsRoundTripAndStream) {
  expect_round_trips(ToolCallParser::kQwen3Coder, 20261212, 2000);
}

const std::vector<std::string> kPieces = {"[",
                                          "]",
                                          "(",
                                          ")",
                                          "{",
                                          "}",
                                          ",",
                                          ";",
                                          "=",
                                          ":",
                                          "'",
                                          "\"",
                                          "\\",
                                          " ",
                                          "\n",
                                          "f",
                                          "g_1",
                                          "x=",
                                          "True",
                                          "None",
                                          "1",
                                          "-2.5e3",
                                          "1e999",
                                          "'a'",
                                          "\"b\"",
                                          "\\u00e9",
                                          "\\x",
                                          "\\ud800",
                                          "\"name\"",
                                          "\"parameters\"",
                                          "\"arguments\"",
                                          "<|python_tag|>",
                                          "<|python_start|>",
                                          "<|python_end|>",
                                          "<tool_call>",
                                          "</tool_call>",
                                          "[TOOL_CALLS]",
                                          "<function=f>",
                                          "<function=",
                                          "<parameter=x>",
                                          "</parameter>",
                                          "</function>",
                                          "[ARGS]",
                                          "[TOOL_",
                                          "<｜tool▁calls▁begin｜>",
                                          "<｜tool▁call▁begin｜>",
                                          "<｜tool▁sep｜>",
                                          "<｜tool▁call▁end｜>",
                                          "<｜tool▁calls▁end｜>",
                                          "function",
                                          "\n```json\n",
                                          "\n```",
                                          "<｜tool",
                                          "{\"name\": \"g\", \"arguments\": {\"b\": [",
                                          "<|python",
                                          "é",
                                          "\xff",
                                          "\xc3",
                                          std::string(1, '\0'),
                                          "[f(x=1)]",
                                          "{\"name\": \"f\", \"parameters\": {\"a\": 1}}"};

// Stitched pieces, or (half the time) a real reply in the parser's format, cut short, with a
// byte changed or with pieces after it.
std::string random_text(ToolCallParser parser, std::mt19937& rng) {
  std::string text;
  if (rng() % 2 == 0) {
    std::vector<Call> calls = random_calls(rng);
    ToolParameterTypes types;
    text = reply_text(parser, calls, rng, types);
    switch (rng() % 4) {
      case 0:
        text.resize(rng() % (text.size() + 1));
        break;
      case 1:
        text[rng() % text.size()] = char(rng() % 256);
        break;
      case 2:
        text += kPieces[rng() % kPieces.size()];
        break;
      default:
        return text;
    }
  }
  for (int i = int(rng() % 20); i > 0; --i) {
    if (rng() % 10 == 0)
      text += char(rng() % 256);
    else
      text += kPieces[rng() % kPieces.size()];
  }
  return text;
}

TEST(ToolCallFormatsFuzz, ParseAndStreamPrefixKeepTheirContracts) {
  std::mt19937 rng(serval::testing::fuzz_seed(20261209));
  const int iterations = serval::testing::fuzz_iterations(10000);  // per format
  int with_calls = 0;
  for (const ToolCallParser parser :
       {ToolCallParser::kLlama3Json, ToolCallParser::kPythonic, ToolCallParser::kHermes,
        ToolCallParser::kMistral, ToolCallParser::kQwen3Coder, ToolCallParser::kDeepSeekV3,
        ToolCallParser::kDeepSeekV31}) {
    for (int it = 0; it < iterations; ++it) {
      const std::string text = random_text(parser, rng);
      SCOPED_TRACE(::testing::Message() << "iteration " << it << ", text '" << text << "'");
      ParsedToolCalls parsed;
      ASSERT_NO_THROW(parsed = parse_tool_calls(parser, text));
      std::string final_content = text;
      if (!parsed.calls.empty()) {
        ++with_calls;
        if (parser != ToolCallParser::kPythonic && parser != ToolCallParser::kLlama3Json) {
          EXPECT_TRUE(text.starts_with(parsed.content));
        } else {
          EXPECT_EQ(parsed.content, "");
        }
        final_content = parsed.content;
        for (const ToolCall& call : parsed.calls) {
          EXPECT_NO_THROW((void)nlohmann::json(call.name).dump());
          if (parser == ToolCallParser::kPythonic) {
            EXPECT_TRUE(nlohmann::json::parse(call.arguments).is_object()) << call.arguments;
          }
        }
      } else {
        EXPECT_EQ(parsed.content, text);
      }
      size_t last = 0;
      for (size_t len = 0; len <= text.size(); ++len) {
        const size_t prefix = tool_call_content_prefix(parser, std::string_view(text.data(), len));
        ASSERT_GE(prefix, last) << "the content prefix shrank at length " << len;
        ASSERT_LE(prefix, final_content.size()) << "sent more than the content, at " << len;
        ASSERT_EQ(text.compare(0, prefix, final_content, 0, prefix), 0);
        last = prefix;
      }
      expect_streamed_calls_contract(parser, text, parsed.calls);
    }
  }
  EXPECT_GT(with_calls, iterations / 5);  // the generator reaches real calls
}

}  // namespace
}  // namespace serval::server
