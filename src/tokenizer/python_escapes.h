// Python's escape sequences in a str literal, shared by the Jinja lexer (template string
// literals) and the pythonic tool-call parser (a model's Python call lists).
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace serval::tokenizer {

// `body` (what lies between a literal's quotes) with Python's escapes resolved: \\ \' \" \a \b
// \f \n \r \t \v, \ooo octal, \xHH, \uHHHH, \UHHHHHHHH (as UTF-8), a backslash-newline dropped,
// an unknown escape kept as written. Other bytes pass through. nullopt for a malformed \x, \u
// or \U escape, or a code point UTF-8 cannot hold (a surrogate, or past U+10FFFF).
std::optional<std::string> python_unescape(std::string_view body);

}  // namespace serval::tokenizer
