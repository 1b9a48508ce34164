#include "server/tool_call_parser.h"

#include <optional>

#include "server/json_tool_calls.h"
#include "server/marker_tail.h"
#include "server/random_id.h"

namespace serval::server {

namespace {

constexpr std::string_view kToolCallClose = "</tool_call>";
constexpr std::string_view kHermesArgumentKeys[] = {"arguments"};
// As vLLM, "arguments" or "parameters" (Llama's own name); the first in the object.
constexpr std::string_view kLlamaArgumentKeys[] = {"arguments", "parameters"};
constexpr std::string_view kListArgumentKeys[] = {"parameters"};

// Formats whose calls make the whole reply: content may stream until the first non-space byte
// shows that the reply is not calls (neither `open` nor the start of `tag`).
size_t leading_calls_content_prefix(std::string_view text, char open, std::string_view tag) {
  const std::string_view rest = text.substr(skip_reply_spaces(text, 0));
  if (rest.empty() || rest[0] == open || rest.starts_with(tag) || tag.starts_with(rest)) return 0;
  return text.size();
}

// The insides of hermes' <tool_call> blocks, in order; the last may be unclosed (cut short), and
// while `streaming` it stops short of a tail that may begin its </tool_call>.
std::vector<std::string_view> hermes_call_bodies(std::string_view text, bool streaming) {
  std::vector<std::string_view> bodies;
  for (size_t open = text.find(kToolCallOpen); open != std::string_view::npos;) {
    const size_t body = open + kToolCallOpen.size();
    const size_t close = text.find(kToolCallClose, body);
    if (close == std::string_view::npos) {
      std::string_view rest = text.substr(body);
      if (streaming) rest.remove_suffix(partial_marker_tail(rest, kToolCallClose));
      bodies.push_back(rest);
      break;
    }
    bodies.push_back(text.substr(body, close - body));
    open = text.find(kToolCallOpen, close + kToolCallClose.size());
  }
  return bodies;
}

// `body` (a hermes <tool_call> block's inside) as one call, blanks around it allowed.
std::optional<ToolCall> whole_json_call(std::string_view body) {
  const size_t begin = skip_reply_spaces(body, 0);
  const JsonCallScan scan = scan_json_call(body, begin, kHermesArgumentKeys);
  if (!json_call_valid(body, begin, scan) || skip_reply_spaces(body, scan.end) != body.size())
    return std::nullopt;
  return ToolCall{*scan.name, scan.arguments};
}

// llama3_json's calls start here: after blanks and an optional <|python_tag|>.
size_t llama3_json_calls_begin(std::string_view text) {
  const size_t at = skip_reply_spaces(text, 0);
  if (!text.substr(at).starts_with(kPythonTag)) return at;
  return skip_reply_spaces(text, at + kPythonTag.size());
}

JsonCallSequence scan_llama3_json_calls(std::string_view text) {
  return scan_json_call_sequence(text, llama3_json_calls_begin(text), ';', '\0',
                                 kLlamaArgumentKeys);
}

// tool_choice "required": the list's elements, or a malformed sequence when there is no '['.
JsonCallSequence scan_tool_call_list(std::string_view text) {
  const size_t at = skip_reply_spaces(text, 0);
  if (at < text.size() && text[at] != '[') {
    JsonCallSequence none;
    none.malformed = true;
    return none;
  }
  return scan_json_call_sequence(text, at + 1, ',', ']', kListArgumentKeys);
}

}  // namespace

std::optional<ToolCallParser> tool_call_parser_from_name(std::string_view name) {
  if (name == "hermes") return ToolCallParser::kHermes;
  if (name == "llama3_json") return ToolCallParser::kLlama3Json;
  if (name == "pythonic") return ToolCallParser::kPythonic;
  if (name == "mistral") return ToolCallParser::kMistral;
  if (name == "qwen3_coder") return ToolCallParser::kQwen3Coder;
  if (name == "deepseek_v3") return ToolCallParser::kDeepSeekV3;
  if (name == "deepseek_v31") return ToolCallParser::kDeepSeekV31;
  return std::nullopt;
}

ParsedToolCalls parse_tool_calls(ToolCallParser parser, std::string_view text,
                                 const ToolParameterTypes& types) {
  switch (parser) {
    case ToolCallParser::kHermes:
      return parse_hermes_tool_calls(text);
    case ToolCallParser::kLlama3Json:
      return parse_llama3_json_tool_calls(text);
    case ToolCallParser::kPythonic:
      return parse_pythonic_tool_calls(text);
    case ToolCallParser::kMistral:
      return parse_mistral_tool_calls(text);
    case ToolCallParser::kQwen3Coder:
      return parse_qwen3_coder_tool_calls(text, types);
    case ToolCallParser::kDeepSeekV3:
    case ToolCallParser::kDeepSeekV31:
      return parse_deepseek_tool_calls(text, parser == ToolCallParser::kDeepSeekV31);
    case ToolCallParser::kNone:
      break;
  }
  return {std::string(text), {}};
}

size_t tool_call_content_prefix(ToolCallParser parser, std::string_view text) {
  switch (parser) {
    case ToolCallParser::kHermes:
      return hermes_content_prefix(text);
    case ToolCallParser::kLlama3Json:
      return leading_calls_content_prefix(text, '{', kPythonTag);
    case ToolCallParser::kPythonic:
      return leading_calls_content_prefix(text, '[', kPythonStart);
    case ToolCallParser::kMistral:
      return mistral_content_prefix(text);
    case ToolCallParser::kQwen3Coder:
      return qwen3_coder_content_prefix(text);
    case ToolCallParser::kDeepSeekV3:
    case ToolCallParser::kDeepSeekV31:
      return deepseek_content_prefix(text);
    case ToolCallParser::kNone:
      break;
  }
  return text.size();
}

ParsedToolCalls parse_hermes_tool_calls(std::string_view text) {
  const std::vector<std::string_view> bodies = hermes_call_bodies(text, /*streaming=*/false);
  if (bodies.empty()) return {std::string(text), {}};
  ParsedToolCalls out{std::string(text.substr(0, text.find(kToolCallOpen))), {}};
  for (std::string_view body : bodies) {
    std::optional<ToolCall> call = whole_json_call(body);
    if (!call) return {std::string(text), {}};
    out.calls.push_back(std::move(*call));
  }
  return out;
}

ParsedToolCalls parse_llama3_json_tool_calls(std::string_view text) {
  const JsonCallSequence seq = scan_llama3_json_calls(text);
  std::vector<ToolCall> calls = finished_json_calls(text, seq);
  if (calls.empty()) return {std::string(text), {}};
  return {"", std::move(calls)};
}

std::vector<ToolCall> parse_tool_call_list(std::string_view text) {
  const JsonCallSequence seq = scan_tool_call_list(text);
  if (seq.end == std::string_view::npos || skip_reply_spaces(text, seq.end) != text.size())
    return {};
  std::vector<ToolCall> calls = finished_json_calls(text, seq);
  for (const JsonCallScan& call : seq.calls)
    if (!call.has_arguments) return {};
  return calls;
}

std::vector<ToolCall> streamed_tool_calls(ToolCallParser parser, std::string_view text,
                                          const ToolParameterTypes& types) {
  std::vector<ToolCall> calls;
  if (parser == ToolCallParser::kQwen3Coder) {
    calls = streamed_qwen3_coder_tool_calls(text, types);
  } else if (parser == ToolCallParser::kMistral) {
    calls = streamed_mistral_tool_calls(text);
  } else if (parser == ToolCallParser::kDeepSeekV3 || parser == ToolCallParser::kDeepSeekV31) {
    calls = streamed_deepseek_tool_calls(text, parser == ToolCallParser::kDeepSeekV31);
  } else if (parser == ToolCallParser::kPythonic) {
    calls = streamed_pythonic_tool_calls(text);
  } else if (parser == ToolCallParser::kLlama3Json) {
    add_named_json_calls(scan_llama3_json_calls(text), calls);
  } else if (parser == ToolCallParser::kHermes) {
    for (std::string_view body : hermes_call_bodies(text, /*streaming=*/true)) {
      const JsonCallScan scan = scan_json_call(body, 0, kHermesArgumentKeys);
      if (scan.malformed || !scan.name) break;
      calls.push_back({*scan.name, scan.arguments});
    }
  }
  return calls;
}

std::vector<ToolCall> streamed_tool_call_list(std::string_view text) {
  std::vector<ToolCall> calls;
  add_named_json_calls(scan_tool_call_list(text), calls);
  return calls;
}

size_t hermes_content_prefix(std::string_view text) {
  return text_before_marker(text, kToolCallOpen);
}

std::string new_tool_call_id(ToolCallParser parser) {
  return parser == ToolCallParser::kMistral ? random_alnum_id(9) : random_id("chatcmpl-tool-");
}

}  // namespace serval::server
