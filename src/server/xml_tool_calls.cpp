// The qwen3_coder tool-call format (tool_call_parser.h): after the content, calls as
//   <tool_call>
//   <function=get_weather>
//   <parameter=city>
//   Paris
//   </parameter>
//   </function>
//   </tool_call>
// Parameter values are text, typed by the tool's JSON Schema (a string stays text; integer,
// number and boolean are read as such; other types as JSON, then as a Python literal; text that
// does not read stays text; "null" is null). The arguments are the JSON object of the values in
// the model's order, written as Python's json.dumps writes it ({"a": 1, "b": "x"}): a stream
// sends "{", then each parameter once its value is complete, then "}" with the function's end.
#include <charconv>
#include <nlohmann/json.hpp>

#include "server/marker_tail.h"
#include "server/tool_call_parser.h"

namespace serval::server {

namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kFunctionOpen = "<function=";
constexpr std::string_view kFunctionClose = "</function>";
constexpr std::string_view kParameterOpen = "<parameter=";
constexpr std::string_view kParameterClose = "</parameter>";

// A function as far as the text shows it: its name (complete), its complete parameters' JSON
// ("key": value pieces), and whether </function> was read.
struct XmlCall {
  std::string name;
  std::vector<std::string> members;
  bool closed = false;
};

std::string arguments_of(const XmlCall& call, bool close) {
  std::string out = "{";
  for (size_t i = 0; i < call.members.size(); ++i) out += (i ? ", " : "") + call.members[i];
  if (close) out += "}";
  return out;
}

std::optional<int64_t> whole_number(std::string_view s) {
  int64_t v = 0;
  const char* first = s.data() + (s.starts_with('+') ? 1 : 0);
  const auto r = std::from_chars(first, s.data() + s.size(), v);
  if (r.ec != std::errc() || r.ptr != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

// A parameter's text as its schema type makes it.
OrderedJson typed_value(const std::string& text, const std::string& type) {
  if (text == "null" || text == "NULL" || text == "None") return nullptr;
  if (type.empty() || type == "string" || type == "str" || type == "text" || type == "enum")
    return text;
  if (type.starts_with("int")) {
    if (auto v = whole_number(text)) return *v;
    return text;
  }
  if (type == "number" || type.starts_with("float") || type.starts_with("num")) {
    if (auto v = whole_number(text)) return *v;
    double d = 0;
    const auto r = std::from_chars(text.data(), text.data() + text.size(), d);
    if (r.ec == std::errc() && r.ptr == text.data() + text.size() && !text.empty()) return d;
    return text;
  }
  if (type == "boolean" || type == "bool") {
    if (text == "true" || text == "True") return true;
    if (text == "false" || text == "False") return false;
    return text;
  }
  OrderedJson j = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded()) return j;
  const ParsedToolCalls literal = parse_pythonic_tool_calls("[f(v=" + text + ")]");
  if (literal.calls.size() == 1) {  // a Python literal (single quotes, True, None, tuples)
    OrderedJson wrapped = OrderedJson::parse(literal.calls[0].arguments, nullptr, false);
    if (wrapped.is_object() && wrapped.size() == 1 && wrapped.contains("v")) return wrapped["v"];
  }
  return text;
}

// A value's text: one newline either side of it belongs to the markup.
std::string value_text(std::string_view raw) {
  if (raw.starts_with('\n')) raw.remove_prefix(1);
  if (raw.ends_with('\n')) raw.remove_suffix(1);
  return std::string(raw);
}

// Where the calls begin: the first <tool_call> or <function= (npos: none).
size_t calls_begin(std::string_view text) {
  return std::min(text.find(kCallOpen), text.find(kFunctionOpen));
}

// The calls from `at` as far as the text shows them; stops at anything else.
std::vector<XmlCall> read_calls(std::string_view text, size_t at, const ToolParameterTypes& types) {
  std::vector<XmlCall> calls;
  while (true) {
    at = skip_reply_spaces(text, at);
    if (text.substr(at).starts_with(kCallOpen)) at = skip_reply_spaces(text, at + kCallOpen.size());
    if (!text.substr(at).starts_with(kFunctionOpen)) return calls;
    const size_t name_begin = at + kFunctionOpen.size();
    const size_t name_end = text.find('>', name_begin);
    if (name_end == std::string_view::npos || name_end == name_begin) return calls;
    XmlCall call{std::string(text.substr(name_begin, name_end - name_begin)), {}, false};
    if (!is_function_name(call.name)) return calls;
    const auto fn = types.find(call.name);
    at = name_end + 1;
    while (true) {
      at = skip_reply_spaces(text, at);
      const std::string_view rest = text.substr(at);
      if (rest.starts_with(kFunctionClose)) {
        call.closed = true;
        at += kFunctionClose.size();
        break;
      }
      if (!rest.starts_with(kParameterOpen)) break;  // cut short (or not a parameter)
      const size_t key_begin = at + kParameterOpen.size();
      const size_t key_end = text.find('>', key_begin);
      if (key_end == std::string_view::npos) break;
      const std::string key(text.substr(key_begin, key_end - key_begin));
      // The value ends at </parameter>, or, without one, where the next parameter or the
      // function's end begins.
      const size_t value_begin = key_end + 1;
      const size_t close = text.find(kParameterClose, value_begin);
      const size_t next =
          std::min(text.find(kParameterOpen, value_begin), text.find(kFunctionClose, value_begin));
      const size_t value_end = std::min(close, next);
      if (value_end == std::string_view::npos) break;  // the value is still being written
      std::string type;
      if (fn != types.end())
        if (const auto t = fn->second.find(key); t != fn->second.end()) type = t->second;
      const OrderedJson value =
          typed_value(value_text(text.substr(value_begin, value_end - value_begin)), type);
      // (bytes that are not UTF-8 become U+FFFD: the arguments are JSON text)
      constexpr auto kReplace = OrderedJson::error_handler_t::replace;
      call.members.push_back(OrderedJson(key).dump(-1, ' ', false, kReplace) + ": " +
                             value.dump(-1, ' ', false, kReplace));
      at = value_end == close ? close + kParameterClose.size() : value_end;
    }
    const bool closed = call.closed;
    calls.push_back(std::move(call));
    if (!closed) return calls;
    at = skip_reply_spaces(text, at);
    if (text.substr(at).starts_with(kCallClose)) at += kCallClose.size();
  }
}

}  // namespace

ParsedToolCalls parse_qwen3_coder_tool_calls(std::string_view text,
                                             const ToolParameterTypes& types) {
  const size_t begin = calls_begin(text);
  if (begin == std::string_view::npos) return {std::string(text), {}};
  const std::vector<XmlCall> calls = read_calls(text, begin, types);
  if (calls.empty()) return {std::string(text), {}};
  ParsedToolCalls out{std::string(text.substr(0, begin)), {}};
  for (const XmlCall& call : calls) out.calls.push_back({call.name, arguments_of(call, true)});
  return out;
}

std::vector<ToolCall> streamed_qwen3_coder_tool_calls(std::string_view text,
                                                      const ToolParameterTypes& types) {
  std::vector<ToolCall> out;
  const size_t begin = calls_begin(text);
  if (begin == std::string_view::npos) return out;
  for (const XmlCall& call : read_calls(text, begin, types))
    out.push_back({call.name, arguments_of(call, call.closed)});
  return out;
}

size_t qwen3_coder_content_prefix(std::string_view text) {
  const size_t begin = calls_begin(text);
  if (begin != std::string_view::npos) return begin;
  return text.size() -
         std::max(partial_marker_tail(text, kCallOpen), partial_marker_tail(text, kFunctionOpen));
}

}  // namespace serval::server
