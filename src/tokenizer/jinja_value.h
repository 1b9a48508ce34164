// Jinja runtime values: Python-like None/bool/int/float/str/list/tuple/dict, Undefined,
// namespace objects and callables, with Python's truthiness, equality, str() and repr().
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace serval::tokenizer::jinja {

class Value;
using ValueList = std::vector<Value>;

// Deepest nesting of lists, tuples, dicts and namespaces a value may have. str(), tojson and
// comparisons recurse through values; a template that nests them in a loop (`set ns.a =
// [ns.a]`) is refused at the level past this instead of overflowing the stack. A namespace
// never holds a namespace (directly or inside a container: Value::check_namespace_content), so
// no value refers to itself and a container holding a namespace is at most twice this deep.
inline constexpr int kMaxValueDepth = 128;

// Insertion-ordered string-keyed mapping (Python dict with str keys). Lookup is linear:
// template values are small.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

// Arguments of a call: positional then keyword, in source order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* kwarg(const std::string& name) const;
};

using Function = std::function<Value(const CallArgs&)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kTuple,
    kDict,
    kNamespace,
    kFunction
  };

  Value() = default;  // Undefined
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(ValueList items);
  static Value tuple(ValueList items);
  static Value dict(ValueDict d);
  // A namespace() object: a mutable attribute bag shared by every copy of the Value.
  static Value make_namespace(ValueDict d);
  // `name` is shown in errors and by str().
  static Value function(std::string name, Function fn);
  static Value from_json(const nlohmann::ordered_json& j);
  // Throws InvalidArgument unless `v` may be stored in a namespace: no namespace in it, and
  // shallow enough to stay within kMaxValueDepth there.
  static void check_namespace_content(const Value& v);

  Kind kind() const { return kind_; }
  // Nesting levels: 0 for scalars, 1 + the deepest element for containers (a namespace counts
  // its content when it was made).
  int depth() const { return depth_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python numbers.Number: bool, int, float.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  bool is_sequence_like() const { return is_list() || is_tuple(); }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  // int, bool or float as double.
  double as_double() const;
  const std::string& as_string() const { return s_; }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  ValueDict& namespace_dict() const { return *dict_; }
  const Function& as_function() const { return *fn_; }
  const std::string& function_name() const { return s_; }

  bool truthy() const;
  // Python str(): "None", "True", "1.0", "[1, 'a']"; Undefined prints "".
  std::string str() const;
  // Python repr(): strings quoted like Python.
  std::string repr() const;
  // Python type name for error messages: "str", "int", "list", "undefined", ...
  std::string type_name() const;
  // JSON for tojson; throws InvalidArgument for Undefined, namespaces and functions.
  nlohmann::ordered_json to_json() const;

 private:
  Kind kind_ = Kind::kUndefined;
  int depth_ = 0;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<const Function> fn_;
};

// The work budget of one render: loop iterations and the elements that walks visit (str, repr,
// tojson, comparisons, iteration copies, dict lookups) each cost units. Values may share
// sub-lists ([[0] * 10**5] * 10**5 is cheap to build), so sizes alone do not bound the work:
// printing that list looped for minutes. A RenderBudget in scope (jinja::render makes one)
// makes spend() throw InvalidArgument once `units` are used; without one spend() is free.
class RenderBudget {
 public:
  explicit RenderBudget(int64_t units);
  ~RenderBudget();
  RenderBudget(const RenderBudget&) = delete;
  RenderBudget& operator=(const RenderBudget&) = delete;

 private:
  friend void spend(int64_t units);
  RenderBudget* previous_;
  int64_t left_;
};
void spend(int64_t units);

// Python ==: numbers compare by value across int/float/bool, containers deeply.
bool values_equal(const Value& a, const Value& b);
// Python <: numbers, strings (code point order), lists/tuples lexicographically;
// throws InvalidArgument naming both types otherwise.
bool values_less(const Value& a, const Value& b);
// Python repr of a str.
std::string python_string_repr(const std::string& s);

}  // namespace serval::tokenizer::jinja
