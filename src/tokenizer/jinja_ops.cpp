// Jinja operators and access with Python semantics.
#include "tokenizer/jinja_ops.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <optional>

#include "base/error.h"
#include "tokenizer/jinja_methods.h"
#include "tokenizer/jinja_unicode.h"

namespace serval::tokenizer::jinja {
namespace {

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  throw InvalidArgument("unsupported operand type(s) for " + op + ": '" + a.type_name() +
                        "' and '" + b.type_name() + "'");
}

int64_t as_int(const Value& v) {
  return v.is_bool() ? (v.as_bool() ? 1 : 0) : v.as_int();
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// seq * n; n ≤ 0 or an empty seq give an empty result at once (no loop of n steps).
Value repeat(const Value& seq, int64_t n) {
  const int64_t size =
      seq.is_string() ? int64_t(seq.as_string().size()) : int64_t(seq.as_list().size());
  const int64_t limit = int64_t(seq.is_string() ? kMaxTextBytes : kMaxListItems);
  if (n <= 0 || size == 0) n = 0;
  if (n > 0 && n > limit / size)
    throw InvalidArgument("'*' would make " + std::to_string(size) + " x " + std::to_string(n) +
                          (seq.is_string() ? " bytes" : " items") + " (at most " +
                          std::to_string(limit) + ")");
  if (seq.is_string()) {
    std::string out;
    out.reserve(size_t(size * n));
    for (int64_t i = 0; i < n; ++i) out += seq.as_string();
    return Value::string(out);
  }
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
  return seq.is_tuple() ? Value::tuple(out) : Value::list(out);
}

}  // namespace

void integer_overflow(const std::string& op) {
  throw InvalidArgument("integer overflow in '" + op + "' (template integers are 64-bit)");
}

namespace {

void check_size(size_t size, size_t limit, const char* unit, const std::string& what) {
  if (size > limit)
    throw InvalidArgument(what + " would make " + std::to_string(size) + " " + unit + " (at most " +
                          std::to_string(limit) + ")");
}

}  // namespace

void check_text_size(size_t bytes, const std::string& what) {
  check_size(bytes, kMaxTextBytes, "bytes", what);
}

void check_list_size(size_t items, const std::string& what) {
  check_size(items, kMaxListItems, "items", what);
}

Value arg(const CallArgs& args, size_t index, const char* name, Value fallback) {
  if (index < args.positional.size()) return args.positional[index];
  if (const Value* v = args.kwarg(name)) return *v;
  return fallback;
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string sa = a.str();
    const std::string sb = b.str();
    check_text_size(sa.size() + sb.size(), "'~'");
    return Value::string(sa + sb);
  }
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  if (op == "+") {
    if (ints) {
      int64_t r;
      if (__builtin_add_overflow(as_int(a), as_int(b), &r)) integer_overflow("+");
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_text_size(a.as_string().size() + b.as_string().size(), "'+'");
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_sequence_like() && a.kind() == b.kind()) {
      check_list_size(a.as_list().size() + b.as_list().size(), "'+'");
      ValueList out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      return a.is_tuple() ? Value::tuple(out) : Value::list(out);
    }
    type_error("+", a, b);
  }
  if (op == "-") {
    if (ints) {
      int64_t r;
      if (__builtin_sub_overflow(as_int(a), as_int(b), &r)) integer_overflow("-");
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() - b.as_double());
    type_error("-", a, b);
  }
  if (op == "*") {
    if (ints) {
      int64_t r;
      if (__builtin_mul_overflow(as_int(a), as_int(b), &r)) integer_overflow("*");
      return Value::integer(r);
    }
    if (nums) return Value::number(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_sequence_like()) && (b.is_int() || b.is_bool()))
      return repeat(a, as_int(b));
    if ((b.is_string() || b.is_sequence_like()) && (a.is_int() || a.is_bool()))
      return repeat(b, as_int(a));
    type_error("*", a, b);
  }
  if (!nums) type_error(op, a, b);
  if (op == "/") {
    if (b.as_double() == 0) throw InvalidArgument("division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0) throw InvalidArgument("integer division or modulo by zero");
    if (ints) {
      if (as_int(a) == INT64_MIN && as_int(b) == -1) {  // the one quotient past int64
        if (op == "//") integer_overflow("//");
        return Value::integer(0);
      }
      const int64_t q = floor_div(as_int(a), as_int(b));
      return Value::integer(op == "//" ? q : as_int(a) - q * as_int(b));
    }
    // Python's float_floor_div / float_rem.
    const double x = a.as_double(), y = b.as_double();
    double mod = std::fmod(x, y);
    double div = (x - mod) / y;
    if (mod != 0 && ((y < 0) != (mod < 0))) {
      mod += y;
      div -= 1.0;
    }
    if (op == "%") return Value::number(mod);
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return Value::number(floordiv);
  }
  if (op == "**") {
    if (ints && as_int(b) >= 0) {  // by squaring: 64 steps at most
      int64_t r = 1, base = as_int(a);
      for (int64_t e = as_int(b); e > 0; e >>= 1) {
        if ((e & 1) && __builtin_mul_overflow(r, base, &r)) integer_overflow("**");
        if (e > 1 && __builtin_mul_overflow(base, base, &base)) integer_overflow("**");
      }
      return Value::integer(r);
    }
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  throw InvalidArgument("unknown operator " + op);
}

bool contains(const Value& haystack, const Value& needle) {
  if (haystack.is_undefined()) return false;
  if (haystack.is_string()) {
    if (!needle.is_string())
      throw InvalidArgument("'in <string>' requires string as left operand, not " +
                            needle.type_name());
    return haystack.as_string().find(needle.as_string()) != std::string::npos;
  }
  if (haystack.is_sequence_like()) {
    for (const auto& v : haystack.as_list())
      if (values_equal(v, needle)) return true;
    return false;
  }
  if (haystack.is_dict() || haystack.is_namespace()) {
    if (!needle.is_string()) return false;
    return haystack.as_dict().find(needle.as_string()) != nullptr;
  }
  throw InvalidArgument("argument of type '" + haystack.type_name() + "' is not iterable");
}

ValueList iterate(const Value& v) {
  if (v.is_sequence_like()) spend(int64_t(v.as_list().size()));
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return v.as_list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& [k, _] : v.as_dict().items) keys.push_back(Value::string(k));
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (char32_t c : utf8_decode(v.as_string())) chars.push_back(Value::string(utf8_encode(c)));
      return chars;
    }
    default:
      throw InvalidArgument("'" + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(utf8_length(v.as_string()));
    case Value::Kind::kList:
    case Value::Kind::kTuple:
      return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.as_dict().items.size());
    default:
      throw InvalidArgument("object of type '" + v.type_name() + "' has no len()");
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined() || obj.is_none()) return Value();
  Value method = bound_method(obj, name);
  if (!method.is_undefined()) return method;
  if (obj.is_dict() || obj.is_namespace()) {
    const Value* v = obj.as_dict().find(name);
    return v ? *v : Value();
  }
  return Value();
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_dict() || obj.is_namespace()) {
    if (key.is_string()) {
      if (const Value* v = obj.as_dict().find(key.as_string())) return *v;
      return get_attr(obj, key.as_string());
    }
    return Value();
  }
  if ((obj.is_sequence_like() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
    if (obj.is_string()) {
      const std::u32string u = utf8_decode(obj.as_string());
      const auto n = static_cast<int64_t>(u.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return Value::string(utf8_encode(u[static_cast<size_t>(i)]));
    }
    const auto n = static_cast<int64_t>(obj.as_list().size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return obj.as_list()[static_cast<size_t>(i)];
  }
  if (key.is_string()) return get_attr(obj, key.as_string());
  return Value();
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto bound = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (v.is_int()) return v.as_int();
    if (v.is_bool()) return v.as_bool() ? 1 : 0;
    throw InvalidArgument("slice indices must be integers or None");
  };
  const int64_t st = bound(step).value_or(1);
  if (st == 0) throw InvalidArgument("slice step cannot be zero");
  std::u32string chars;
  int64_t n;
  if (obj.is_string()) {
    chars = utf8_decode(obj.as_string());
    n = static_cast<int64_t>(chars.size());
  } else if (obj.is_sequence_like()) {
    n = static_cast<int64_t>(obj.as_list().size());
  } else if (obj.is_undefined()) {
    return Value();
  } else {
    throw InvalidArgument("'" + obj.type_name() + "' object is not subscriptable");
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t lo = adjust(bound(start), st < 0 ? n - 1 : 0);
  const int64_t hi = adjust(bound(stop), st < 0 ? -1 : n);
  std::vector<size_t> idx;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) idx.push_back(static_cast<size_t>(i));
  if (obj.is_string()) {
    std::u32string out;
    for (size_t i : idx) out += chars[i];
    return Value::string(utf8_encode(out));
  }
  ValueList out;
  for (size_t i : idx) out.push_back(obj.as_list()[i]);
  return obj.is_tuple() ? Value::tuple(out) : Value::list(out);
}

}  // namespace serval::tokenizer::jinja
