// Jinja lexer, following jinja2/lexer.py's rules for text, tags and whitespace control.
#include "tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "tokenizer/jinja_unicode.h"
#include "tokenizer/python_escapes.h"

namespace serval::tokenizer::jinja {
namespace {

[[noreturn]] void syntax_error(int line, const std::string& what) {
  throw LoadError("chat template syntax error at line " + std::to_string(line) + ": " + what);
}

// Python str.rstrip() on UTF-8: drops trailing Unicode whitespace.
std::string py_rstrip(const std::string& s) {
  std::u32string u = utf8_decode(s);
  size_t n = u.size();
  while (n > 0 && is_py_space(u[n - 1])) --n;
  if (n == u.size()) return s;
  u.resize(n);
  return utf8_encode(u);
}

// Length of the Unicode whitespace run at src[pos] (Python's \s*).
size_t whitespace_run(const std::string& src, size_t pos) {
  size_t p = pos;
  while (p < src.size()) {
    const auto c = static_cast<unsigned char>(src[p]);
    if (c < 0x80) {
      if (!is_py_space(c)) break;
      ++p;
      continue;
    }
    // Decode one multi-byte code point.
    size_t len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (p + len > src.size()) break;
    std::u32string u = utf8_decode(src.substr(p, len));
    if (u.size() != 1 || !is_py_space(u[0])) break;
    p += len;
  }
  return p - pos;
}

// Python's unicode-escape decoding of a string literal body (non-ASCII passes through).
std::string unescape(const std::string& body, int line) {
  std::optional<std::string> out = python_unescape(body);
  if (!out) syntax_error(line, "invalid \\x/\\u/\\U escape in string literal");
  return std::move(*out);
}

bool is_name_start(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// Matches Jinja's (\d+_)*\d+ at p; returns its end or p when absent.
size_t match_digits(const std::string& s, size_t p) {
  size_t q = p;
  while (q < s.size() && is_digit(s[q])) {
    while (q < s.size() && is_digit(s[q])) ++q;
    if (q + 1 < s.size() && s[q] == '_' && is_digit(s[q + 1])) ++q;
  }
  return q;
}

class Lexer {
 public:
  Lexer(const std::string& source, const LexerOptions& options) : opt_(options) {
    // Normalize newlines to \n and drop one trailing newline (keep_trailing_newline=False).
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t idx = pos;
      char kind = 0;
      while ((idx = src_.find('{', idx)) != std::string::npos) {
        if (idx + 1 < src_.size() && std::strchr("{%#", src_[idx + 1]) && src_[idx + 1] != 0) {
          kind = src_[idx + 1];
          break;
        }
        ++idx;
      }
      if (kind == 0) {
        emit_data(src_.substr(pos));
        break;
      }
      std::string text = src_.substr(pos, idx - pos);
      size_t p = idx + 2;
      char sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) sign = src_[p++];
      if (sign == '-') {
        text = py_rstrip(text);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) &&
            text.find_first_not_of(" \t", l_pos) == std::string::npos)
          text.resize(l_pos);
      }
      const int tag_line = line_ + count_newlines(pos, idx);
      emit_data(text);
      line_ = tag_line;
      if (kind == '#') {
        pos = lex_comment(p);
      } else if (kind == '%' && is_raw_begin(p)) {
        pos = lex_raw(p);
      } else {
        pos = lex_tag(p, kind == '%');
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({TokenType::kEnd, "", line_});
    return std::move(tokens_);
  }

 private:
  int count_newlines(size_t from, size_t to) const {
    return static_cast<int>(std::count(src_.begin() + from, src_.begin() + to, '\n'));
  }

  void emit_data(const std::string& text) {
    if (!text.empty()) tokens_.push_back({TokenType::kData, text, line_});
    line_ += static_cast<int>(std::count(text.begin(), text.end(), '\n'));
  }

  // Consumes the tail of a block-like tag end at `end` (position of "%}" or "#}"): `-` strips
  // following whitespace, `+` keeps it, otherwise trim_blocks drops one newline.
  size_t finish_block_end(size_t end, char sign) {
    size_t pos = end + 2;
    if (sign == '-') {
      pos += whitespace_run(src_, pos);
    } else if (sign != '+' && opt_.trim_blocks && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t lex_comment(size_t p) {
    const size_t end = src_.find("#}", p);
    if (end == std::string::npos) syntax_error(line_, "unterminated comment '{#'");
    char sign = 0;
    if (end > p && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    const size_t next = finish_block_end(end, sign);
    line_ += count_newlines(p, next);
    return next;
  }

  bool is_raw_begin(size_t p) const {
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0 || (p + 3 < src_.size() && is_name_char(src_[p + 3])))
      return false;
    p += 3;
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  // {% raw %}...{% endraw %}: the body is literal text.
  size_t lex_raw(size_t p) {
    size_t close = src_.find("%}", p);
    const char open_sign = src_[close - 1] == '-' ? '-' : 0;
    size_t body = close + 2;
    if (open_sign == '-') body += whitespace_run(src_, body);
    // Find "{%[-+]?\s*endraw\s*[-+]?%}".
    size_t search = body;
    while (true) {
      const size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) syntax_error(line_, "missing '{% endraw %}'");
      size_t q = tag + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) sign = src_[q++];
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) {
        search = tag + 2;
        continue;
      }
      std::string text = src_.substr(body, tag - body);
      if (sign == '-') text = py_rstrip(text);
      line_ += count_newlines(p, body);
      emit_data(text);
      const size_t next = finish_block_end(q, end_sign);
      line_ += count_newlines(tag, next);
      return next;
    }
  }

