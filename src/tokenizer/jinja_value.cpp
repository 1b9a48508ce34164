// Jinja runtime values.
#include "tokenizer/jinja_value.h"

#include <algorithm>

#include <cstdio>

#include "base/error.h"
#include "tokenizer/json_dumps.h"

namespace serval::tokenizer::jinja {

namespace {
thread_local RenderBudget* current_budget = nullptr;
}  // namespace

RenderBudget::RenderBudget(int64_t units) : previous_(current_budget), left_(units) {
  current_budget = this;
}
RenderBudget::~RenderBudget() {
  current_budget = previous_;
}

void spend(int64_t units) {
  RenderBudget* b = current_budget;
  if (b == nullptr) return;
  b->left_ -= units;
  if (b->left_ < 0)
    throw InvalidArgument(
        "the template does too much work for one render (loops, or walks over very large "
        "values)");
}

const Value* ValueDict::find(const std::string& key) const {
  spend(1 + int64_t(items.size()) / 8);
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value value) {
  for (auto& [k, v] : items)
    if (k == key) {
      v = std::move(value);
      return;
    }
  items.emplace_back(key, std::move(value));
}

const Value* CallArgs::kwarg(const std::string& name) const {
  for (const auto& [k, v] : keyword)
    if (k == name) return &v;
  return nullptr;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
namespace {

// 1 + the deepest of `depths`, refused past kMaxValueDepth.
template <typename Range, typename DepthOf>
int container_depth(const Range& items, DepthOf depth_of) {
  int deepest = 0;
  for (const auto& item : items) deepest = std::max(deepest, depth_of(item));
  if (deepest + 1 > kMaxValueDepth)
    throw InvalidArgument("a list, dict or namespace nested deeper than " +
                          std::to_string(kMaxValueDepth) + " levels");
  return deepest + 1;
}

bool holds_namespace(const Value& v) {
  if (v.is_namespace()) return true;
  if (v.is_sequence_like())
    for (const Value& item : v.as_list())
      if (holds_namespace(item)) return true;
  if (v.is_dict())
    for (const auto& kv : v.as_dict().items)
      if (holds_namespace(kv.second)) return true;
  return false;
}

}  // namespace

void Value::check_namespace_content(const Value& v) {
  if (holds_namespace(v))
    throw InvalidArgument("a namespace cannot hold a namespace (directly or in a list or dict)");
  if (v.depth() + 1 > kMaxValueDepth)
    throw InvalidArgument("a namespace attribute nested deeper than " +
                          std::to_string(kMaxValueDepth) + " levels");
}

Value Value::list(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.depth_ = container_depth(items, [](const Value& x) { return x.depth(); });
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}
Value Value::tuple(ValueList items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}
Value Value::dict(ValueDict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.depth_ = container_depth(d.items, [](const auto& kv) { return kv.second.depth(); });
  v.dict_ = std::make_shared<ValueDict>(std::move(d));
  return v;
}
Value Value::make_namespace(ValueDict d) {
  for (const auto& kv : d.items) check_namespace_content(kv.second);
  Value v = dict(std::move(d));
  v.kind_ = Kind::kNamespace;
  return v;
}
Value Value::function(std::string name, Function fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<const Function>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  using Type = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case Type::null:
    case Type::discarded:
    case Type::binary:
      return none();
    case Type::boolean:
      return boolean(j.get<bool>());
    case Type::number_integer:
      return integer(j.get<int64_t>());
    case Type::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case Type::number_float:
      return number(j.get<double>());
    case Type::string:
      return string(j.get<std::string>());
    case Type::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case Type::object: {
      ValueDict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(it.key(), from_json(*it));
      return dict(std::move(d));
    }
  }
  return none();
}

double Value::as_double() const {
  if (kind_ == Kind::kFloat) return f_;
  if (kind_ == Kind::kBool) return b_ ? 1 : 0;
  return static_cast<double>(i_);
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
    case Kind::kTuple:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->items.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(s[i + 1]) <= 0xa0 &&
               static_cast<unsigned char>(s[i + 1]) != 0xa0) {
      // U+0080..U+009F are not printable in Python: \x80 style.
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(s[i + 1]));
      out += buf;
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

namespace {
std::string join_repr(const ValueList& items, const char* open, const char* close, bool one_tuple) {
  std::string out = open;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    out += items[i].repr();
  }
  if (one_tuple && items.size() == 1) out += ",";
  return out + close;
}
}  // namespace

std::string Value::repr() const {
  spend(1);
  switch (kind_) {
    case Kind::kString:
      return python_string_repr(s_);
    case Kind::kList:
      return join_repr(*list_, "[", "]", false);
    case Kind::kTuple:
      return join_repr(*list_, "(", ")", true);
    case Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : dict_->items) {
        if (!first) out += ", ";
        first = false;
        out += python_string_repr(k) + ": " + v.repr();
      }
      return out + "}";
    }
    default:
      return str();
  }
}

std::string Value::str() const {
  spend(1);
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return python_float_repr(f_);
    case Kind::kString:
      return s_;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kDict:
      return repr();
    case Kind::kNamespace:
      return "<Namespace " + Value::dict(*dict_).repr() + ">";
    case Kind::kFunction:
      return "<function " + s_ + ">";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

nlohmann::ordered_json Value::to_json() const {
  spend(1);
  switch (kind_) {
    case Kind::kNone:
      return nullptr;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_;
    case Kind::kFloat:
      return f_;
    case Kind::kString:
      return s_;
    case Kind::kList:
    case Kind::kTuple: {
      auto arr = nlohmann::ordered_json::array();
      for (const auto& v : *list_) arr.push_back(v.to_json());
      return arr;
    }
    case Kind::kDict: {
      auto obj = nlohmann::ordered_json::object();
      for (const auto& [k, v] : dict_->items) obj[k] = v.to_json();
      return obj;
    }
    default:
      throw InvalidArgument("Object of type " + type_name() + " is not JSON serializable");
  }
}

bool values_equal(const Value& a, const Value& b) {
  spend(1);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return (a.is_bool() ? a.as_bool() : a.as_int()) == (b.is_bool() ? b.as_bool() : b.as_int());
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      const auto &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!values_equal(x[i], y[i])) return false;
      return true;
    }
    case Value::Kind::kDict: {
      const auto &x = a.as_dict(), &y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !values_equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.namespace_dict() == &b.namespace_dict();
    case Value::Kind::kFunction:
      return &a.as_function() == &b.as_function();
    default:
      return false;
  }
}

bool values_less(const Value& a, const Value& b) {
  spend(1);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return (a.is_bool() ? a.as_bool() : a.as_int()) < (b.is_bool() ? b.as_bool() : b.as_int());
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_sequence_like() && b.kind() == a.kind()) {
    const auto &x = a.as_list(), &y = b.as_list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (values_less(x[i], y[i])) return true;
      if (values_less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  throw InvalidArgument("'<' not supported between instances of '" + a.type_name() + "' and '" +
                        b.type_name() + "'");
}

}  // namespace serval::tokenizer::jinja
