// Jinja built-in filters and tests.
#include "tokenizer/jinja_filters.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "base/error.h"
#include "tokenizer/jinja_methods.h"
#include "tokenizer/jinja_ops.h"
#include "tokenizer/jinja_unicode.h"
#include "tokenizer/json_dumps.h"

namespace serval::tokenizer::jinja {
namespace {

const std::set<std::string>& filter_names() {
  static const std::set<std::string> kNames = {
      "abs",        "capitalize", "count",    "d",       "default", "dictsort", "e",
      "escape",     "first",      "float",    "indent",  "int",     "items",    "join",
      "last",       "length",     "list",     "lower",   "map",     "max",      "min",
      "reject",     "rejectattr", "replace",  "reverse", "round",   "safe",     "select",
      "selectattr", "sort",       "string",   "sum",     "title",   "tojson",   "trim",
      "unique",     "upper",      "wordcount"};
  return kNames;
}

const std::set<std::string>& test_names() {
  static const std::set<std::string> kNames = {
      "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto",     "escaped",
      "even",    "false",    "filter",   "float",       "ge",       "greaterthan", "gt",
      "in",      "integer",  "iterable", "le",          "lessthan", "lower",       "lt",
      "mapping", "ne",       "none",     "number",      "odd",      "sameas",      "sequence",
      "string",  "test",     "true",     "undefined",   "upper",    "==",          "!=",
      "<",       "<=",       ">",        ">="};
  return kNames;
}

int64_t to_int(const Value& v) {
  return v.is_bool() ? v.as_bool() : v.as_int();
}

// Jinja's attribute path "a.b.0" lookup used by map/selectattr/sort/join.
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit))
      cur = get_item(cur, Value::integer(std::atoll(part.c_str())));
    else
      cur = get_item(cur, Value::string(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

// Remaining arguments after the first `skip` positional ones, for select/map dispatch.
CallArgs rest_args(const CallArgs& args, size_t skip) {
  CallArgs rest;
  for (size_t i = skip; i < args.positional.size(); ++i)
    rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

Value select_like(const Value& seq, const CallArgs& args, bool by_attr, bool keep_if) {
  std::string attr;
  size_t next = 0;
  if (by_attr) {
    const Value a = arg(args, 0, "attribute");
    if (!a.is_string()) throw InvalidArgument("selectattr/rejectattr need an attribute name");
    attr = a.as_string();
    next = 1;
  }
  std::string test;
  CallArgs test_args;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) throw InvalidArgument("test name must be a string");
    test = args.positional[next].as_string();
    if (!is_known_test(test)) throw InvalidArgument("unknown test '" + test + "'");
    test_args = rest_args(args, next + 1);
  }
  ValueList out;
  for (const auto& item : iterate(seq)) {
    const Value subject = by_attr ? attribute_path(item, attr) : item;
    const bool ok = test.empty() ? subject.truthy() : apply_test(test, subject, test_args);
    if (ok == keep_if) out.push_back(item);
  }
  return Value::list(out);
}

// Sort key comparison: case-insensitive for strings unless case_sensitive.
bool key_less(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string())
    return str_lower(a.as_string()) < str_lower(b.as_string());
  return values_less(a, b);
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python's round(x, ndigits) for floats: round-half-even on the exact binary value.
double py_round(double x, int64_t ndigits) {
  if (!std::isfinite(x)) return x;
  if (ndigits == 0) return std::nearbyint(x);
  if (ndigits > 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(ndigits, 300)), x);
    return std::strtod(buf, nullptr);
  }
  const double p = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / p) * p;
}

Value do_indent(const std::string& s, const CallArgs& args) {
  const Value w = arg(args, 0, "width", Value::integer(4));
  // Python: ' ' * width ('' for width ≤ 0).
  const int64_t width = w.is_string() ? 0 : std::max<int64_t>(to_int(w), 0);
  check_text_size(size_t(width), "indent width");
  const std::string ind = w.is_string() ? w.as_string() : std::string(size_t(width), ' ');
  const bool first = arg(args, 1, "first", Value::boolean(false)).truthy();
  const bool blank = arg(args, 2, "blank", Value::boolean(false)).truthy();
  // s += "\n"; lines = s.splitlines()
  const std::string text = s + "\n";
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n' || text[i] == '\r') {
      lines.push_back(text.substr(start, i - start));
      if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < text.size()) lines.push_back(text.substr(start));
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += '\n';
      if (!lines[i].empty()) rv += ind;
      rv += lines[i];
    }
  }
  return Value::string(first ? ind + rv : rv);
}

