#include "server/json_tool_calls.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "server/tool_call_parser.h"

namespace serval::server {

namespace {

constexpr size_t kCut = std::string_view::npos;  // the text ends inside the value
constexpr size_t kBad = kCut - 1;                // no JSON value starts here

// One past the '"' closing the string that opens at text[at].
size_t string_end(std::string_view text, size_t at) {
  for (size_t i = at + 1; i < text.size(); ++i) {
    if (text[i] == '\\')
      ++i;
    else if (text[i] == '"')
      return i + 1;
  }
  return kCut;
}

// One past the bracket closing the object or array that opens at text[at], brackets inside
// strings not counted (whether the inside is valid JSON is json_call_valid's question).
size_t bracketed_end(std::string_view text, size_t at) {
  int depth = 0;
  for (size_t i = at; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '"') {
      i = string_end(text, i);
      if (i == kCut) return kCut;
      --i;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return kCut;
}

bool literal_byte(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' ||
         c == 'E';
}

// One past the JSON value starting at text[at] (at < size), kCut or kBad.
size_t value_end(std::string_view text, size_t at) {
  const char c = text[at];
  if (c == '"') return string_end(text, at);
  if (c == '{' || c == '[') return bracketed_end(text, at);
  size_t i = at;
  while (i < text.size() && literal_byte(text[i])) ++i;
  if (i == at) return kBad;
  return i == text.size() ? kCut : i;  // a number may go on
}

// The value of a complete JSON string token; nullopt when it is not a valid one.
std::optional<std::string> string_value(std::string_view token) {
  const nlohmann::json j = nlohmann::json::parse(token, nullptr, /*allow_exceptions=*/false);
  if (!j.is_string()) return std::nullopt;
  return j.get<std::string>();
}

// Takes the member value text[begin, end) (end kCut: cut short) as the call's name or arguments
// when its key says so; false when it cannot be what its key asks.
bool take_member(std::string_view text, std::string_view key, size_t begin, size_t end,
                 std::span<const std::string_view> argument_keys, JsonCallScan& scan) {
  const bool complete = end != kCut;
  if (key == "name" && !scan.name) {
    if (text[begin] != '"') return false;
    if (complete) {
      scan.name = string_value(text.substr(begin, end - begin));
      return scan.name.has_value();
    }
    return true;
  }
  if (scan.has_arguments || std::ranges::find(argument_keys, key) == argument_keys.end())
    return true;
  scan.has_arguments = true;
  if (text[begin] == '{') {
    scan.arguments = text.substr(begin, complete ? end - begin : std::string_view::npos);
    return true;
  }
  if (text[begin] != '"') return false;
  if (!complete) return true;
  std::optional<std::string> value = string_value(text.substr(begin, end - begin));
  if (!value) return false;
  scan.arguments = std::move(*value);
  return true;
}

}  // namespace

JsonCallScan scan_json_call(std::string_view text, size_t at,
                            std::span<const std::string_view> argument_keys) {
  JsonCallScan scan;
  const auto malformed = [&scan] {
    scan.malformed = true;
    return scan;
  };
  size_t i = skip_reply_spaces(text, at);
  if (i == text.size()) return scan;
  if (text[i] != '{') return malformed();
  i = skip_reply_spaces(text, i + 1);
  while (i < text.size()) {
    if (text[i] == '}') {
      if (!scan.name) return malformed();
      if (!scan.has_arguments) scan.arguments = "{}";
      scan.end = i + 1;
      return scan;
    }
    if (text[i] != '"') return malformed();
    const size_t key_end = string_end(text, i);
    if (key_end == kCut) return scan;
    const std::optional<std::string> key = string_value(text.substr(i, key_end - i));
    if (!key) return malformed();
    i = skip_reply_spaces(text, key_end);
    if (i == text.size()) return scan;
    if (text[i] != ':') return malformed();
    const size_t begin = skip_reply_spaces(text, i + 1);
    if (begin == text.size()) return scan;
    const size_t end = value_end(text, begin);
    if (end == kBad || !take_member(text, *key, begin, end, argument_keys, scan))
      return malformed();
    if (end == kCut) return scan;
    i = skip_reply_spaces(text, end);
    if (i < text.size() && text[i] == ',') {
      i = skip_reply_spaces(text, i + 1);
      if (i < text.size() && text[i] == '}') return malformed();  // a trailing comma
    } else if (i < text.size() && text[i] != '}') {
      return malformed();
    }
  }
  return scan;
}

bool json_call_valid(std::string_view text, size_t begin, const JsonCallScan& scan) {
  return !scan.malformed && scan.end != kCut && scan.name &&
         nlohmann::json::accept(text.substr(begin, scan.end - begin));
}

JsonCallSequence scan_json_call_sequence(std::string_view text, size_t at, char separator,
                                         char close,
                                         std::span<const std::string_view> argument_keys) {
  JsonCallSequence seq;
  size_t i = skip_reply_spaces(text, at);
  while (i < text.size()) {
    if (close != '\0' && text[i] == close && seq.calls.empty()) {
      seq.malformed = true;  // no call at all
      return seq;
    }
    seq.begins.push_back(i);
    seq.calls.push_back(scan_json_call(text, i, argument_keys));
    const JsonCallScan& call = seq.calls.back();
    if (call.malformed) {
      seq.malformed = true;
      return seq;
    }
    if (call.end == kCut) return seq;
    i = skip_reply_spaces(text, call.end);
    if (i == text.size()) return seq;
    if (close != '\0' && text[i] == close) {
      seq.end = i + 1;
      return seq;
    }
    if (text[i] != separator) {
      seq.malformed = true;
      return seq;
    }
    i = skip_reply_spaces(text, i + 1);
  }
  return seq;
}

std::vector<ToolCall> finished_json_calls(std::string_view text, const JsonCallSequence& seq) {
  std::vector<ToolCall> calls;
  if (seq.malformed) return calls;
  for (size_t i = 0; i < seq.calls.size(); ++i) {
    if (!json_call_valid(text, seq.begins[i], seq.calls[i])) return {};
    calls.push_back({*seq.calls[i].name, seq.calls[i].arguments});
  }
  return calls;
}

void add_named_json_calls(const JsonCallSequence& seq, std::vector<ToolCall>& calls) {
  for (const JsonCallScan& call : seq.calls) {
    if (!call.name || call.malformed) return;
    calls.push_back({*call.name, call.arguments});
  }
}

size_t json_object_end(std::string_view text, size_t at) {
  return bracketed_end(text, at);
}

}  // namespace serval::server
