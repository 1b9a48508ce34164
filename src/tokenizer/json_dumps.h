// Python-compatible JSON and float formatting: json.dumps and repr(float) byte for byte.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace serval::tokenizer {

struct JsonDumpsOptions {
  int indent = -1;            // < 0: no newlines (Python indent=None); >= 0: spaces per level
  bool ensure_ascii = false;  // true: non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
  bool sort_keys = false;     // true: object keys sorted by code point
};

// json.dumps(x, ensure_ascii=..., indent=..., sort_keys=...) with default separators:
// (", ", ": ") without indent, (",", ": ") with indent. Object keys keep insertion order.
// Floats print as Python's repr (1.0, 0.1, 1e-07, 1e+20); NaN/inf as NaN/Infinity/-Infinity.
std::string json_dumps(const nlohmann::ordered_json& value, const JsonDumpsOptions& options = {});

// Python's repr(float): shortest round-trip digits, fixed notation for decimal exponents
// -4 <= e < 16 (always with a ".0" or fraction), else d.ddde+XX; "inf", "-inf", "nan".
std::string python_float_repr(double value);

// Appends `s` (UTF-8) as a JSON string literal with Python json's escaping rules.
void append_json_string(std::string& out, const std::string& s, bool ensure_ascii);

}  // namespace serval::tokenizer
