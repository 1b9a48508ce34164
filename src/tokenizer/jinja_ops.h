// Jinja operators and access with Python semantics: arithmetic, `in`, iteration, attribute
// and item lookup (bound str/dict methods included), slices. Errors throw InvalidArgument
// without a line; the evaluator adds it.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/jinja_value.h"

namespace serval::tokenizer::jinja {

// Largest string (bytes) and list (items) one template operation may build. A chat template
// renders on every request: past these it is in error (a bug or an attack), not a multi-GB
// allocation.
inline constexpr size_t kMaxTextBytes = size_t(64) << 20;
inline constexpr size_t kMaxListItems = size_t(1) << 20;
// Throw InvalidArgument when a string of `bytes` (a list of `items`) would exceed kMaxTextBytes
// (kMaxListItems), naming `what` (e.g. "'~'").
void check_text_size(size_t bytes, const std::string& what);
void check_list_size(size_t items, const std::string& what);

// Integers are 64-bit (Python's are unbounded): a result past int64 is an error naming `op`,
// never a wrap-around, a hang (** looped `exponent` times) or a SIGFPE (INT64_MIN // -1).
[[noreturn]] void integer_overflow(const std::string& op);

// op in {+ - * / // % ** ~}.
Value binary_op(const std::string& op, const Value& a, const Value& b);
// Python `needle in haystack` (substring, list membership, dict key); Undefined is empty.
bool contains(const Value& haystack, const Value& needle);
// Items a for loop visits: list/tuple items, dict keys, string characters; Undefined -> none.
ValueList iterate(const Value& v);
// len(v); throws for objects without a length.
int64_t length(const Value& v);
// Jinja getattr: obj.name — a method of str/dict/list if one is called `name`, else the key.
Value get_attr(const Value& obj, const std::string& name);
// Jinja getitem: obj[key] — key/index lookup, falling back to get_attr for string keys.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on strings (code points), lists and tuples. Absent bounds: Undefined.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Argument `index` or keyword `name`, else `fallback`.
Value arg(const CallArgs& args, size_t index, const char* name, Value fallback = Value());

}  // namespace serval::tokenizer::jinja
