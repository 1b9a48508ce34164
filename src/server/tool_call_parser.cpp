#include "server/tool_call_parser.h"

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <optional>

#include "server/marker_tail.h"

namespace serval::server {

namespace {

constexpr std::string_view kToolCallClose = "</tool_call>";

// One past the '}' closing the JSON object that starts at text[at] ('{'), brackets inside strings
// not counted; npos when the text ends first. (Whether it is valid JSON is the parser's question.)
size_t object_end(std::string_view text, size_t at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// Formats whose calls make the whole reply: content may stream until the first non-space byte
// shows that the reply is not calls (neither `open` nor the start of `tag`).
size_t leading_calls_content_prefix(std::string_view text, char open, std::string_view tag) {
  const std::string_view rest = text.substr(skip_reply_spaces(text, 0));
  if (rest.empty() || rest[0] == open || rest.starts_with(tag) || tag.starts_with(rest)) return 0;
  return text.size();
}

// One call's body, or nullopt when it is not a call: a JSON object with a string "name", its
// arguments under the first of `argument_keys` present (an object, or a string passed on as it
// is; absent: "{}").
std::optional<ToolCall> parse_call(std::string_view body,
                                   std::initializer_list<std::string_view> argument_keys) {
  const nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string()) return std::nullopt;
  ToolCall call{name->get<std::string>(), "{}"};
  for (std::string_view key : argument_keys) {
    auto args = j.find(key);
    if (args == j.end()) continue;
    if (args->is_string())
      call.arguments = args->get<std::string>();
    else if (args->is_object())
      call.arguments = args->dump();
    else
      return std::nullopt;
    break;
  }
  return call;
}

}  // namespace

std::optional<ToolCallParser> tool_call_parser_from_name(std::string_view name) {
  if (name == "hermes") return ToolCallParser::kHermes;
  if (name == "llama3_json") return ToolCallParser::kLlama3Json;
  if (name == "pythonic") return ToolCallParser::kPythonic;
  return std::nullopt;
}

ParsedToolCalls parse_tool_calls(ToolCallParser parser, std::string_view text) {
  switch (parser) {
    case ToolCallParser::kHermes:
      return parse_hermes_tool_calls(text);
    case ToolCallParser::kLlama3Json:
      return parse_llama3_json_tool_calls(text);
    case ToolCallParser::kPythonic:
      return parse_pythonic_tool_calls(text);
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
    case ToolCallParser::kNone:
      break;
  }
  return text.size();
}

ParsedToolCalls parse_hermes_tool_calls(std::string_view text) {
  ParsedToolCalls out;
  const size_t first = text.find(kToolCallOpen);
  if (first == std::string_view::npos) {
    out.content = std::string(text);
    return out;
  }
  size_t at = first;
  while (at != std::string_view::npos) {
    const size_t body = at + kToolCallOpen.size();
    const size_t close = text.find(kToolCallClose, body);
    const std::string_view inner =
        text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
    std::optional<ToolCall> call = parse_call(inner, {"arguments"});
    if (!call) return {std::string(text), {}};
    out.calls.push_back(std::move(*call));
    if (close == std::string_view::npos) break;
    at = text.find(kToolCallOpen, close + kToolCallClose.size());
  }
  out.content = std::string(text.substr(0, first));
  return out;
}

ParsedToolCalls parse_llama3_json_tool_calls(std::string_view text) {
  ParsedToolCalls none{std::string(text), {}};
  size_t at = skip_reply_spaces(text, 0);
  if (text.substr(at).starts_with(kPythonTag)) at = skip_reply_spaces(text, at + kPythonTag.size());
  if (at == text.size() || text[at] != '{') return none;
  ParsedToolCalls out;
  while (true) {
    const size_t end = object_end(text, at);
    if (end == std::string_view::npos) return none;  // cut short
    // As vLLM: "arguments" when present, else "parameters" (Llama's own name).
    std::optional<ToolCall> call =
        parse_call(text.substr(at, end - at), {"arguments", "parameters"});
    if (!call) return none;
    out.calls.push_back(std::move(*call));
    at = skip_reply_spaces(text, end);
    if (at == text.size()) return out;
    if (text[at] != ';') return none;  // other text after a call
    at = skip_reply_spaces(text, at + 1);
    if (at == text.size()) return out;  // a trailing ';'
    if (text[at] != '{') return none;
  }
}

std::vector<ToolCall> parse_tool_call_list(std::string_view text) {
  const nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_array() || j.empty()) return {};
  std::vector<ToolCall> calls;
  for (const nlohmann::ordered_json& c : j) {
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string() ||
        !c.contains("parameters"))
      return {};
    calls.push_back({c["name"].get<std::string>(), c["parameters"].dump()});
  }
  return calls;
}

size_t hermes_content_prefix(std::string_view text) {
  const size_t open = text.find(kToolCallOpen);
  if (open != std::string_view::npos) return open;
  return text.size() - partial_marker_tail(text, kToolCallOpen);
}

}  // namespace serval::server
