// Tool calls in generated text, for `serve --enable-auto-tool-choice --tool-call-parser hermes`:
// the Hermes / Qwen format, one JSON object {"name": ..., "arguments": {...}} between
// <tool_call> and </tool_call> per call (the last may be cut off unclosed by max_tokens).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace serval::server {

inline constexpr std::string_view kToolCallOpen = "<tool_call>";

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON text, as OpenAI sends function.arguments
};

struct ParsedToolCalls {
  std::string content;  // the text before the first call (all of it when there is no call)
  std::vector<ToolCall> calls;
};

// The calls in `text`. When a call's body is not a JSON object with a string "name" (arguments
// an object, a string or absent), no call is taken and the whole text is content.
ParsedToolCalls parse_hermes_tool_calls(std::string_view text);

// How much of `text` (a stream's text so far) may be sent as content: up to the first
// <tool_call>, and short of a tail that could begin one.
size_t hermes_content_prefix(std::string_view text);

// The calls of a guided tool_choice "required" output, [{"name": ..., "parameters": {...}}, ...]
// (arguments: the parameters' JSON text); empty when the text is not such a list (cut short).
std::vector<ToolCall> parse_tool_call_list(std::string_view text);

}  // namespace serval::server
