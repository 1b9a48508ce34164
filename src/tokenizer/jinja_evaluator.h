// Jinja evaluator: renders a parsed template against variables with Jinja2's scoping
// (loop bodies and macros get their own scope, `if` does not) and Undefined semantics.
#pragma once
#include <string>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_value.h"

namespace serval::tokenizer::jinja {

// Renders `body` with `globals` (template variables plus built-in functions) visible.
// Throws InvalidArgument("chat template error at line N: ...") on a render error, and with
// the message of raise_exception(msg) when the template raises.
std::string render(const Body& body, const ValueDict& globals);

// The built-in global functions: range, namespace, dict, raise_exception, strftime_now.
ValueDict builtin_globals();

}  // namespace serval::tokenizer::jinja