Value do_tojson(const Value& v, const CallArgs& args) {
  JsonDumpsOptions o;
  const Value indent = arg(args, 0, "indent", Value::none());
  if (!indent.is_none() && !indent.is_undefined()) {
    // Wider indents only make gigabytes of spaces (10^9 hung building them).
    constexpr int64_t kMaxIndent = 4096;
    const int64_t width = to_int(indent);
    if (width > kMaxIndent)
      throw InvalidArgument("tojson(indent=" + std::to_string(width) + "): at most " +
                            std::to_string(kMaxIndent));
    o.indent = static_cast<int>(std::max<int64_t>(width, 0));  // Python: " " * -5 == ""
  }
  o.ensure_ascii = arg(args, 100, "ensure_ascii", Value::boolean(false)).truthy();
  o.sort_keys = arg(args, 100, "sort_keys", Value::boolean(false)).truthy();
  if (args.kwarg("separators")) throw InvalidArgument("tojson(separators=...) is not supported");
  return Value::string(json_dumps(v.to_json(), o));
}

// Python int(d) for the int filter: NaN is a ValueError (Jinja returns the default), infinity
// an OverflowError, and a finite float past int64 our integers' limit (the cast was undefined:
// INT64_MIN came out).
Value float_to_int(double d, const Value& dflt) {
  if (std::isnan(d)) return dflt;
  if (std::isinf(d)) throw InvalidArgument("cannot convert float infinity to integer");
  if (!(d >= -0x1p63 && d < 0x1p63)) integer_overflow("int");
  return Value::integer(static_cast<int64_t>(d));
}

Value do_int(const Value& v, const CallArgs& args) {
  const Value dflt = arg(args, 0, "default", Value::integer(0));
  if (v.is_int()) return v;
  if (v.is_bool()) return Value::integer(v.as_bool());
  if (v.is_float()) return float_to_int(v.as_double(), dflt);
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), Value(), true, true);
    char* end = nullptr;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && *end == '\0') return Value::integer(i);
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0' && std::isfinite(d)) return float_to_int(d, dflt);
  }
  return dflt;
}

Value do_float(const Value& v, const CallArgs& args) {
  const Value dflt = arg(args, 0, "default", Value::number(0.0));
  if (v.is_number()) return Value::number(v.as_double());
  if (v.is_string()) {
    std::string s = py_strip(v.as_string(), Value(), true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::number(d);
  }
  return dflt;
}

Value do_sort(const Value& v, const CallArgs& args) {
  const bool reverse = arg(args, 0, "reverse", Value::boolean(false)).truthy();
  const bool cs = arg(args, 1, "case_sensitive", Value::boolean(false)).truthy();
  const Value attr = arg(args, 2, "attribute");
  ValueList items = iterate(v);
  auto key = [&](const Value& x) {
    return attr.is_string() ? attribute_path(x, attr.as_string()) : x;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? key_less(key(b), key(a), cs) : key_less(key(a), key(b), cs);
  });
  return Value::list(items);
}

Value do_dictsort(const Value& v, const CallArgs& args) {
  if (!v.is_dict()) throw InvalidArgument("dictsort needs a mapping, got " + v.type_name());
  const bool cs = arg(args, 0, "case_sensitive", Value::boolean(false)).truthy();
  const Value by = arg(args, 1, "by", Value::string("key"));
  const bool reverse = arg(args, 2, "reverse", Value::boolean(false)).truthy();
  const size_t pos = by.is_string() && by.as_string() == "value" ? 1 : 0;
  ValueList items = dict_items(v);
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const Value &ka = a.as_list()[pos], &kb = b.as_list()[pos];
    return reverse ? key_less(kb, ka, cs) : key_less(ka, kb, cs);
  });
  return Value::list(items);
}