  // Tokenizes the inside of {{ }} or {% %} starting at p; returns the position after the end.
  size_t lex_tag(size_t p, bool block) {
    tokens_.push_back({block ? TokenType::kBlockBegin : TokenType::kVariableBegin, "", line_});
    const int open_line = line_;
    std::vector<char> brackets;
    while (true) {
      if (p >= src_.size())
        syntax_error(open_line, std::string("unexpected end of template, expected '") +
                                    (block ? "%}" : "}}") + "'");
      const char c = src_[p];
      if (brackets.empty()) {
        const char* close = block ? "%}" : "}}";
        char sign = 0;
        size_t end = std::string::npos;
        if ((c == '-' || (block && c == '+')) && src_.compare(p + 1, 2, close) == 0) {
          sign = c;
          end = p + 1;
        } else if (src_.compare(p, 2, close) == 0) {
          end = p;
        }
        if (end != std::string::npos) {
          tokens_.push_back({block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "", line_});
          size_t next;
          if (block) {
            next = finish_block_end(end, sign);
          } else {
            next = end + 2;
            if (sign == '-') next += whitespace_run(src_, next);
          }
          line_ += count_newlines(p, next);
          return next;
        }
      }
      if (std::isspace(static_cast<unsigned char>(c))) {
        if (c == '\n') ++line_;
        ++p;
        continue;
      }
      if (is_name_start(c)) {
        size_t q = p;
        while (q < src_.size() && is_name_char(src_[q])) ++q;
        tokens_.push_back({TokenType::kName, src_.substr(p, q - p), line_});
        p = q;
        continue;
      }
      if (is_digit(c)) {
        p = lex_number(p);
        continue;
      }
      if (c == '\'' || c == '"') {
        size_t q = p + 1;
        while (q < src_.size() && src_[q] != c) q += src_[q] == '\\' ? 2 : 1;
        if (q >= src_.size()) syntax_error(line_, "unterminated string literal");
        const std::string body = src_.substr(p + 1, q - p - 1);
        tokens_.push_back({TokenType::kString, unescape(body, line_), line_});
        line_ += static_cast<int>(std::count(body.begin(), body.end(), '\n'));
        p = q + 1;
        continue;
      }
      static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                   "/",  "%",  "~",  "<",  ">",  "=",  ".", ":", "|",
                                   ",",  ";",  "(",  ")",  "[",  "]",  "{", "}"};
      bool matched = false;
      for (const char* op : kOps) {
        const size_t n = std::strlen(op);
        if (src_.compare(p, n, op) != 0) continue;
        if (n == 1 && std::strchr("([{", op[0])) brackets.push_back(op[0]);
        if (n == 1 && std::strchr(")]}", op[0])) {
          const char want = op[0] == ')' ? '(' : op[0] == ']' ? '[' : '{';
          if (brackets.empty() || brackets.back() != want)
            syntax_error(line_, std::string("unexpected '") + op[0] + "'");
          brackets.pop_back();
        }
        tokens_.push_back({TokenType::kOperator, op, line_});
        p += n;
        matched = true;
        break;
      }
      if (!matched) syntax_error(line_, std::string("unexpected character '") + c + "'");
    }
  }

  size_t lex_number(size_t p) {
    const size_t int_end = match_digits(src_, p);
    size_t q = int_end;
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && is_digit(src_[q + 1])) {
      q = match_digits(src_, q + 1);
      is_float = true;
    }
    if (q < src_.size() && src_[q] == 'e') {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      const size_t e_end = match_digits(src_, r);
      if (e_end > r) {
        q = e_end;
        is_float = true;
      }
    }
    std::string text = src_.substr(p, q - p);
    text.erase(std::remove(text.begin(), text.end(), '_'), text.end());
    tokens_.push_back({is_float ? TokenType::kFloat : TokenType::kInteger, text, line_});
    return q;
  }

  std::string src_;
  LexerOptions opt_;
  std::vector<Token> tokens_;
  int line_ = 1;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source, const LexerOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace serval::tokenizer::jinja
