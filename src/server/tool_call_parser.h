// Tool calls in generated text, for `serve --enable-auto-tool-choice --tool-call-parser P`:
//   hermes       Hermes, Qwen: one JSON object {"name": ..., "arguments": {...}} between
//                <tool_call> and </tool_call> per call (the last may be cut off unclosed by
//                max_tokens); the text before the first call is content.
//   llama3_json  Llama 3.1 – 3.3: the reply is the calls, JSON objects {"name": ...,
//                "parameters": {...}} ("arguments" also taken) separated by ';', after an
//                optional <|python_tag|>; no content beside them.
//   pythonic     Llama 3.2 / 4 and others: the reply is a Python list of calls with keyword
//                arguments of literal values, [f(a=1, b="x"), g()], optionally between
//                <|python_start|> and <|python_end|>; no content beside them.
//   mistral      Mistral: after any content, [TOOL_CALLS] then a JSON list of
//                {"name": ..., "arguments": {...}} or, from the v11 tokenizers on, each call as
//                name[ARGS]{...} after its own [TOOL_CALLS]; call ids of 9 letters and digits,
//                which Mistral's chat templates require of earlier calls.
//   qwen3_coder  Qwen3-Coder: after any content, <tool_call><function=f><parameter=p>value
//                </parameter>…</function></tool_call> per call, values typed by the tools'
//                JSON Schemas (xml_tool_calls.cpp).
//   deepseek_v3  DeepSeek-V3 / R1: after any content, <｜tool▁calls▁begin｜> then per call
//                <｜tool▁call▁begin｜>function<｜tool▁sep｜>name, a ```json fenced object and
//                <｜tool▁call▁end｜>; deepseek_v31 (V3.1): name<｜tool▁sep｜>{...} unfenced
//                (deepseek_tool_calls.cpp).
// Text that does not parse as the format's calls is content, as it came. A call's arguments are
// the model's JSON text of them (hermes, llama3_json; see json_tool_calls.h), or, for pythonic,
// the JSON of its keyword arguments.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace serval::server {

enum class ToolCallParser {
  kNone,
  kHermes,
  kLlama3Json,
  kPythonic,
  kMistral,
  kQwen3Coder,
  kDeepSeekV3,
  kDeepSeekV31
};

// `--tool-call-parser` value → parser; nullopt for an unknown name.
std::optional<ToolCallParser> tool_call_parser_from_name(std::string_view name);
inline constexpr std::string_view kToolCallParserChoices =
    "hermes, llama3_json, pythonic, mistral, qwen3_coder, deepseek_v3, deepseek_v31";

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";  // llama3_json's optional start
inline constexpr std::string_view kPythonStart = "<|python_start|>";  // pythonic's optional start
inline constexpr std::string_view kPythonEnd = "<|python_end|>";
inline constexpr std::string_view kMistralToolCalls = "[TOOL_CALLS]";  // a special token
inline constexpr std::string_view kDeepSeekToolCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kReplySpaces = " \t\n\r";  // blanks around and between calls

// The first position at or after `at` that is not one of kReplySpaces (text.size() if none).
inline size_t skip_reply_spaces(std::string_view text, size_t at) {
  const size_t next = text.find_first_not_of(kReplySpaces, at);
  return next == std::string_view::npos ? text.size() : next;
}

// A function name as tools spell them: letters, digits, '_', '-' and '.' (formats that write the
// name bare, outside JSON, accept only these).
inline bool is_function_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-' || c == '.'))
      return false;
  return true;
}

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON text, as OpenAI sends function.arguments
};

// The request's tools' parameter types (JSON Schema "type", the first of a list): function name →
// parameter → type. qwen3_coder types its text values by them.
using ToolParameterTypes =
    std::map<std::string, std::map<std::string, std::string, std::less<>>, std::less<>>;

struct ParsedToolCalls {
  std::string content;  // the text besides the calls (all of it when there is no call)
  std::vector<ToolCall> calls;
};

// The calls in `text` in the parser's format (kNone: none).
ParsedToolCalls parse_tool_calls(ToolCallParser parser, std::string_view text,
                                 const ToolParameterTypes& types = {});

// How much of `text` (a stream's text so far) may be sent as content before the reply ends:
// never a byte that may belong to a call. Never shrinks as the text grows, and the finished
// text's parsed content (or, without calls, the whole text) starts with it.
size_t tool_call_content_prefix(ToolCallParser parser, std::string_view text);

// The calls a stream's text so far has begun, in order, up to the first whose name is not yet
// known, each with its arguments so far: when the finished text parses as calls, its calls' names
// are these and their arguments extend these. pythonic: the calls complete so far, each whole.
std::vector<ToolCall> streamed_tool_calls(ToolCallParser parser, std::string_view text,
                                          const ToolParameterTypes& types = {});

// The formats one by one. hermes: when a call's body is not a JSON object with a string "name"
// (arguments an object, a string or absent), no call is taken and the whole text is content.
ParsedToolCalls parse_hermes_tool_calls(std::string_view text);
ParsedToolCalls parse_llama3_json_tool_calls(std::string_view text);
ParsedToolCalls parse_pythonic_tool_calls(std::string_view text);  // pythonic_tool_calls.cpp
std::vector<ToolCall> streamed_pythonic_tool_calls(std::string_view text);  // the same file
ParsedToolCalls parse_mistral_tool_calls(std::string_view text);  // mistral_tool_calls.cpp
std::vector<ToolCall> streamed_mistral_tool_calls(std::string_view text);
size_t mistral_content_prefix(std::string_view text);
ParsedToolCalls parse_qwen3_coder_tool_calls(
    std::string_view text,
    const ToolParameterTypes& types);  // xml_tool_calls.cpp
std::vector<ToolCall> streamed_qwen3_coder_tool_calls(std::string_view text,
                                                      const ToolParameterTypes& types);
size_t qwen3_coder_content_prefix(std::string_view text);
// v31: deepseek_v31's form, else deepseek_v3's (deepseek_tool_calls.cpp).
ParsedToolCalls parse_deepseek_tool_calls(std::string_view text, bool v31);
std::vector<ToolCall> streamed_deepseek_tool_calls(std::string_view text, bool v31);
size_t deepseek_content_prefix(std::string_view text);

// A new call's id as the parser's models expect it: "chatcmpl-tool-…", mistral's 9 characters.
std::string new_tool_call_id(ToolCallParser parser);

// hermes: up to the first <tool_call>, and short of a tail that could begin one.
size_t hermes_content_prefix(std::string_view text);

// The calls of a guided tool_choice "required" output, [{"name": ..., "parameters": {...}}, ...]
// (arguments: the parameters' JSON text); empty when the text is not such a list (cut short).
std::vector<ToolCall> parse_tool_call_list(std::string_view text);
// The same list as far as a stream's text shows it (as streamed_tool_calls).
std::vector<ToolCall> streamed_tool_call_list(std::string_view text);

}  // namespace serval::server
