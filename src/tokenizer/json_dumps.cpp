// Python-compatible JSON and float formatting.
#include "tokenizer/json_dumps.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace serval::tokenizer {
namespace {

void append_hex4(std::string& out, unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "\\u%04x", v & 0xffffu);
  out += buf;
}

// Decodes one UTF-8 sequence at s[i]; returns the code point and advances i. Invalid bytes
// are returned as themselves (one byte), which json.dumps never sees in practice.
unsigned decode_utf8(const std::string& s, size_t& i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  int len = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    ++i;
    return b0;
  }
  unsigned cp = len == 1 ? b0 : len == 2 ? (b0 & 0x1f) : len == 3 ? (b0 & 0x0f) : (b0 & 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += len;
  return cp;
}

void dump(std::string& out, const nlohmann::ordered_json& v, const JsonDumpsOptions& o, int level) {
  using Type = nlohmann::ordered_json::value_t;
  const bool pretty = o.indent >= 0;
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(static_cast<size_t>(lvl) * o.indent, ' ');
  };
  switch (v.type()) {
    case Type::null:
    case Type::discarded:
      out += "null";
      return;
    case Type::boolean:
      out += v.get<bool>() ? "true" : "false";
      return;
    case Type::number_integer:
      out += std::to_string(v.get<int64_t>());
      return;
    case Type::number_unsigned:
      out += std::to_string(v.get<uint64_t>());
      return;
    case Type::number_float: {
      const double d = v.get<double>();
      if (std::isnan(d))
        out += "NaN";
      else if (std::isinf(d))
        out += d > 0 ? "Infinity" : "-Infinity";
      else
        out += python_float_repr(d);
      return;
    }
    case Type::string:
      append_json_string(out, v.get_ref<const std::string&>(), o.ensure_ascii);
      return;
    case Type::binary:
      out += "null";
      return;
    case Type::array: {
      if (v.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const auto& item : v) {
        if (!first) out += pretty ? "," : ", ";
        first = false;
        if (pretty) newline(level + 1);
        dump(out, item, o, level + 1);
      }
      if (pretty) newline(level);
      out += ']';
      return;
    }
    case Type::object: {
      if (v.empty()) {
        out += "{}";
        return;
      }
      std::vector<std::pair<const std::string*, const nlohmann::ordered_json*>> items;
      for (auto it = v.begin(); it != v.end(); ++it) items.emplace_back(&it.key(), &it.value());
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return *a.first < *b.first; });
      out += '{';
      bool first = true;
      for (const auto& [key, value] : items) {
        if (!first) out += pretty ? "," : ", ";
        first = false;
        if (pretty) newline(level + 1);
        append_json_string(out, *key, o.ensure_ascii);
        out += ": ";
        dump(out, *value, o, level + 1);
      }
      if (pretty) newline(level);
      out += '}';
      return;
    }
  }
}

}  // namespace

void append_json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        default:
          if (c < 0x20)
            append_hex4(out, c);
          else
            out += static_cast<char>(c);
      }
      continue;
    }
    const size_t start = i;
    const unsigned cp = decode_utf8(s, i);
    if (!ensure_ascii) {
      out.append(s, start, i - start);
    } else if (cp >= 0x10000) {
      const unsigned v = cp - 0x10000;
      append_hex4(out, 0xd800 + (v >> 10));
      append_hex4(out, 0xdc00 + (v & 0x3ff));
    } else {
      append_hex4(out, cp);
    }
  }
  out += '"';
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form: "-d.ddde+XX".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  const int exp10 = std::atoi(sci.c_str() + e_pos + 1);
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  // Python's repr: fixed notation when -4 <= exp10 < 16.
  if (exp10 >= -4 && exp10 < 16) {
    std::string out;
    if (exp10 < 0) {
      out = "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp10 + 1) {
      out = digits + std::string(static_cast<size_t>(exp10 + 1 - digits.size()), '0') + ".0";
    } else {
      out = digits.substr(0, exp10 + 1) + "." + digits.substr(exp10 + 1);
    }
    return sign + out;
  }
  std::string mant = digits.substr(0, 1);
  if (digits.size() > 1) mant.append(".").append(digits, 1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return sign + mant + ebuf;
}

std::string json_dumps(const nlohmann::ordered_json& value, const JsonDumpsOptions& options) {
  std::string out;
  dump(out, value, options, 0);
  return out;
}

}  // namespace serval::tokenizer
