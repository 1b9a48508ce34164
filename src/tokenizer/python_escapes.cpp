#include "tokenizer/python_escapes.h"

#include "tokenizer/jinja_unicode.h"

namespace serval::tokenizer {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool encodable(char32_t c) {
  return c <= 0x10FFFF && (c < 0xD800 || c > 0xDFFF);
}

}  // namespace

std::optional<std::string> python_unescape(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    const char e = body[++i];
    // \x, \u, \U: exactly `digits` hex digits.
    const auto hex = [&](size_t digits) -> std::optional<char32_t> {
      if (body.size() - (i + 1) < digits) return std::nullopt;
      char32_t v = 0;
      for (size_t k = 0; k < digits; ++k) {
        const int h = hex_value(body[i + 1 + k]);
        if (h < 0) return std::nullopt;
        v = v * 16 + char32_t(h);
      }
      i += digits;
      return v;
    };
    std::optional<char32_t> code;
    switch (e) {
      case '\n':  // a line continuation
        continue;
      case '\\':
      case '\'':
      case '"':
        out += e;
        continue;
      case 'a':
        out += '\a';
        continue;
      case 'b':
        out += '\b';
        continue;
      case 'f':
        out += '\f';
        continue;
      case 'n':
        out += '\n';
        continue;
      case 'r':
        out += '\r';
        continue;
      case 't':
        out += '\t';
        continue;
      case 'v':
        out += '\v';
        continue;
      case 'x':
        code = hex(2);
        break;
      case 'u':
        code = hex(4);
        break;
      case 'U':
        code = hex(8);
        break;
      default:
        if (e < '0' || e > '7') {  // unknown: kept as written
          out += '\\';
          out += e;
          continue;
        }
        code = char32_t(e - '0');
        for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
             ++k)
          *code = *code * 8 + char32_t(body[++i] - '0');
    }
    if (!code || !encodable(*code)) return std::nullopt;
    out += jinja::utf8_encode(*code);
  }
  return out;
}

}  // namespace serval::tokenizer
