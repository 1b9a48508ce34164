// Whole-number settings from the environment (the SERVAL_* knobs), parsed strictly: a value that
// is set but malformed or out of range is reported, never read as a different number (atoi would
// turn "abc" into 0 and "8x" into 8).
#pragma once
#include <optional>
#include <string_view>

namespace serval {

// `text` as a decimal integer in [lo, hi], with nothing before or after it; nullopt otherwise.
std::optional<long long> parse_int_in(std::string_view text, long long lo, long long hi);

// Environment variable `name` as a whole number in [lo, hi]; `fallback` when it is unset, and also
// when it is set to anything else, after a warning that names the variable, its value and the
// range.
int env_int(const char* name, int lo, int hi, int fallback);

}  // namespace serval
