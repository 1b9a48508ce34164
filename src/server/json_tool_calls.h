// Tool calls written as JSON objects {"name": "f", "arguments": {...}}, read as far as a text
// shows them, so that a stream can send each call's name and the arguments written so far, and
// the finished text gives the same calls (hermes, llama3_json and tool_choice "required").
//
// A call's arguments are the model's own JSON text of the arguments object (its spacing and key
// order kept, as OpenAI passes them on), or the value of a JSON string holding them; a text cut
// short shows a prefix of them, so what a stream sends always extends to the finished calls.
#pragma once
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_call_parser.h"

namespace serval::server {

struct JsonCallScan {
  std::optional<std::string> name;  // once the name's string is complete
  // Object arguments: their text so far (all of it once `end` is set). String arguments: empty
  // until the string is complete, then its value. None: empty, "{}" once `end` is set.
  std::string arguments;
  bool has_arguments = false;           // one of the argument keys was seen
  size_t end = std::string_view::npos;  // one past the object's '}'; npos while cut short
  bool malformed = false;  // not a call: not an object, a syntax error between its members, a
                           // name that is not a string, arguments neither an object nor a string
};

// The call object starting at the first non-blank byte at or after `at`. Its arguments are under
// the first of `argument_keys` present in the object (by position). The members' values are
// skipped by bracket matching: a finished call's JSON must still be validated (json_call_valid).
JsonCallScan scan_json_call(std::string_view text, size_t at,
                            std::span<const std::string_view> argument_keys);

// Whether text[begin, scan.end) is a finished call: complete, well-formed, valid JSON.
bool json_call_valid(std::string_view text, size_t begin, const JsonCallScan& scan);

// Calls in a sequence from text[at]: objects separated by `separator` (blanks around it), ended by
// `close` when it is not '\0' (else by the text's end; a trailing separator allowed).
struct JsonCallSequence {
  std::vector<JsonCallScan> calls;
  std::vector<size_t> begins;           // where each call's object starts
  bool malformed = false;               // something other than a call, a separator or the close
  size_t end = std::string_view::npos;  // one past `close`; npos until then
};
JsonCallSequence scan_json_call_sequence(std::string_view text, size_t at, char separator,
                                         char close,
                                         std::span<const std::string_view> argument_keys);

// A scanned sequence's calls, or none unless every one is finished and valid.
std::vector<ToolCall> finished_json_calls(std::string_view text, const JsonCallSequence& seq);
// The calls of a sequence a stream has begun, up to the first whose name is not yet known (or
// that is malformed), each with its arguments so far, appended to `calls`.
void add_named_json_calls(const JsonCallSequence& seq, std::vector<ToolCall>& calls);

// One past the '}' closing the object that opens at text[at] (strings skipped);
// std::string_view::npos while the text ends first.
size_t json_object_end(std::string_view text, size_t at);

}  // namespace serval::server
