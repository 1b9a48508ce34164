// The pythonic tool-call format (tool_call_parser.h): a Python list of calls with keyword
// arguments, [get_weather(city="Paris", days=2), now()], read by a small parser of Python's
// literal syntax (what ast.literal_eval accepts, less sets, complex numbers and bytes):
//   strings in ' or " with Python's escapes (adjacent ones concatenated), ints, floats, True,
//   False, None, lists, tuples (as lists), dicts (keys as json.dumps writes them).
// The arguments become a JSON object in the order written. Anything else (positional arguments,
// a repeated keyword, an expression, a list cut short) is not calls: the text stays content.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>

#include "server/tool_call_parser.h"
#include "tokenizer/python_escapes.h"

namespace serval::server {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr int kMaxDepth = 64;  // nesting of lists, tuples and dicts: deeper is refused

bool is_ident_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_ident_char(char c) {
  return is_ident_start(c) || (c >= '0' && c <= '9');
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// A recursive-descent reader over `text`; every method returns nullopt (or false) when the text
// there is not what it reads, and the caller then gives up on the whole text.
class PythonLiterals {
 public:
  explicit PythonLiterals(std::string_view text) : text_(text) {}

  // [call, call, ...] with an optional trailing comma, then only spaces.
  std::optional<std::vector<ToolCall>> call_list() {
    if (!eat('[')) return std::nullopt;
    std::vector<ToolCall> calls;
    while (!eat(']')) {
      std::optional<ToolCall> call = this->call();
      if (!call) return std::nullopt;
      calls.push_back(std::move(*call));
      if (!eat(',') && !peek(']')) return std::nullopt;
    }
    skip_spaces();
    if (at_ != text_.size() || calls.empty()) return std::nullopt;
    return calls;
  }

  // The calls a stream's text so far shows whole, in order: those read before the text ends or
  // stops being a call list.
  std::vector<ToolCall> leading_calls() {
    std::vector<ToolCall> calls;
    if (!eat('[')) return calls;
    while (!eat(']')) {
      std::optional<ToolCall> call = this->call();
      if (!call) break;
      calls.push_back(std::move(*call));
      if (!eat(',') && !peek(']')) break;
    }
    return calls;
  }

 private:
  // name(key=value, ...)
  std::optional<ToolCall> call() {
    std::optional<std::string> name = identifier();
    if (!name || !eat('(')) return std::nullopt;
    OrderedJson args = OrderedJson::object();
    std::set<std::string> seen;
    while (!eat(')')) {
      std::optional<std::string> key = identifier();
      if (!key || !eat('=') || !seen.insert(*key).second) return std::nullopt;
      std::optional<OrderedJson> v = value(0);
      if (!v) return std::nullopt;
      args[*key] = std::move(*v);
      if (!eat(',') && !peek(')')) return std::nullopt;
    }
    try {
      return ToolCall{std::move(*name), args.dump()};
    } catch (const nlohmann::json::exception&) {
      return std::nullopt;  // a string that is not UTF-8
    }
  }

  std::optional<OrderedJson> value(int depth) {
    if (depth > kMaxDepth) return std::nullopt;
    skip_spaces();
    if (at_ == text_.size()) return std::nullopt;
    const char c = text_[at_];
    if (c == '"' || c == '\'') return strings();
    if (c == '[') return sequence(']', depth);
    if (c == '(') return tuple(depth);
    if (c == '{') return dict(depth);
    if (is_digit(c) || c == '-' || c == '+' || c == '.') return number();
    std::optional<std::string> word = identifier();
    if (word == "True") return OrderedJson(true);
    if (word == "False") return OrderedJson(false);
    if (word == "None") return OrderedJson(nullptr);
    return std::nullopt;
  }

  // Items up to `close` (the opening bracket at at_), trailing comma allowed (and reported).
  std::optional<OrderedJson> sequence(char close, int depth, bool* trailing_comma = nullptr) {
    ++at_;
    OrderedJson items = OrderedJson::array();
    bool comma = false;
    while (!eat(close)) {
      std::optional<OrderedJson> v = value(depth + 1);
      if (!v) return std::nullopt;
      items.push_back(std::move(*v));
      comma = eat(',');
      if (!comma && !peek(close)) return std::nullopt;
    }
    if (trailing_comma) *trailing_comma = comma;
    return items;
  }

  // (x) is x; (), (x,) and (x, y) are tuples, written as lists.
  std::optional<OrderedJson> tuple(int depth) {
    bool trailing_comma = false;
    std::optional<OrderedJson> items = sequence(')', depth, &trailing_comma);
    if (!items || items->size() != 1 || trailing_comma) return items;
    return (*items)[0];
  }

  std::optional<OrderedJson> dict(int depth) {
    ++at_;
    OrderedJson out = OrderedJson::object();
    while (!eat('}')) {
      std::optional<OrderedJson> key = value(depth + 1);
      if (!key || key->is_array() || key->is_object() || !eat(':')) return std::nullopt;
      std::optional<OrderedJson> v = value(depth + 1);
      if (!v) return std::nullopt;
      // json.dumps' keys: strings as they are, others as their JSON text (1 → "1", None → "null").
      out[key->is_string() ? key->get<std::string>() : key->dump()] = std::move(*v);
      if (!eat(',') && !peek('}')) return std::nullopt;
    }
    return out;
  }

  // One or more adjacent string literals, concatenated.
  std::optional<OrderedJson> strings() {
    std::string out;
    do {
      if (!string_literal(out)) return std::nullopt;
      skip_spaces();
    } while (at_ < text_.size() && (text_[at_] == '"' || text_[at_] == '\''));
    return OrderedJson(std::move(out));
  }

  // A '…' or "…" literal at at_ (not triple-quoted, on one line but for backslash-newlines),
  // appended to out with Python's escapes resolved.
  bool string_literal(std::string& out) {
    const char quote = text_[at_++];
    const size_t begin = at_;
    while (at_ < text_.size() && text_[at_] != quote) {
      if (text_[at_] == '\n') return false;
      at_ += text_[at_] == '\\' ? 2 : 1;
    }
    if (at_ >= text_.size()) return false;
    std::optional<std::string> body = tokenizer::python_unescape(text_.substr(begin, at_ - begin));
    ++at_;  // the closing quote
    if (!body) return false;
    out += *body;
    return true;
  }

  // [+-]digits[.digits][e[+-]digits], also "1." and ".5"; ints stay ints when they fit 64 bits.
  std::optional<OrderedJson> number() {
    std::string digits;
    bool negative = false;
    while (at_ < text_.size() && (text_[at_] == '-' || text_[at_] == '+')) {
      negative ^= text_[at_++] == '-';
      skip_spaces();
    }
    bool is_float = false, any_digit = false;
    while (at_ < text_.size()) {
      const char c = text_[at_];
      if (is_digit(c)) {
        any_digit = true;
      } else if (c == '_' && any_digit) {
        ++at_;
        continue;  // 1_000
      } else if (c == '.' || c == 'e' || c == 'E') {
        is_float = true;
        if ((c == 'e' || c == 'E') && at_ + 1 < text_.size() &&
            (text_[at_ + 1] == '-' || text_[at_ + 1] == '+')) {
          digits += c;
          ++at_;
        }
      } else {
        break;
      }
      digits += text_[at_++];
    }
    if (!any_digit) return std::nullopt;
    if (!is_float) {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
      if (ec == std::errc() && end == digits.data() + digits.size())
        return OrderedJson(negative ? -v : v);
    }
    char* end = nullptr;
    const double v = std::strtod(digits.c_str(), &end);
    if (end != digits.c_str() + digits.size() || !std::isfinite(v)) return std::nullopt;
    return OrderedJson(negative ? -v : v);
  }

  std::optional<std::string> identifier() {
    skip_spaces();
    if (at_ == text_.size() || !is_ident_start(text_[at_])) return std::nullopt;
    const size_t begin = at_;
    while (at_ < text_.size() && is_ident_char(text_[at_])) ++at_;
    return std::string(text_.substr(begin, at_ - begin));
  }

  void skip_spaces() { at_ = skip_reply_spaces(text_, at_); }
  bool peek(char c) {
    skip_spaces();
    return at_ < text_.size() && text_[at_] == c;
  }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++at_;
    return true;
  }

  std::string_view text_;
  size_t at_ = 0;
};

// The list of calls in a reply: inside <|python_start|> ... <|python_end|> when it starts so.
std::string_view pythonic_body(std::string_view text) {
  const size_t first = skip_reply_spaces(text, 0);
  if (!text.substr(first).starts_with(kPythonStart)) return text;
  std::string_view body = text.substr(first + kPythonStart.size());
  const size_t last = body.find_last_not_of(kReplySpaces);
  if (last != std::string_view::npos && body.substr(0, last + 1).ends_with(kPythonEnd))
    body = body.substr(0, last + 1 - kPythonEnd.size());
  return body;
}

}  // namespace

ParsedToolCalls parse_pythonic_tool_calls(std::string_view text) {
  std::optional<std::vector<ToolCall>> calls = PythonLiterals(pythonic_body(text)).call_list();
  if (!calls) return {std::string(text), {}};
  return {"", std::move(*calls)};
}

std::vector<ToolCall> streamed_pythonic_tool_calls(std::string_view text) {
  return PythonLiterals(pythonic_body(text)).leading_calls();
}

}  // namespace serval::server
