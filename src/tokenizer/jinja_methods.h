// Python methods callable from templates: str (strip, split, startswith, replace, ...),
// dict (get, items, keys, values) and list (index, count).
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/jinja_value.h"

namespace serval::tokenizer::jinja {

// obj.name as a bound method, or Undefined when `obj` has no such method.
Value bound_method(const Value& obj, const std::string& name);

// Python str methods used by filters as well.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count);
std::string py_title(const std::string& s);       // str.title()
std::string py_capitalize(const std::string& s);  // str.capitalize()
ValueList dict_items(const Value& dict);          // list of (key, value) tuples

}  // namespace serval::tokenizer::jinja
