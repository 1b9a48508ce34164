// The mistral tool-call format (tool_call_parser.h): after the content, [TOOL_CALLS] and either
//   a JSON list of calls         [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]
//   or each call by name         [TOOL_CALLS]f[ARGS]{...}[TOOL_CALLS]g[ARGS]{...}
// (the second from Mistral's v11 tokenizers on). Arguments are the model's JSON text.
#include <nlohmann/json.hpp>

#include "server/json_tool_calls.h"
#include "server/marker_tail.h"
#include "server/tool_call_parser.h"

namespace serval::server {

namespace {

constexpr std::string_view kArgs = "[ARGS]";
constexpr std::string_view kArgumentKeys[] = {"arguments"};

// The calls after the first [TOOL_CALLS] (`calls`: the text after it) as far as they go;
// `finished`: whether they are all complete and valid and nothing else follows.
struct MistralCalls {
  std::vector<ToolCall> calls;
  bool finished = false;
};

MistralCalls read_list_form(std::string_view calls, size_t at, bool whole) {
  const JsonCallSequence seq = scan_json_call_sequence(calls, at + 1, ',', ']', kArgumentKeys);
  MistralCalls out;
  if (!whole) {
    add_named_json_calls(seq, out.calls);
    return out;
  }
  if (seq.end == std::string_view::npos || skip_reply_spaces(calls, seq.end) != calls.size())
    return out;
  out.calls = finished_json_calls(calls, seq);
  out.finished = !out.calls.empty();
  return out;
}

// name[ARGS]{...}, separated by [TOOL_CALLS]. A stream's call shows once its [ARGS] is read, its
// arguments growing as the object does.
MistralCalls read_named_form(std::string_view calls, bool whole) {
  MistralCalls out;
  size_t at = 0;
  while (true) {
    const size_t args = calls.find(kArgs, at);
    if (args == std::string_view::npos || !is_function_name(calls.substr(at, args - at)))
      return out;
    const std::string name(calls.substr(at, args - at));
    const size_t begin = skip_reply_spaces(calls, args + kArgs.size());
    if (begin == calls.size()) {
      if (!whole) out.calls.push_back({name, ""});
      return out;
    }
    if (calls[begin] != '{') return out;
    const size_t end = json_object_end(calls, begin);
    if (end == std::string_view::npos) {
      if (!whole) out.calls.push_back({name, std::string(calls.substr(begin))});
      return out;
    }
    const std::string_view object = calls.substr(begin, end - begin);
    if (whole && !nlohmann::json::accept(object)) return {};
    out.calls.push_back({name, std::string(object)});
    at = skip_reply_spaces(calls, end);
    if (at == calls.size()) {
      out.finished = true;
      return out;
    }
    if (!calls.substr(at).starts_with(kMistralToolCalls)) return whole ? MistralCalls{} : out;
    at += kMistralToolCalls.size();
  }
}

MistralCalls read_calls(std::string_view text, bool whole) {
  const size_t marker = text.find(kMistralToolCalls);
  if (marker == std::string_view::npos) return {};
  const std::string_view calls = text.substr(marker + kMistralToolCalls.size());
  const size_t at = skip_reply_spaces(calls, 0);
  if (at < calls.size() && calls[at] == '[') return read_list_form(calls, at, whole);
  return read_named_form(calls.substr(at), whole);
}

}  // namespace

ParsedToolCalls parse_mistral_tool_calls(std::string_view text) {
  MistralCalls read = read_calls(text, /*whole=*/true);
  if (!read.finished) return {std::string(text), {}};
  return {std::string(text.substr(0, text.find(kMistralToolCalls))), std::move(read.calls)};
}

std::vector<ToolCall> streamed_mistral_tool_calls(std::string_view text) {
  return read_calls(text, /*whole=*/false).calls;
}

size_t mistral_content_prefix(std::string_view text) {
  return text_before_marker(text, kMistralToolCalls);
}

}  // namespace serval::server
