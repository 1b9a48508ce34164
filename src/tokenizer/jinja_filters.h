// Jinja built-in filters and tests (the subset chat templates use), with Jinja2's semantics.
#pragma once
#include <string>

#include "tokenizer/jinja_value.h"

namespace serval::tokenizer::jinja {

bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);
// `value | name(args)`. Throws InvalidArgument on bad arguments.
Value apply_filter(const std::string& name, const Value& value, const CallArgs& args);
// `value is name(args)`.
bool apply_test(const std::string& name, const Value& value, const CallArgs& args);

}  // namespace serval::tokenizer::jinja