Value do_minmax(const Value& v, const CallArgs& args, bool want_max) {
  const bool cs = arg(args, 0, "case_sensitive", Value::boolean(false)).truthy();
  const Value attr = arg(args, 1, "attribute");
  const ValueList items = iterate(v);
  if (items.empty()) return Value();
  auto key = [&](const Value& x) {
    return attr.is_string() ? attribute_path(x, attr.as_string()) : x;
  };
  const Value* best = &items[0];
  for (const auto& x : items) {
    if (want_max ? key_less(key(*best), key(x), cs) : key_less(key(x), key(*best), cs)) best = &x;
  }
  return *best;
}

}  // namespace

bool is_known_filter(const std::string& name) {
  return filter_names().count(name) > 0;
}
bool is_known_test(const std::string& name) {
  return test_names().count(name) > 0;
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args) {
  if (name == "length" || name == "count") return Value::integer(length(v));
  if (name == "tojson") return do_tojson(v, args);
  if (name == "trim") return Value::string(py_strip(v.str(), arg(args, 0, "chars"), true, true));
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (!v.is_dict()) throw InvalidArgument("items filter needs a mapping, got " + v.type_name());
    return Value::list(dict_items(v));
  }
  if (name == "selectattr" || name == "rejectattr")
    return select_like(v, args, true, name == "selectattr");
  if (name == "select" || name == "reject") return select_like(v, args, false, name == "select");
  if (name == "join") {
    const std::string sep = arg(args, 0, "d", Value::string("")).str();
    const Value attr = arg(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& item : iterate(v)) {
      if (!first) out += sep;
      first = false;
      out += (attr.is_string() ? attribute_path(item, attr.as_string()) : item).str();
      check_text_size(out.size(), "join");
    }
    return Value::string(out);
  }
  if (name == "upper") return Value::string(str_upper(v.str()));
  if (name == "lower") return Value::string(str_lower(v.str()));
  if (name == "first" || name == "last") {
    const ValueList items = iterate(v);
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "default" || name == "d") {
    const bool boolean = arg(args, 1, "boolean", Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy()))
      return arg(args, 0, "default_value", Value::string(""));
    return v;
  }
  if (name == "string") return Value::string(v.str());
  if (name == "int") return do_int(v, args);
  if (name == "float") return do_float(v, args);
  if (name == "list") return Value::list(iterate(v));
  if (name == "map") {
    const Value attr = args.kwarg("attribute") ? *args.kwarg("attribute") : Value();
    ValueList out;
    if (attr.is_string()) {
      const Value dflt = args.kwarg("default") ? *args.kwarg("default") : Value();
      for (const auto& item : iterate(v)) {
        Value x = attribute_path(item, attr.as_string());
        out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
      }
      return Value::list(out);
    }
    const Value f = arg(args, 0, "filter");
    if (!f.is_string() || !is_known_filter(f.as_string()))
      throw InvalidArgument("map needs attribute= or a known filter name");
    const CallArgs rest = rest_args(args, 1);
    for (const auto& item : iterate(v)) out.push_back(apply_filter(f.as_string(), item, rest));
    return Value::list(out);
  }
  if (name == "replace") {
    const Value count = arg(args, 2, "count", Value::none());
    return Value::string(py_replace(v.str(), arg(args, 0, "old").str(), arg(args, 1, "new").str(),
                                    count.is_none() ? -1 : to_int(count)));
  }
  if (name == "safe") return v.is_string() ? v : Value::string(v.str());
  if (name == "escape" || name == "e") return Value::string(html_escape(v.str()));
  if (name == "capitalize") return Value::string(py_capitalize(v.str()));
  if (name == "title") {
    // Jinja's do_title: words start after [-\s({\[<]+; each word is capitalized.
    const std::u32string u = utf8_decode(v.str());
    std::u32string out;
    bool word_start = true;
    for (char32_t c : u) {
      const bool sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_py_space(c);
      if (sep) {
        out += c;
        word_start = true;
      } else {
        out += word_start ? to_upper(c) : to_lower(c);
        word_start = false;
      }
    }
    return Value::string(utf8_encode(out));
  }
  if (name == "round") {
    const int64_t precision = to_int(arg(args, 0, "precision", Value::integer(0)));
    const std::string method = arg(args, 1, "method", Value::string("common")).str();
    if (!v.is_number()) throw InvalidArgument("round needs a number, got " + v.type_name());
    if (method == "common") {
      if (!v.is_float()) return Value::integer(to_int(v));
      return Value::number(py_round(v.as_double(), precision));
    }
    const double p = std::pow(10.0, static_cast<double>(precision));
    if (method == "floor") return Value::number(std::floor(v.as_double() * p) / p);
    if (method == "ceil") return Value::number(std::ceil(v.as_double() * p) / p);
    throw InvalidArgument("round method must be 'common', 'ceil' or 'floor'");
  }
  if (name == "abs") {
    if (v.is_float()) return Value::number(std::fabs(v.as_double()));
    if (v.is_int() || v.is_bool()) {
      if (to_int(v) == INT64_MIN) integer_overflow("abs");
      return Value::integer(std::llabs(to_int(v)));
    }
    throw InvalidArgument("bad operand type for abs(): '" + v.type_name() + "'");
  }
  if (name == "unique") {
    const bool cs = arg(args, 0, "case_sensitive", Value::boolean(false)).truthy();
    ValueList out;
    for (const auto& item : iterate(v)) {
      bool seen = false;
      for (const auto& o : out) {
        spend(1);
        if (!cs && item.is_string() && o.is_string())
          seen = str_lower(item.as_string()) == str_lower(o.as_string());
        else
          seen = values_equal(item, o);
        if (seen) break;
      }
      if (!seen) out.push_back(item);
    }
    return Value::list(out);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = utf8_decode(v.as_string());
      std::reverse(u.begin(), u.end());
      return Value::string(utf8_encode(u));
    }
    ValueList items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(items);
  }
  if (name == "sort") return do_sort(v, args);
  if (name == "dictsort") return do_dictsort(v, args);
  if (name == "indent") return do_indent(v.str(), args);
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : utf8_decode(v.str())) {
      const bool w = is_word_char(c);
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  if (name == "sum") {
    const Value attr = arg(args, 0, "attribute");
    Value total = arg(args, 1, "start", Value::integer(0));
    for (const auto& item : iterate(v))
      total =
          binary_op("+", total, attr.is_string() ? attribute_path(item, attr.as_string()) : item);
    return total;
  }
  if (name == "max" || name == "min") return do_minmax(v, args, name == "max");
  throw InvalidArgument("unknown filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& args) {
  const Value other = arg(args, 0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable")
    return v.is_undefined() || v.is_string() || v.is_sequence_like() || v.is_dict();
  if (name == "sequence")
    return v.is_undefined() || v.is_string() || v.is_sequence_like() || v.is_dict();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_function();
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) throw InvalidArgument(name + " test needs an integer");
    const int64_t i = to_int(v);
    return name == "odd" ? (i % 2 != 0) : (i % 2 == 0);
  }
  if (name == "divisibleby") {
    const int64_t d = to_int(other);
    if (d == 0) throw InvalidArgument("integer division or modulo by zero");
    return to_int(v) % d == 0;
  }
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas")
    return values_equal(v, other);
  if (name == "ne" || name == "!=") return !values_equal(v, other);
  if (name == "lt" || name == "lessthan" || name == "<") return values_less(v, other);
  if (name == "gt" || name == "greaterthan" || name == ">") return values_less(other, v);
  if (name == "le" || name == "<=") return !values_less(other, v);
  if (name == "ge" || name == ">=") return !values_less(v, other);
  if (name == "in") return contains(other, v);
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    CallArgs none;
    return apply_filter(name, v, none).as_string() == v.as_string();
  }
  if (name == "escaped") return false;
  if (name == "filter") return other.is_string() && is_known_filter(other.as_string());
  if (name == "test") return other.is_string() && is_known_test(other.as_string());
  throw InvalidArgument("unknown test '" + name + "'");
}

}  // namespace serval::tokenizer::jinja
