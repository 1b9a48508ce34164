// Code-point helpers for Jinja string operations: Python's str semantics on UTF-8 text.
#pragma once
#include <string>

namespace serval::tokenizer::jinja {

std::u32string utf8_decode(const std::string& s);
std::string utf8_encode(const std::u32string& s);
std::string utf8_encode(char32_t c);
// Python str.isspace() for one code point.
bool is_py_space(char32_t c);
// Python's \w (unicode): letters, digits, underscore.
bool is_word_char(char32_t c);
bool is_alpha(char32_t c);
bool is_upper(char32_t c);
bool is_lower(char32_t c);
char32_t to_upper(char32_t c);
char32_t to_lower(char32_t c);
std::string str_upper(const std::string& s);
std::string str_lower(const std::string& s);
// Number of code points.
size_t utf8_length(const std::string& s);

}  // namespace serval::tokenizer::jinja
