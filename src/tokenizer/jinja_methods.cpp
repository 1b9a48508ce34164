// Python methods callable from templates.
#include "tokenizer/jinja_methods.h"

#include "base/error.h"
#include "tokenizer/jinja_ops.h"
#include "tokenizer/jinja_unicode.h"

namespace serval::tokenizer::jinja {
namespace {

const std::string& need_string(const Value& v, const char* method) {
  if (!v.is_string())
    throw InvalidArgument(std::string(method) + "() argument must be str, not " + v.type_name());
  return v.as_string();
}

int64_t need_int(const Value& v, int64_t fallback) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (v.is_int()) return v.as_int();
  if (v.is_bool()) return v.as_bool();
  throw InvalidArgument("an integer is required, got " + v.type_name());
}

Value split(const std::string& s, const Value& sep_v, int64_t maxsplit, bool from_right) {
  ValueList parts;
  if (sep_v.is_undefined() || sep_v.is_none()) {
    // Whitespace split: runs of whitespace separate, empty strings dropped.
    const std::u32string u = utf8_decode(s);
    std::vector<std::pair<size_t, size_t>> words;
    size_t i = 0;
    while (i < u.size()) {
      while (i < u.size() && is_py_space(u[i])) ++i;
      if (i == u.size()) break;
      size_t j = i;
      while (j < u.size() && !is_py_space(u[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit + 1) {
      // Merge the words beyond maxsplit into one (keeping inner whitespace).
      if (from_right) {
        const size_t keep = words.size() - static_cast<size_t>(maxsplit);
        words[keep - 1].first = words[0].first;
        words.erase(words.begin(), words.begin() + static_cast<long>(keep) - 1);
      } else {
        words[static_cast<size_t>(maxsplit)].second = u.size();
        size_t end = u.size();
        while (end > 0 && is_py_space(u[end - 1])) --end;
        words[static_cast<size_t>(maxsplit)].second = end;
        words.resize(static_cast<size_t>(maxsplit) + 1);
      }
    }
    for (auto [a, b] : words) parts.push_back(Value::string(utf8_encode(u.substr(a, b - a))));
    return Value::list(parts);
  }
  const std::string& sep = need_string(sep_v, "split");
  if (sep.empty()) throw InvalidArgument("empty separator");
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t start = 0;
    while (true) {
      const size_t at = (maxsplit < 0 || static_cast<int64_t>(pieces.size()) < maxsplit)
                            ? s.find(sep, start)
                            : std::string::npos;
      if (at == std::string::npos) {
        pieces.push_back(s.substr(start));
        break;
      }
      pieces.push_back(s.substr(start, at - start));
      start = at + sep.size();
    }
  } else {
    size_t end = s.size();
    while (true) {
      size_t at = std::string::npos;
      if ((maxsplit < 0 || static_cast<int64_t>(pieces.size()) < maxsplit) && end >= sep.size())
        at = s.rfind(sep, end - sep.size());
      if (at == std::string::npos) {
        pieces.insert(pieces.begin(), s.substr(0, end));
        break;
      }
      pieces.insert(pieces.begin(), s.substr(at + sep.size(), end - at - sep.size()));
      end = at;
    }
  }
  for (auto& p : pieces) parts.push_back(Value::string(std::move(p)));
  return Value::list(parts);
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0
                  : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_sequence_like()) {
    for (const auto& a : affix.as_list())
      if (one(need_string(a, prefix ? "startswith" : "endswith"))) return true;
    return false;
  }
  return one(need_string(affix, prefix ? "startswith" : "endswith"));
}

int64_t count_sub(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(utf8_length(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

// Byte offset -> code point offset.
int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8_length(s.substr(0, byte_pos)));
}

template <typename Pred>
Value all_chars(const std::string& s, Pred pred) {
  const std::u32string u = utf8_decode(s);
  if (u.empty()) return Value::boolean(false);
  for (char32_t c : u)
    if (!pred(c)) return Value::boolean(false);
  return Value::boolean(true);
}

Value string_method(const std::string& s, const std::string& name, const CallArgs& a) {
  if (name == "strip") return Value::string(py_strip(s, arg(a, 0, "chars"), true, true));
  if (name == "lstrip") return Value::string(py_strip(s, arg(a, 0, "chars"), true, false));
  if (name == "rstrip") return Value::string(py_strip(s, arg(a, 0, "chars"), false, true));
  if (name == "split" || name == "rsplit")
    return split(s, arg(a, 0, "sep"), need_int(arg(a, 1, "maxsplit"), -1), name == "rsplit");
  if (name == "startswith") return Value::boolean(affix_match(s, arg(a, 0, "prefix"), true));
  if (name == "endswith") return Value::boolean(affix_match(s, arg(a, 0, "suffix"), false));
  if (name == "upper") return Value::string(str_upper(s));
  if (name == "lower") return Value::string(str_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "replace")
    return Value::string(py_replace(s, need_string(arg(a, 0, "old"), "replace"),
                                    need_string(arg(a, 1, "new"), "replace"),
                                    need_int(arg(a, 2, "count"), -1)));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const std::string& sub = need_string(arg(a, 0, "sub"), name.c_str());
    const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name.find("index") != std::string::npos) throw InvalidArgument("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(cp_index(s, at));
  }
  if (name == "count") return Value::integer(count_sub(s, need_string(arg(a, 0, "x"), "count")));
  if (name == "join") {
    std::string out;
    bool first = true;
    for (const auto& v : iterate(arg(a, 0, "iterable"))) {
      if (!first) out += s;
      first = false;
      out += need_string(v, "join");
      check_text_size(out.size(), "join");
    }
    return Value::string(out);
  }
  if (name == "splitlines") {
    ValueList lines;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        lines.push_back(Value::string(s.substr(start, i - start)));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        start = i + 1;
      }
    }
    if (start < s.size()) lines.push_back(Value::string(s.substr(start)));
    return Value::list(lines);
  }
  if (name == "isdigit") return all_chars(s, [](char32_t c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return all_chars(s, is_alpha);
  if (name == "isspace") return all_chars(s, is_py_space);
  if (name == "islower" || name == "isupper") {
    const std::u32string u = utf8_decode(s);
    bool cased = false;
    for (char32_t c : u) {
      if (is_upper(c)) {
        if (name == "islower") return Value::boolean(false);
        cased = true;
      } else if (is_lower(c)) {
        if (name == "isupper") return Value::boolean(false);
        cased = true;
      }
    }
    return Value::boolean(cased);
  }
  throw InvalidArgument("str has no method '" + name + "'");
}

bool is_string_method(const std::string& name) {
  static const char* kNames[] = {
      "strip", "lstrip", "rstrip",     "split",   "rsplit",  "startswith", "endswith", "upper",
      "lower", "title",  "capitalize", "replace", "find",    "rfind",      "index",    "rindex",
      "count", "join",   "splitlines", "isdigit", "isalpha", "isspace",    "islower",  "isupper"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

}  // namespace

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  const std::u32string u = utf8_decode(s);
  std::u32string set;
  const bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) set = utf8_decode(need_string(chars, "strip"));
  auto strip_this = [&](char32_t c) {
    return whitespace ? is_py_space(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_this(u[b])) ++b;
  if (right)
    while (e > b && strip_this(u[e - 1])) --e;
  return utf8_encode(u.substr(b, e - b));
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  if (old.empty()) {
    // Python inserts `repl` before every code point and at the end.
    const std::u32string u = utf8_decode(s);
    std::string out;
    int64_t done = 0;
    for (char32_t c : u) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      out += utf8_encode(c);
      check_text_size(out.size(), "replace");
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += repl;
    check_text_size(out.size(), "replace");
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

std::string py_title(const std::string& s) {
  std::u32string u = utf8_decode(s);
  bool prev_cased = false;
  for (auto& c : u) {
    const bool cased = is_upper(c) || is_lower(c);
    c = prev_cased ? to_lower(c) : to_upper(c);
    prev_cased = cased;
  }
  return utf8_encode(u);
}

std::string py_capitalize(const std::string& s) {
  std::u32string u = utf8_decode(s);
  for (size_t i = 0; i < u.size(); ++i) u[i] = i == 0 ? to_upper(u[i]) : to_lower(u[i]);
  return utf8_encode(u);
}

ValueList dict_items(const Value& dict) {
  ValueList items;
  for (const auto& [k, v] : dict.as_dict().items)
    items.push_back(Value::tuple({Value::string(k), v}));
  return items;
}

Value bound_method(const Value& obj, const std::string& name) {
  if (obj.is_string() && is_string_method(name)) {
    const std::string s = obj.as_string();
    return Value::function("str." + name,
                           [s, name](const CallArgs& a) { return string_method(s, name, a); });
  }
  if (obj.is_dict()) {
    if (name == "items")
      return Value::function("dict.items",
                             [obj](const CallArgs&) { return Value::list(dict_items(obj)); });
    if (name == "keys")
      return Value::function("dict.keys",
                             [obj](const CallArgs&) { return Value::list(iterate(obj)); });
    if (name == "values")
      return Value::function("dict.values", [obj](const CallArgs&) {
        ValueList vals;
        for (const auto& [_, v] : obj.as_dict().items) vals.push_back(v);
        return Value::list(vals);
      });
    if (name == "get")
      return Value::function("dict.get", [obj](const CallArgs& a) {
        const Value key = arg(a, 0, "key");
        const Value* v = key.is_string() ? obj.as_dict().find(key.as_string()) : nullptr;
        return v ? *v : arg(a, 1, "default", Value::none());
      });
  }
  if (obj.is_sequence_like()) {
    if (name == "index" || name == "count")
      return Value::function("list." + name, [obj, name](const CallArgs& a) {
        const Value x = arg(a, 0, "x");
        int64_t n = 0;
        const ValueList& items = obj.as_list();
        for (size_t i = 0; i < items.size(); ++i) {
          if (!values_equal(items[i], x)) continue;
          if (name == "index") return Value::integer(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") throw InvalidArgument(x.repr() + " is not in list");
        return Value::integer(n);
      });
  }
  return Value();
}

}  // namespace serval::tokenizer::jinja
