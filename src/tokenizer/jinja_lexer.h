// Jinja lexer: splits template source into text and tag tokens with Jinja2's whitespace rules
// (trim_blocks, lstrip_blocks, `-`/`+` modifiers, one trailing newline dropped).
#pragma once
#include <string>
#include <vector>

namespace serval::tokenizer::jinja {

enum class TokenType {
  kData,           // literal template text (value = the text)
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifier or keyword (value = the name)
  kString,         // string literal (value = unescaped contents)
  kInteger,        // value = digits without underscores
  kFloat,          // value = literal text without underscores
  kOperator,       // value = the operator: + - * / // % ** ~ == != < <= > >= = . : | , ( ) [ ] { }
  kEnd,            // end of input
};

struct Token {
  TokenType type;
  std::string value;
  int line;  // 1-based line of the token's first character
};

struct LexerOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws LoadError("line N: ...") on an unterminated tag, comment or string.
std::vector<Token> tokenize(const std::string& source, const LexerOptions& options = {});

}  // namespace serval::tokenizer::jinja
