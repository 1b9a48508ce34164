// The DeepSeek tool-call formats (tool_call_parser.h): after the content, the calls between
//   <｜tool▁calls▁begin｜> … <｜tool▁calls▁end｜>, each one
//   deepseek_v3:
//   <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>
//   deepseek_v31:  <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
// (DeepSeek-V3 / R1, and V3.1's chat templates). Arguments are the model's JSON object text. The
// final <｜tool▁calls▁end｜> may be missing (a reply cut short, or ended by it as a stop token).
#include <nlohmann/json.hpp>

#include "server/json_tool_calls.h"
#include "server/marker_tail.h"
#include "server/tool_call_parser.h"

namespace serval::server {

namespace {

constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kSep = "<｜tool▁sep｜>";
constexpr std::string_view kJsonFence = "```json";  // deepseek_v3: around the arguments
constexpr std::string_view kFence = "```";

// The calls after <｜tool▁calls▁begin｜> as far as they go; `finished`: all complete and valid,
// nothing after them but <｜tool▁calls▁end｜> and blanks.
struct DeepSeekCalls {
  std::vector<ToolCall> calls;
  bool finished = false;
};

// One call's body after its <｜tool▁call▁begin｜> (`text`, from `at`): its name, and where its
// arguments' JSON object begins (npos: not shown yet, or malformed when `bad`).
struct CallHead {
  std::string name;
  size_t args = std::string_view::npos;
  bool bad = false;
};

CallHead read_head(std::string_view text, size_t at, bool v31) {
  CallHead h;
  const size_t sep = text.find(kSep, at);
  if (sep == std::string_view::npos) return h;
  if (v31) {
    h.name = std::string(text.substr(at, sep - at));
    h.bad = !is_function_name(h.name);
    h.args = skip_reply_spaces(text, sep + kSep.size());
    return h;
  }
  // v3: "function" (the call's type), then the name on its own line, then the fenced object.
  const size_t name_begin = sep + kSep.size();
  const size_t fence = text.find(kJsonFence, name_begin);
  const size_t line_end = text.find('\n', name_begin);
  if (fence == std::string_view::npos || line_end == std::string_view::npos) {
    // The name may be complete only once its line ends.
    h.bad = line_end != std::string_view::npos &&
            !is_function_name(text.substr(name_begin, line_end - name_begin));
    return h;
  }
  h.name = std::string(text.substr(name_begin, line_end - name_begin));
  h.bad = !is_function_name(h.name) || skip_reply_spaces(text, line_end) != fence;
  h.args = skip_reply_spaces(text, fence + kJsonFence.size());
  return h;
}

DeepSeekCalls read_calls(std::string_view text, bool whole, bool v31) {
  DeepSeekCalls out;
  const size_t marker = text.find(kDeepSeekToolCallsBegin);
  if (marker == std::string_view::npos) return out;
  size_t at = skip_reply_spaces(text, marker + kDeepSeekToolCallsBegin.size());
  while (true) {
    if (!text.substr(at).starts_with(kCallBegin)) {
      const std::string_view rest = text.substr(at);
      out.finished = !out.calls.empty() &&
                     (rest.empty() || (rest.starts_with(kCallsEnd) &&
                                       skip_reply_spaces(rest, kCallsEnd.size()) == rest.size()));
      if (whole && !out.finished) return {};
      return out;
    }
    const CallHead head = read_head(text, at + kCallBegin.size(), v31);
    if (head.bad) return whole ? DeepSeekCalls{} : out;
    if (head.args == std::string_view::npos) return whole ? DeepSeekCalls{} : out;
    if (head.args == text.size()) {
      if (!whole) out.calls.push_back({head.name, ""});
      return out;
    }
    if (text[head.args] != '{') return whole ? DeepSeekCalls{} : out;
    const size_t end = json_object_end(text, head.args);
    if (end == std::string_view::npos) {
      if (!whole) out.calls.push_back({head.name, std::string(text.substr(head.args))});
      return out;
    }
    const std::string_view object = text.substr(head.args, end - head.args);
    if (whole && !nlohmann::json::accept(object)) return {};
    out.calls.push_back({head.name, std::string(object)});
    at = skip_reply_spaces(text, end);
    if (!v31) {  // the closing fence
      if (!text.substr(at).starts_with(kFence)) {
        if (whole || !kFence.starts_with(text.substr(at))) return whole ? DeepSeekCalls{} : out;
        return out;
      }
      at = skip_reply_spaces(text, at + kFence.size());
    }
    if (!text.substr(at).starts_with(kCallEnd)) return whole ? DeepSeekCalls{} : out;
    at = skip_reply_spaces(text, at + kCallEnd.size());
  }
}

}  // namespace

ParsedToolCalls parse_deepseek_tool_calls(std::string_view text, bool v31) {
  DeepSeekCalls read = read_calls(text, /*whole=*/true, v31);
  if (!read.finished) return {std::string(text), {}};
  return {std::string(text.substr(0, text.find(kDeepSeekToolCallsBegin))), std::move(read.calls)};
}

std::vector<ToolCall> streamed_deepseek_tool_calls(std::string_view text, bool v31) {
  return read_calls(text, /*whole=*/false, v31).calls;
}

size_t deepseek_content_prefix(std::string_view text) {
  return text_before_marker(text, kDeepSeekToolCallsBegin);
}

}  // namespace serval::server
